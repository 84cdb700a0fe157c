"""fptrace's own GGUF reader, for the files transformers' GGUF loader does not read (OLMo 2's,
GPT-NeoX's, OLMoE's, gpt-oss's, DeepSeek's, Gemma's architectures) or reads as another model
(Mixtral's, a `llama` file with experts, which it loads as a Llama without them): the family's
transformers model is built from the file's metadata (its config) and its tensors (dequantized
by the gguf package), each tensor put back under the state-dict name the family's GGUFWeights
gives it, with what llama.cpp's converter did to it undone (GGUFWeights.fixes).

Every weight of the built model comes from the file: a weight no tensor fills, or a tensor no
weight takes, refuses the file in one line naming them, so no weight is ever left at its random
initial value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fptrace.errors import ModelLoadError
from fptrace.families import GGUFWeights, gguf_weights_for
from fptrace.models.gguf_metadata import GGUFMetadata

if TYPE_CHECKING:
    import numpy as np
    import torch
    from gguf import ReaderTensor
    from transformers import PretrainedConfig, PreTrainedModel


def reads(meta: GGUFMetadata) -> bool:
    """Whether fptrace reads this file itself (its architecture is one transformers' GGUF
    loader does not read and a family states how)."""
    return gguf_weights_for(meta.architecture or "", meta.experts) is not None


def spec(meta: GGUFMetadata) -> GGUFWeights:
    found = gguf_weights_for(meta.architecture or "", meta.experts)
    if found is None:
        raise ModelLoadError(f"fptrace reads no {meta.architecture!r} GGUF file itself")
    return found


def token_id(meta: GGUFMetadata, name: str) -> int | None:
    value = meta.values.get(f"tokenizer.ggml.{name}_token_id")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def config_values(meta: GGUFMetadata) -> dict[str, object]:
    """The transformers config's attributes the file states: the family's GGUFWeights.config
    read from the metadata, the vocabulary from the token embedding, a tied head where the file
    has no output tensor, the special tokens from the tokenizer's keys."""
    how = spec(meta)
    stated = [k for k in how.unread if meta.hparam(k) is not None]
    if stated:
        raise ModelLoadError(
            f"cannot read the GGUF file {meta.path}: it states {how.arch}.{stated[0]} "
            f"({meta.hparam(stated[0])!r}), which fptrace's reader does not read into the "
            f"{how.model_type} model (it would compute another model)")
    out: dict[str, object] = {}
    for attribute, source in how.config.items():
        if isinstance(source, str):
            value = meta.hparam(source)
        elif callable(source):
            value = source(meta.hparam)
        else:
            value = source
        if value is not None:
            out[attribute] = value
    embed = meta.shapes.get("token_embd.weight")
    if embed is None or len(embed) != 2:
        raise ModelLoadError(f"the GGUF file {meta.path!r} has no token embedding "
                             "(token_embd.weight)")
    out["vocab_size"] = int(embed[1])
    out["tie_word_embeddings"] = "output.weight" not in meta.shapes
    for name, attribute in (("bos", "bos_token_id"), ("eos", "eos_token_id"),
                            ("padding", "pad_token_id")):
        out[attribute] = token_id(meta, name)
    return out


