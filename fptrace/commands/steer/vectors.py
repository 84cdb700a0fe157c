"""Steering vectors: where one comes from, and the files that hold one.

A steering vector is one (d_model,) direction per block, added to that block's output stream
(core/interventions.py adds it). It comes from
- two prompts: the stream after block L of `add` minus that of `subtract` (at their last
  positions, or the mean over each one's positions); ActAdd, Turner et al. 2023;
- contrastive pairs: the mean of those differences over many (positive, negative) pairs
  (contrastive activation addition, Rimsky et al. 2024), or their first principal direction;
- a file: llama.cpp's control-vector GGUF, a .safetensors or a .npy;
- a token: the LM head's row of that token (the direction the unembedding reads it from).

llama.cpp's control-vector layout (its loader, common_control_vector_load_one): a GGUF file with
`general.architecture = "controlvector"`, one F32 1-D tensor `direction.N` of n_embd values per
block N, which llama.cpp adds to the output of block N (after the residual add, at every
position); it never steers block 0 (`direction.0` is refused) and reads no other metadata.
fptrace names a vector after the block whose output receives it, in the files it writes and in
what it shows, which is what that loader does. (llama.cpp's own generator,
cvector-generator, writes the difference measured after block il as `direction.(il+1)`, so its
vectors are added one block later than where they were measured.)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fptrace.addresses import Block, resolve_block
from fptrace.core.dictionary_sites import hook_name
from fptrace.core.trace import sizes
from fptrace.errors import BadInput, param
from fptrace.models.loading import LoadedModel
from fptrace.numbers import parse_int

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from fptrace.models.prompts import Prompt

METHODS = ("mean", "pca")
SUFFIXES = (".gguf", ".safetensors", ".npy")
BATCH = 16  # prompts per forward pass when measuring streams


@dataclass(frozen=True)
class SteeringVector:
    """One direction per block: layers maps a block to the (d,) float32 CPU tensor added to
    its output (times the strength)."""

    layers: dict[int, torch.Tensor]
    source: str  # "prompts", "pairs", "file", "token" or "latent"
    description: str  # in words, for the view and the JSON
    method: str | None = None  # pairs: "mean" or "pca"
    pairs: int | None = None  # pairs: how many
    path: str | None = None  # file: its path
    passes: int = 0  # forward passes it took to make
    norm_matched: bool = False  # each block's direction scaled to the clean stream's norm

    def norms(self) -> dict[int, float]:
        return {k: float(v.norm()) for k, v in self.layers.items()}


def match_norms(lm: LoadedModel, prompt: Prompt, vec: SteeringVector) -> SteeringVector:
    """`--norm-match`: each block's direction scaled to the norm of the prompt's clean stream
    after that block, at the last position (one more forward pass)."""
    from dataclasses import replace

    if vec.norm_matched:
        return vec
    streams = block_outputs(lm, [prompt], sorted(vec.layers), False)
    layers = {k: v * (float(streams[k][0].norm()) / max(float(v.norm()), 1e-12))
              for k, v in vec.layers.items()}
    return replace(vec, layers=layers, passes=vec.passes + 1, norm_matched=True)


def steered_block(lm: LoadedModel, layer: int | Block | None) -> int:
    """The block whose output receives the vector (`layer=`, `--layer` on the command line),
    checked against the model; negative counts from the end."""
    n = len(lm.parts.blocks)
    if layer is None:
        raise BadInput(f"{param('layer')}: say which block's output receives the vector (0 to "
                       f"{n - 1}; "
                       "layer= in Python)")
    return resolve_block(layer, sizes(lm), "layer").layer


def steering_vector(lm: LoadedModel, *, add: str | None = None, subtract: str | None = None,
                    pairs: str | Sequence[tuple[str, str]] | None = None, method: str = "mean",
                    vector: str | None = None, token: str | None = None,
                    layer: int | Block | None = None, mean_positions: bool = False,
                    prompt: Prompt | None = None) -> SteeringVector:
    """The steering vector of exactly one source: add and subtract (two prompts), pairs (a
    JSON Lines file of {"positive", "negative"}, or a list of pairs), vector (a file) or token
    (read as the token it is right after `prompt`, when it is not one token alone)."""
    given = [name for name, v in (("--add/--subtract", add if add is not None else subtract),
                                  ("--pairs", pairs), ("--vector", vector), ("--token", token))
             if v is not None]
    if len(given) != 1:
        raise BadInput(f"give one source of the steering vector: {param('add')} A "
                       f"{param('subtract')} B (two "
                       f"prompts), {param('pairs')} FILE, {param('vector')} FILE or "
                       f"{param('token')} T"
                       + (f"; got {' and '.join(given)}" if given else ""))
    if (add is None) != (subtract is None):
        raise BadInput(f"{param('add')} and {param('subtract')} go together: the vector is the "
                       f"stream of {param('add')} "
                       f"minus that of {param('subtract')} (e.g. {param('add')} ' love' "
                       f"{param('subtract')} ' hate')")
    if method not in METHODS:
        raise BadInput(f"{param('method')} {method!r}: use mean or pca")
    if method != "mean" and pairs is None:
        raise BadInput(f"{param('method')} goes with {param('pairs')}")
    if mean_positions and add is None and pairs is None:
        raise BadInput(f"{param('mean_positions')} goes with {param('add')}/{param('subtract')} "
                       f"or {param('pairs')}")
    if vector is not None:
        return read_vector(lm, vector, layer)
    layer = steered_block(lm, layer)
    if token is not None:
        return token_vector(lm, token, layer, prompt)
    if add is not None:
        return prompts_vector(lm, add, subtract, layer, mean_positions)
    return pairs_vector(lm, pairs, layer, method, mean_positions)


def block_outputs(lm: LoadedModel, prompts: Sequence[Prompt], layers: Sequence[int],
                  mean_positions: bool, wheres: Sequence[str] | None = None
                  ) -> dict[int, torch.Tensor]:
    """Per block of `layers`, (N, d) float32: each prompt's stream after that block, at its last
    position or (mean_positions) the mean over its positions; prompts (text or ids) are run
    left-padded, BATCH at a time."""
    import torch

    from fptrace.core.hooks import Hook, first_output, hooked
    from fptrace.core.prompt_files import encode_listed
    from fptrace.core.trace import padded_batch

    rows = [lm.encode(p) for p in prompts] if wheres is None else \
        encode_listed(lm, prompts, wheres)
    out: dict[int, list] = {k: [] for k in layers}
    for start in range(0, len(rows), BATCH):
        input_ids, mask, kwargs = padded_batch(lm, rows[start:start + BATCH])
        m = (torch.ones(input_ids.shape, dtype=torch.bool) if mask is None else mask).cpu()

        def keep(k: int):
            def hook(module: nn.Module, args: tuple, output: object) -> None:
                h = first_output(output).float().cpu()  # (B, T, d)
                out[k].append(((h * m[..., None]).sum(1) / m.sum(1, keepdim=True))
                              if mean_positions else h[:, -1])  # left-padded: the last is real
            return hook

        with torch.inference_mode(), hooked([Hook.after(lm.parts.blocks[k], keep(k))
                                             for k in layers]):
            lm.model(input_ids, logits_to_keep=1, **kwargs)
    return {k: torch.cat(v) for k, v in out.items()}


def _where(layer: int, mean_positions: bool) -> str:
    return (f"after block {layer} ("
            + ("mean over positions" if mean_positions else "last position") + ")")


def prompts_vector(lm: LoadedModel, add: str, subtract: str, layer: int,
                   mean_positions: bool = False) -> SteeringVector:
    """ActAdd: the stream of `add` minus that of `subtract` after block `layer`."""
    from fptrace.models.tokenizers import check_prompt

    check_prompt(add, "--add")
    check_prompt(subtract, "--subtract")
    h = block_outputs(lm, [add, subtract], [layer], mean_positions,
                      ["--add", "--subtract"])[layer]
    return SteeringVector({layer: h[0] - h[1]}, "prompts",
                          f"{add!r} − {subtract!r} {_where(layer, mean_positions)}", passes=1)


def pairs_vector(lm: LoadedModel, pairs: str | Sequence[tuple[str, str]], layer: int,
                 method: str = "mean", mean_positions: bool = False) -> SteeringVector:
    """Contrastive activation addition over pairs: the mean of positive − negative after
    block `layer` (mean), or the first principal direction of those differences (pca): the top
    right singular vector of the difference rows (the top eigenvector of their uncentred XᵀX,
    which llama.cpp's cvector-generator approximates by power iteration), its sign turned to
    agree with the mean difference and its length that of the mean difference along it."""
    import torch

    from fptrace.core.prompt_files import pairs_at

    name = pairs if isinstance(pairs, str) else None
    listed = pairs_at(pairs) if isinstance(pairs, str) else \
        [(f"pairs[{k}]", pos, neg) for k, (pos, neg) in enumerate(pairs)]
    items = [(pos, neg) for _, pos, neg in listed]
    if not items:
        raise BadInput(f"{param('pairs')}: no pairs")
    wheres = [f"{w} ({side})" for w, _, _ in listed for side in ("positive", "negative")]
    h = block_outputs(lm, [p for pair in items for p in pair], [layer], mean_positions,
                      wheres)[layer]
    diffs = h[0::2] - h[1::2]  # (N, d)
    mean = diffs.mean(0)
    if method == "mean":
        v = mean
    else:
        u = torch.linalg.svd(diffs.double(), full_matrices=False).Vh[0].float()  # (d,)
        along = float(mean @ u)
        v = u * along  # along < 0 flips the sign toward the mean difference
    where = f"{len(items)} pairs" + (f" of {name}" if name else "")
    return SteeringVector({layer: v}, "pairs",
                          f"{method} of positive − negative over {where} "
                          f"{_where(layer, mean_positions)}", method=method, pairs=len(items),
                          path=name, passes=-(-2 * len(items) // BATCH))


def token_vector(lm: LoadedModel, token: str, layer: int, prompt: Prompt | None = None
                 ) -> SteeringVector:
    """The LM head's row of one token: adding it raises that token's logit most directly."""
    from fptrace.core.fragments import token_id

    t = token_id(lm, token, "--token", prompt)
    row = lm.parts.lm_head.weight[t].detach().float().cpu().clone()
    return SteeringVector({layer: row}, "token",
                          f"the LM head's row of {lm.token_text(t)!r} (id {t})")


def latent_vector(lm: LoadedModel, sae: str, latent: int | None) -> SteeringVector:
    """`--sae DIR --latent N`: latent N's decoder row dᵢ, added to the output of the block whose
    output the SAE reads (strength S adds S·dᵢ: an activation of S)."""
    from fptrace.core.dictionaries import check_model, check_role, latent_block, read_dictionary

    if latent is None:
        raise BadInput(f"{param('sae')} goes with {param('latent')} N: the latent whose direction "
                       f"is added")
    d = read_dictionary(sae)
    check_role(d, "sae")
    check_model(d, len(lm.parts.blocks), int(lm.config.hidden_size), lm.name)
    block, row = latent_block(d, latent)
    return SteeringVector({block: row}, "latent",
                          f"latent {latent} of the SAE {sae} (its decoder row, read at "
                          f"{hook_name(d.out_site)})", path=sae)


# ---------------------------------------------------------------------------- files
def check_vector_path(path: str, what: str = "--save-vector", force: bool = False) -> None:
    """Before anything runs: a writable file of a known kind, and not someone else's file
    unless force (atomic.check_target)."""
    from fptrace.atomic import check_target

    check_target(path, what, "steer.gguf", force)
    if os.path.splitext(path)[1].lower() not in SUFFIXES:
        raise BadInput(f"{what} {path}: write a .gguf (llama.cpp's control-vector layout), "
                       ".safetensors or .npy file")


def read_vector(lm: LoadedModel, path: str, layer: int | Block | None = None
                ) -> SteeringVector:
    """A vector file: a llama.cpp control-vector GGUF (`direction.N` tensors), a .safetensors
    (`direction.N` tensors, or one (d,) or (n_layers, d) tensor) or a .npy ((d,) or
    (n_layers, d)). A single (d,) vector needs `layer`; with several blocks in the file,
    `layer` keeps that block's only."""
    import torch

    if not os.path.exists(path):
        raise BadInput(f"{param('vector')} {path}: no such file")
    from fptrace.userfiles import check_regular

    check_regular(path, "--vector")  # a FIFO or a device: refused, not waited on
    if layer is not None:
        layer = steered_block(lm, layer)
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".gguf":
        layers = _read_gguf(path)
    elif suffix == ".safetensors":
        layers = _read_safetensors(path, lm, layer)
    elif suffix == ".npy":
        layers = _read_npy(path, lm, layer)
    else:
        raise BadInput(f"{param('vector')} {path}: read a .gguf control vector, a .safetensors or "
                       f"a .npy")
    d, n = int(lm.config.hidden_size), len(lm.parts.blocks)
    for k, v in layers.items():
        if v.ndim != 1:
            raise BadInput(f"{param('vector')} {path}: the direction for block {k} is a "
                           f"{tuple(v.shape)} tensor, not one vector of {lm.name}'s d_model "
                           f"({d}) values")
        if v.shape[0] != d:
            raise BadInput(f"{param('vector')} {path}: the vector for block {k} has {v.shape[-1]} "
                           f"values "
                           f"but {lm.name}'s d_model is {d}: it was made for another model")
    beyond = sorted(k for k in layers if not 0 <= k < n)
    if beyond:
        more = f" and {len(beyond) - 1} more" if len(beyond) > 1 else ""
        raise BadInput(f"{param('vector')} {path} has a direction for block {beyond[0]}{more}, but "
                       f"{lm.name} has {n} blocks (0 to {n - 1}): it was made for another model")
    if layer is not None:
        if layer not in layers:
            raise BadInput(f"{param('vector')} {path} has no direction for block {layer}; it has "
                           + ", ".join(str(k) for k in sorted(layers)))
        layers = {layer: layers[layer]}
    layers = {k: torch.as_tensor(v, dtype=torch.float32).clone() for k, v in
              sorted(layers.items())}
    if not layers:
        raise BadInput(f"{param('vector')} {path}: no direction in it")
    blocks = ", ".join(str(k) for k in layers)
    return SteeringVector(layers, "file", f"{os.path.basename(path)} (block"
                          f"{'s' if len(layers) > 1 else ''} {blocks})", path=path)


def _read_gguf(path: str) -> dict[int, Any]:
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - any parse failure means "not a GGUF we can read"
        raise BadInput(f"{param('vector')} {path}: not a readable GGUF file ({type(e).__name__}: "
                       f"{str(e)[:100]})") from None
    field_ = reader.fields.get("general.architecture")
    arch = field_.contents() if field_ is not None else None
    if arch != "controlvector":
        raise BadInput(f"{param('vector')} {path} is not a control vector: its "
                       f"general.architecture is "
                       f"{arch!r}, not 'controlvector' (a model file? steer reads llama.cpp "
                       "control vectors, with one direction.N tensor per block)")
    layers = {}
    for t in reader.tensors:
        name = t.name
        block = _block_of(name, path)
        if block is None:
            continue
        if t.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            raise BadInput(f"{param('vector')} {path}: {name} is {t.tensor_type.name}; a control "
                           f"vector's "
                           "directions are F32")
        a = _numbers(path, np.array(t.data), f"the tensor {name!r}")  # (n_embd,) or refused below
        layers[block] = a.reshape(-1) if len(t.shape) == 1 else a
    if not layers:
        raise BadInput(f"{param('vector')} {path}: a control vector without direction.N tensors")
    return layers


def _block_of(name: str, path: str) -> int | None:
    """The block N of a tensor named `direction.N` (None for any other name); a name such as
    `direction.²` is refused, naming it."""
    if not name.startswith("direction."):
        return None
    return parse_int(name[len("direction."):], f"--vector {path}: the block number of the "
                     f"tensor {name!r} is", low=0)


def _numbers(path: str, a: Any, what: str) -> np.ndarray:
    """A float32 copy of a vector read from a file: real numbers only (no strings, no complex
    values) and every one finite, also after the conversion to float32 (1e300 overflows it)."""
    import numpy as np

    a = np.asarray(a)
    if a.dtype.kind not in "fiub":
        kind = {"c": "complex", "U": "text", "S": "text", "O": "Python object"}.get(
            a.dtype.kind, str(a.dtype))
        raise BadInput(f"{param('vector')} {path}: {what} holds {kind} values, not real numbers")
    with np.errstate(over="ignore", invalid="ignore"):
        f = a.astype(np.float32)
    bad = ~np.isfinite(f)
    if bad.any():
        at = np.argwhere(bad)[0]
        where = ", ".join(str(int(i)) for i in at)
        raise BadInput(f"{param('vector')} {path}: {what} holds {int(bad.sum())} non-finite value"
                       f"{'s' if bad.sum() > 1 else ''} (NaN, Inf, or beyond float32's range), "
                       f"the first at [{where}]: {a[tuple(at)]}")
    return f


def _rows(path: str, a: Any, lm: LoadedModel, layer: int | None, what: str
          ) -> dict[int, Any]:
    """A (d,) array (needs layer) or an (n_layers, d) one (a row per block; zero rows skipped)."""
    import numpy as np

    n, d = len(lm.parts.blocks), int(lm.config.hidden_size)
    a = _numbers(path, a, what)
    if a.ndim == 1:
        if layer is None:
            raise BadInput(f"{param('vector')} {path} holds one ({a.shape[0]},) vector: say which "
                           f"block's "
                           f"output receives it with {param('layer')} (0 to {n - 1})")
        return {layer: a}
    if a.ndim == 2 and a.shape[0] == n:
        return {k: a[k] for k in range(n) if np.any(a[k])}
    if a.ndim == 2 and a.shape[1] == d:
        raise BadInput(f"{param('vector')} {path}: {what} of shape {tuple(a.shape)} has "
                       f"{a.shape[0]} rows "
                       f"but {lm.name} has {n} blocks; give ({d},) or ({n}, {d})")
    raise BadInput(f"{param('vector')} {path}: {what} of shape {tuple(a.shape)}; steer reads "
                   f"({d},) or "
                   f"({n}, {d}) (d_model {d} for {lm.name})")


def _read_npy(path: str, lm: LoadedModel, layer: int | None) -> dict[int, Any]:
    import numpy as np

    try:
        a = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001
        raise BadInput(f"{param('vector')} {path}: not a readable .npy array ({type(e).__name__}: "
                       f"{str(e)[:100]})") from None
    return _rows(path, a, lm, layer, "an array")


def _read_safetensors(path: str, lm: LoadedModel, layer: int | None) -> dict[int, Any]:
    from safetensors.numpy import load_file

    try:
        tensors = load_file(path)
    except Exception as e:  # noqa: BLE001
        raise BadInput(f"{param('vector')} {path}: not a readable .safetensors file "
                       f"({type(e).__name__}: "
                       f"{str(e)[:100]})") from None
    blocks = {k: _block_of(k, path) for k in tensors}
    directions = {b: _numbers(path, tensors[k], f"the tensor {k!r}")
                  for k, b in blocks.items() if b is not None}
    if directions:
        return directions
    if len(tensors) == 1:
        return _rows(path, next(iter(tensors.values())), lm, layer, "its tensor")
    raise BadInput(f"{param('vector')} {path} holds {len(tensors)} tensors ("
                   + ", ".join(sorted(tensors)[:5]) + "): steer reads direction.N tensors, or "
                   "one tensor")


def write_vector(path: str, vec: SteeringVector, lm: LoadedModel, force: bool = False) -> None:
    """Write the vector atomically: .gguf in llama.cpp's control-vector layout (direction.N,
    F32, for the block N whose output receives it), .safetensors with the same tensor names,
    .npy as (n_layers, d) with zero rows for blocks it leaves alone."""
    import numpy as np

    from fptrace.atomic import MARK, write_atomic

    check_vector_path(path, force=force)
    suffix = os.path.splitext(path)[1].lower()
    dirs = {k: np.ascontiguousarray(v.numpy(), dtype=np.float32) for k, v in vec.layers.items()}
    if suffix == ".gguf" and 0 in dirs:
        raise BadInput(f"{param('save_vector')} {path}: llama.cpp never steers block 0's output "
                       f"(its "
                       f"loader refuses direction.0); choose {param('layer')} 1 or more, or write "
                       f"a "
                       ".safetensors or .npy file")

    def write(tmp: str) -> None:
        if suffix == ".gguf":
            import gguf

            w = gguf.GGUFWriter(tmp, arch="controlvector")
            w.add_string("controlvector.model_hint", str(lm.config.model_type))
            w.add_string("fptrace.producer", f"{MARK} steer")
            w.add_int32("controlvector.layer_count", len(dirs))
            for k in sorted(dirs):
                w.add_tensor(f"direction.{k}", dirs[k])
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
        elif suffix == ".safetensors":
            from safetensors.numpy import save_file

            save_file({f"direction.{k}": dirs[k] for k in sorted(dirs)}, tmp,
                      metadata={"producer": f"{MARK} steer"})
        else:
            a = np.zeros((len(lm.parts.blocks), int(lm.config.hidden_size)), dtype=np.float32)
            for k, v in dirs.items():
                a[k] = v
            with open(tmp, "wb") as f:
                np.save(f, a)

    write_atomic(path, write, suffix)


__all__ = ["SteeringVector", "match_norms", "read_vector", "steering_vector", "write_vector"]