def config(meta: GGUFMetadata) -> PretrainedConfig:
    """The transformers config of the file's model (no weights read)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(spec(meta).model_type, **config_values(meta))
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"cannot read the GGUF file {meta.path}: its metadata makes no "
                             f"{spec(meta).model_type} config ({type(e).__name__}: "
                             f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})"
                             ) from None


def names(how: GGUFWeights, blocks: int) -> dict[str, tuple[tuple[str, ...], str | None]]:
    """state-dict name -> (the GGUF tensors' names, stacked along its rows where more than one;
    the fix to undo or None), every block spelt."""
    out: dict[str, tuple[tuple[str, ...], str | None]] = {}
    for hf, gg in how.tensors.items():
        parts = (gg,) if isinstance(gg, str) else tuple(gg)
        for i in range(blocks) if "{i}" in hf else (None,):
            key = hf.format(i=i) if i is not None else hf
            out[key] = (tuple(g.format(i=i) if i is not None else g for g in parts),
                        how.fixes.get(hf))
    return out


def rope_adjacent_undone(w: np.ndarray, heads: int) -> np.ndarray:
    """W_Q or W_K (heads × head_dim rows) back from llama.cpp's converter's permutation, which
    puts each rotary pair's two rows side by side: per head, the even rows first, then the odd
    ones."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def qkv_by_head(w: np.ndarray, heads: int) -> np.ndarray:
    """A fused projection stored [Q; K; V] (llama.cpp's converter's order, each heads ×
    head_dim rows) put back head by head ([q|k|v] of head 0, then head 1, ...), as GPT-NeoX's
    query_key_value holds it."""
    rest = w.shape[1:]
    return w.reshape(3, heads, w.shape[0] // 3 // heads, *rest).swapaxes(0, 1).reshape(w.shape)


def interleaved(w: np.ndarray, transposed: bool) -> np.ndarray:
    """Two halves stacked along the rows (axis −2: gate above up, as llama.cpp's converter
    writes gpt-oss's experts, ffn_gate_exps and ffn_up_exps) put back interleaved along the
    last axis, gate in the even places, as gpt-oss's gate_up_proj holds them; transposed: each
    half's last two axes swapped first (the weights, (E, I, d) in the file, (E, d, 2·I) in the
    model; the biases, (E, I) each, are stacked (2·E, I) and come back (E, 2·I))."""
    import numpy as np

    gate, up = np.split(w, 2, axis=-2)
    if transposed:
        gate, up = gate.swapaxes(-1, -2), up.swapaxes(-1, -2)
    return np.stack((gate, up), axis=-1).reshape(*gate.shape[:-1], -1)


def latent_kv_joined(k_b: np.ndarray, v_b: np.ndarray) -> np.ndarray:
    """DeepSeek's kv_b_proj (heads × (no-position key + value) rows, latent columns) from the
    two tensors llama.cpp's converter splits it into for latent attention: attn_k_b (heads,
    latent, key), each head's key part transposed, and attn_v_b (heads, value, latent)."""
    import numpy as np

    joined = np.concatenate((k_b.swapaxes(-1, -2), v_b), axis=-2)  # (heads, key + value, latent)
    return joined.reshape(-1, joined.shape[-1])


# fixes that take the stored tensors apart (the others take them stacked along the rows)
APART = {"latent_kv_joined": latent_kv_joined}


def fixer(fix: str | None, cfg: PretrainedConfig) -> Callable[[np.ndarray], np.ndarray]:
    heads = int(getattr(cfg, "num_attention_heads", 0) or 0)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    fixes: dict[str | None, Callable[[np.ndarray], np.ndarray]] = {
        None: lambda w: w,
        "rope_adjacent_q": lambda w: rope_adjacent_undone(w, heads),
        "rope_adjacent_k": lambda w: rope_adjacent_undone(w, kv),
        "qkv_by_head": lambda w: qkv_by_head(w, heads),
        "gate_up_interleaved": lambda w: interleaved(w, transposed=True),
        "gate_up_bias_interleaved": lambda w: interleaved(w, transposed=False),
        "transposed": lambda w: w.swapaxes(-1, -2),
        "one_added": lambda w: w - w.dtype.type(1),
    }
    if fix not in fixes:
        raise AssertionError(f"unknown GGUF weight fix {fix!r}")
    return fixes[fix]


def read(t: ReaderTensor) -> np.ndarray:
    """A GGUF tensor's values as float32, in numpy's order (ggml's dims reversed)."""
    import numpy as np
    from gguf.quants import dequantize

    values = dequantize(np.asarray(t.data), t.tensor_type)
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # ggml's ne, outermost first
    return np.asarray(values, dtype=np.float32).reshape(shape)


def listed(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (", ..." if len(items) > n else "")


def build(path: str, meta: GGUFMetadata) -> PreTrainedModel:
    """The family's transformers model (float32) with every weight read from the GGUF file at
    `path`; ModelLoadError (one line) when a weight has no tensor, a tensor no weight, or a
    tensor the wrong shape."""
    import numpy as np
    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM

    how = spec(meta)
    cfg = config(meta)
    with torch.device("meta"):  # shapes only: every weight is then read from the file
        skeleton = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    wanted = dict(skeleton.state_dict())
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    head = skeleton.get_output_embeddings()
    if tied and head is not None:  # the head is the token embedding: no tensor of its own
        at = next(n for n, m in skeleton.named_modules() if m is head)
        wanted.pop(f"{at}.weight", None)
    mapping = names(how, int(cfg.num_hidden_layers))
    try:
        reader = GGUFReader(path)
    except (OSError, ValueError, KeyError, IndexError) as e:  # the header was checked before
        raise ModelLoadError(f"cannot read the GGUF file {path}: {type(e).__name__}: "
                             f"{str(e).strip()[:200]}") from None
    tensors = {t.name: t for t in reader.tensors}
    unnamed = sorted(k for k in wanted if k not in mapping)
    absent = sorted(f"{k} ({n})" for k in wanted if k in mapping for n in mapping[k][0]
                    if n not in tensors)
    if unnamed or absent:
        gone = unnamed + absent
        raise ModelLoadError(
            f"cannot read the GGUF file {path}: {len(gone)} of the {how.model_type} model's "
            f"weights have no tensor in it ({listed(gone)}); fptrace leaves no weight at a "
            "random value")
    taken = {n for k in wanted for n in mapping[k][0]}
    extra = sorted(n for n in tensors if n not in taken)
    if extra:
        raise ModelLoadError(
            f"cannot read the GGUF file {path}: {len(extra)} of its tensors are no weight of "
            f"the {how.model_type} model ({listed(extra)}); fptrace reads a file whole or not "
            "at all")
    state: dict[str, torch.Tensor] = {}
    for key, like in wanted.items():
        parts, fix = mapping[key]
        stored = [read(tensors[n]) for n in parts]
        try:  # the fix undone, then the shape asked (a fix may transpose or interleave)
            values = APART[fix](*stored) if fix in APART else fixer(fix, cfg)(
                np.concatenate(stored, axis=-2) if len(parts) > 1 else stored[0])
        except (ValueError, TypeError):  # parts that do not stack, split or join: shown as stored
            values = None
        if values is None or tuple(values.shape) != tuple(like.shape):
            shape = " + ".join(str(list(v.shape)) for v in stored) if values is None \
                else str(list(values.shape))
            raise ModelLoadError(
                f"cannot read the GGUF file {path}: tensor {' + '.join(parts)} is "
                f"{shape} but the model's {key} is {list(like.shape)} (its "
                "metadata and tensors disagree)")
        state[key] = torch.from_numpy(np.array(values, order="C"))  # a copy, off the map
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k in wanted]
    if missing or unexpected:  # the checks above make this unreachable
        raise AssertionError(f"GGUF reader: missing {missing}, unexpected {unexpected}")
    if tied:
        model.tie_weights()
    return model.eval()


__all__ = ["build", "config", "config_values", "interleaved", "latent_kv_joined", "qkv_by_head",
           "reads", "rope_adjacent_undone"]
