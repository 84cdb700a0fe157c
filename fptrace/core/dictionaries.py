"""Sparse dictionaries (SAEs and transcoders) read from the folders people download, in one
typed value with the two functions every reader needs: encode and decode. `fptrace features`
reads the stream through them; `steer` and `ablate` add or remove one latent's write.

Formats (learned from their documentation and code, read here independently):

    SAELens      cfg.json + sae_weights.safetensors: W_enc (d_in, d_sae), W_dec (d_sae, d_in),
                 b_enc, b_dec, threshold (JumpReLU); cfg: architecture (standard, jumprelu,
                 topk, batchtopk, transcoder, jumprelu_transcoder, skip_transcoder,
                 jumprelu_skip_transcoder, topk_transcoder, topk_skip_transcoder), d_in,
                 d_sae, k,
                 apply_b_dec_to_input, normalize_activations, and the hook name (top level, or
                 under `metadata`/`meta`), hook_name_out for transcoders; a skip transcoder's
                 W_skip (d_out, d_in), added as x·W_skipᵀ (SAELens's SkipTranscoder)
    Gemma Scope  params.npz or params.safetensors: W_enc, W_dec, b_enc, b_dec, threshold
                 (JumpReLU, the input not shifted by b_dec); Gemma Scope 2's affine
                 transcoders add x @ W_skip, W_skip (d_in, d_out) as W_enc is; the place
                 from config.json when there is one, else from the folder's path: `layer_N`,
                 and the folder above it (`...-res`/`resid_post_all`, `...-mlp`, `...-transcoders`/
                 `transcoder_all`)
    sparsify     cfg.json + sae.safetensors: encoder.weight (d_sae, d_in), encoder.bias, W_dec
                 (d_sae, d_out), b_dec; cfg: k, num_latents or expansion_factor, transcode,
                 skip_connection (W_skip (d_out, d_in), added as x @ W_skip.mT); the
                 place is the folder's name (`layers.6`, `layers.6.mlp`) as sparsify saves it
    circuit-tracer  a transcoder set: config.yaml (model_kind: transcoder_set,
                 feature_input_hook, feature_output_hook: TransformerLens hook names within a
                 block, and `transcoders`: the layer files in layer order, local paths,
                 relative ones from the config's folder, else from the working directory
                 (circuit-tracer's reading; two different files refused); without it, the
                 folder's
                 layer_N.safetensors) and per layer, as its SingleLayerTranscoder holds them:
                 W_enc (d_sae, d_model), applied as F.linear(x, W_enc, b_enc), the input not
                 shifted; W_dec (d_sae, d_model); b_enc; b_dec; activation_function.threshold
                 (JumpReLU: pre · (pre > θ); without it ReLU, as its load_relu_transcoder
                 chooses); W_skip (d_model, d_model), added as x @ W_skip.T (its compute_skip).
                 A threshold below 0 is refused (its JumpReLU would pass the negative
                 pre-activations between θ and 0, fptrace's does not); cross-layer transcoders
                 are not read yet

Encoding, for every kind: pre = (x − b_dec if the format shifts the input) @ W_enc + b_enc, then
ReLU: relu(pre); JumpReLU: relu(pre) where pre > threshold, else 0; TopK: the k largest of pre,
through ReLU, the rest 0; BatchTopK: JumpReLU with its stored threshold (how a BatchTopK SAE runs
at inference). Decoding: a @ W_dec + b_dec, and for a skip transcoder (an affine transcoder)
+ x @ W_skip, held here as (d_in, d_out) whatever the format's orientation. A W_skip is read only
for a transcoder: in an SAE it is refused (what it reads would be rebuilt in part by a dense
map, which no latent accounts for).

Checked here, before any number is used (each a BadInput of one line): the files are regular
files (fptrace/userfiles.py: a FIFO is refused, not waited on); every tensor's number of
dimensions, then its shape against the config and the other tensors (Gemma Scope has no
config: the latents are b_enc's length, the output width b_dec's), a matrix whose rows and
columns are swapped called transposed; no dictionary of 0 latents; TopK's k at most the
latents; cfg.json's switches real JSON booleans ("false", a string, is refused, not read as
true); a W_skip's shape (d_out, d_in) or (d_in, d_out) as its format stores it, and its
numbers finite, as every tensor's. The widths against the model are `check_model`'s, once the
model is known.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fptrace.addresses import Site
from fptrace.core.dictionary_sites import MLP_IN, dictionary_site, hook_name, same_tensor
from fptrace.errors import BadInput, param
from fptrace.jsontext import loads
from fptrace.numbers import parse_int
from fptrace.points import Point
from fptrace.userfiles import check_regular, read_text

if TYPE_CHECKING:
    import torch

KINDS = ("relu", "jumprelu", "topk", "batchtopk")
FORMATS = ("saelens", "gemmascope", "sparsify", "circuittracer")
ROLES = ("sae", "transcoder")

_SAELENS_ARCH = {"standard": ("relu", "sae"), "relu": ("relu", "sae"),
                 "jumprelu": ("jumprelu", "sae"), "topk": ("topk", "sae"),
                 "batchtopk": ("batchtopk", "sae"), "transcoder": ("relu", "transcoder"),
                 "jumprelu_transcoder": ("jumprelu", "transcoder"),
                 "topk_transcoder": ("topk", "transcoder"),
                 "skip_transcoder": ("relu", "transcoder"),
                 "jumprelu_skip_transcoder": ("jumprelu", "transcoder"),
                 "topk_skip_transcoder": ("topk", "transcoder")}


@dataclass
class Dictionary:
    """A sparse dictionary: what it reads (site) and, for a transcoder, where its reconstruction
    belongs (out_site); tensors in float32 on the CPU until `to(device)`."""

    path: str
    format: str  # one of FORMATS
    kind: str  # one of KINDS
    role: str  # "sae" or "transcoder"
    site: Site  # what it encodes
    out_site: Site  # what it reconstructs (the same as site for an SAE)
    W_enc: torch.Tensor  # (d_in, d_sae)
    b_enc: torch.Tensor  # (d_sae,)
    W_dec: torch.Tensor  # (d_sae, d_out)
    b_dec: torch.Tensor  # (d_out,)
    threshold: torch.Tensor | None = None  # (d_sae,) JumpReLU / BatchTopK
    k: int | None = None  # TopK
    shift_input: bool = False  # x − b_dec before the encoder
    W_skip: torch.Tensor | None = None  # (d_in, d_out): a skip transcoder's x·W_skip
    # out_site is the MLP module's own output (circuit-tracer's mlp.hook_out), which is not
    # what the stream receives where a norm follows the MLP
    module_out: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def d_in(self) -> int:
        return int(self.W_enc.shape[0])

    @property
    def d_sae(self) -> int:
        return int(self.W_enc.shape[1])

    @property
    def d_out(self) -> int:
        return int(self.W_dec.shape[1])

    def to(self, device: torch.device | str) -> Dictionary:
        for name in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold", "W_skip"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.to(device))
        return self

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        """(N, d_in) -> (N, d_sae): the encoder's pre-activations."""
        x = x.float()
        if self.shift_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(N, d_in) -> (N, d_sae) activations (see the module's text)."""
        return activate(self.kind, self.pre(x), self.threshold, self.k)

    def decode(self, a: torch.Tensor) -> torch.Tensor:
        """(N, d_sae) -> (N, d_out): the latents' writes and b_dec (a skip transcoder's skip
        term is `skip`'s, added by `reconstruct`)."""
        return a @ self.W_dec + self.b_dec

    def skip(self, x: torch.Tensor) -> torch.Tensor:
        """(N, d_in) -> (N, d_out): a skip transcoder's affine term x·W_skip (zeros without
        one), in x's dtype."""
        import torch

        if self.W_skip is None:
            return torch.zeros(*x.shape[:-1], self.d_out, dtype=x.dtype, device=x.device)
        return x @ self.W_skip.to(x.dtype)

    def reconstruct(self, x: torch.Tensor) -> torch.Tensor:
        """(N, d_in) -> (N, d_out): the dictionary's output for x: decode(encode(x)), plus the
        skip term."""
        out = self.decode(self.encode(x))
        return out if self.W_skip is None else out + self.skip(x.float())


def activate(kind: str, pre: torch.Tensor, threshold: torch.Tensor | None = None,
             k: int | None = None) -> torch.Tensor:
    """(..., d_sae) pre-activations -> the activations of a dictionary of this kind (one of
    KINDS), in pre's dtype: ReLU; JumpReLU and BatchTopK, relu where above the threshold; TopK,
    the relu of the k largest of each row."""
    import torch

    if kind == "relu":
        return torch.relu(pre)
    if kind in ("jumprelu", "batchtopk"):
        assert threshold is not None, kind  # the readers refuse such a dictionary without one
        return torch.where(pre > threshold, torch.relu(pre), torch.zeros_like(pre))
    vals, idx = pre.topk(min(int(k or 1), pre.shape[-1]), dim=-1)  # (..., k)
    return torch.zeros_like(pre).scatter(-1, idx, torch.relu(vals))


def read_dictionary(path: str, *, site: str | None = None, what: str = "--sae") -> Dictionary:
    """The dictionary in the folder `path` (a Gemma Scope params file may be named directly).
    `site`: where it reads, for a dictionary whose files do not say; where they do, it must
    agree with them. `what`: how the errors name the path's source (the option that gave it)."""
    try:
        os.stat(path)
        folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
        names = set(os.listdir(folder))
    except OSError as e:
        raise BadInput(_unreachable(path, e, what)) from None
    if CT_CONFIG in names and "cfg.json" not in names and (os.path.isdir(path) or
                                                            path.endswith(".safetensors")):
        d = _ct_file(path, what)  # a layer of circuit-tracer's set, or the set refused
    elif not os.path.isdir(path) and os.path.basename(path) not in ("params.npz",
                                                                    "params.safetensors"):
        raise BadInput(f"{what} {path!r}: give the dictionary's folder (cfg.json beside "
                       "sae_weights.safetensors or sae.safetensors, or params.npz), or a "
                       "layer's file beside a circuit-tracer set's config.yaml")
    elif "cfg.json" in names and "sae_weights.safetensors" in names:
        d = _saelens(folder)
    elif "cfg.json" in names and "sae.safetensors" in names:
        d = _sparsify(folder)
    elif names & {"params.npz", "params.safetensors"}:
        d = _gemmascope(path if not os.path.isdir(path) else folder, site, what)
    else:
        sub = sorted(n for n in names if os.path.isfile(os.path.join(folder, n, "cfg.json")))
        hint = f"; its subfolders {', '.join(sub[:6])} hold configs: give one of them" if sub \
            else ""
        lacks = "config (cfg.json)" if "cfg.json" not in names else "weights beside its cfg.json"
        raise BadInput(f"{what} {path!r}: no dictionary there, it has no {lacks}: expected "
                       "cfg.json with sae_weights.safetensors (SAELens) or sae.safetensors "
                       "(sparsify), params.npz / params.safetensors (Gemma Scope), or "
                       f"config.yaml (a circuit-tracer transcoder set){hint}")
    if site is not None:
        given = dictionary_site(site, param("site"))
        if not same_tensor(given, d.site):
            raise BadInput(f"{param('site')} {site}: the dictionary in {path!r} was trained on "
                           f"{hook_name(d.site)} (its "
                           f"{'config' if d.format != 'gemmascope' else 'files'} say so); "
                           "reading it elsewhere would give a wrong readout")
    return d


def _unreachable(path: str, e: OSError, what: str) -> str:
    """Why `path` cannot be read, in the words a user acts on: a symlink loop is not a missing
    folder, nor is a link whose target is gone."""
    if e.errno == errno.ELOOP:
        return (f"{what} {path!r}: a symbolic link loop (its links lead back to themselves), which "
                "cannot be resolved to a folder")
    if os.path.islink(path):
        return (f"{what} {path!r}: a symbolic link to {os.readlink(path)!r}, which does not "
                "exist")
    if e.errno in (errno.ENOENT, errno.ENOTDIR):
        return f"{what} {path!r}: no such folder"
    return f"{what} {path!r}: cannot read it ({e.strerror or e})"


def check_role(d: Dictionary, expected: str, option: str = "--sae") -> None:
    """A transcoder given where an SAE is expected, or the reverse: one clear line."""
    if d.role != expected:
        features = option in ("--sae", "--transcoder")  # features takes either, by its flag
        if d.role == "transcoder":
            raise BadInput(f"{option} {d.path!r} is a transcoder ({hook_name(d.site)} → "
                           f"{hook_name(d.out_site)}: it maps the MLP's input to its output), "
                           "not an SAE of the stream" + (f"; give it with "
                                                         f"{param('transcoder')}" if features
                                                  else ""))
        raise BadInput(f"{option} {d.path!r} is an SAE of {hook_name(d.site)}, not a transcoder" +
                       (f"; give it with "
                        f"{param('sae')}" if features else " (it reconstructs what it "
                        "reads instead of mapping the MLP's input to its output)"))


def check_model(d: Dictionary, n_layers: int, d_model: int, model: str,
                option: str = "--sae", norm_after_mlp: bool = False) -> None:
    """The dictionary's place and widths against the loaded model (`norm_after_mlp`: whether
    its family normalises the MLP's output before the stream receives it)."""
    if d.module_out and norm_after_mlp:
        raise BadInput(f"{option} {d.path!r} rebuilds the MLP module's own output (its set's "
                       f"feature_output_hook mlp.hook_out), but {model} normalises it before "
                       "the stream receives it (hook_mlp_out): another tensor")
    for s in (d.site, d.out_site):
        last = n_layers - 1
        if s.layer > last:
            raise BadInput(f"{option} {d.path!r} reads {hook_name(s)}, but {model} has blocks 0 to "
                           f"{last}")
    if d.site.point is not MLP_IN and d.d_in != d_model:
        raise BadInput(f"{option} {d.path!r} reads vectors of width {d.d_in} at "
                       f"{hook_name(d.site)}; {model}'s stream has width {d_model}: a "
                       "dictionary of another model")
    if d.out_site.point is not MLP_IN and d.d_out != d_model:
        raise BadInput(f"{option} {d.path!r} writes vectors of width {d.d_out}; {model}'s stream "
                       f"has width {d_model}: a dictionary of another model")


def latent_block(d: Dictionary, latent: int, option: str = "--latent") -> tuple[int, Any]:
    """(block, dᵢ): the block whose output is the SAE's site, and latent i's decoder row (d,)
    float32 on the CPU, for an intervention at that block's output; one BadInput for a latent
    out of range or a site that is not a block's output."""
    if not 0 <= latent < d.d_sae:
        raise BadInput(f"{option} {latent}: {d.path!r} has latents 0 to {d.d_sae - 1}")
    s = d.out_site
    if d.role != "sae" or s.point not in (Point.resid_pre, Point.resid_post) or \
            (s.point is Point.resid_pre and s.layer == 0):
        raise BadInput(f"{option} with {param('sae')} {d.path!r}: its latents write to "
                       f"{hook_name(s)}, "
                       "which is not the output of a block (an SAE of the stream after a block "
                       "is needed)")
    block = s.layer if s.point is Point.resid_post else s.layer - 1
    return block, d.W_dec[latent].detach().float().cpu().clone()


# ---- readers ---------------------------------------------------------------------------------

def read_json(path: str) -> dict:
    """A JSON object from a file, or one BadInput naming the file."""
    try:
        cfg = loads(read_text(path))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BadInput(f"cannot read {path!r} as JSON: {str(e).splitlines()[0][:120]}") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"{path!r}: expected a JSON object, found {type(cfg).__name__}")
    return cfg


def _tensors(path: str) -> dict:
    """Every tensor of a .safetensors or .npz file as float32 torch tensors; a file that is not
    one (truncated, falsified) is one BadInput."""
    import numpy as np
    import torch

    try:
        check_regular(path)
    except OSError as e:
        raise BadInput(f"cannot read {path!r}: {e.strerror or e}") from None
    try:
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: np.asarray(z[k]) for k in z.files}
        else:
            from safetensors.numpy import load_file

            arrays = load_file(path)
    except Exception as e:  # safetensors, zipfile and numpy each raise their own kinds
        msg = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise BadInput(f"cannot read {path!r}: not a complete {os.path.splitext(path)[1]} file "
                       f"(truncated or damaged?): {msg}") from None
    out = {}
    for k, a in arrays.items():
        if a.dtype.kind not in "fiu":
            raise BadInput(f"{path!r}: tensor {k!r} holds {a.dtype}, not numbers")
        t = torch.from_numpy(np.ascontiguousarray(a).astype(np.float32))
        if not bool(torch.isfinite(t).all()):
            raise BadInput(f"{path!r}: tensor {k!r} holds NaN or infinite values")
        out[k] = t
    return out


def _need(tensors: dict, names: tuple[str, ...], path: str) -> None:
    missing = [n for n in names if n not in tensors]
    if missing:
        raise BadInput(f"{path!r} lacks the tensor{'s' if len(missing) > 1 else ''} "
                       f"{', '.join(missing)} (it has {', '.join(sorted(tensors)) or 'none'})")


def _ranks(tensors: dict, ranks: dict[str, int], path: str) -> None:
    """Each tensor's number of dimensions, before any of its sizes is read: a W_enc of one or
    three dimensions is refused here, not met as an IndexError further on."""
    for name, rank in ranks.items():
        if name in tensors and tensors[name].dim() != rank:
            shape = tuple(tensors[name].shape)
            raise BadInput(f"{path!r}: {name} has {tensors[name].dim()} dimension"
                           f"{'' if tensors[name].dim() == 1 else 's'} {shape}, expected "
                           f"{rank} ({'a matrix' if rank == 2 else 'a vector'})")


def _shape(t: Any, want: tuple[int, ...], what: str, path: str, source: str = "the config"
           ) -> None:
    shape = tuple(t.shape)
    if shape == want:
        return
    if len(shape) != len(want):
        raise BadInput(f"{path!r}: {what} has {len(shape)} dimension"
                       f"{'' if len(shape) == 1 else 's'} {shape}, expected {len(want)}: {want}")
    if len(want) == 2 and shape == want[::-1]:
        raise BadInput(f"{path!r}: {what} has shape {shape} where {want} was expected from "
                       f"{source}: it looks transposed (rows and columns swapped)")
    raise BadInput(f"{path!r}: {what} has shape {shape}, expected {want} from {source}: "
                   "weights of another width")


def _widths(d_in: int, d_sae: int, d_out: int, path: str) -> None:
    """No dictionary of zero latents, nor of vectors of width zero: read, it would answer
    every question with nothing."""
    if d_sae == 0:
        raise BadInput(f"{path!r}: a dictionary of 0 latents: nothing to read")
    if d_in == 0 or d_out == 0:
        raise BadInput(f"{path!r}: a dictionary of vectors of width 0: nothing to read")


def _k(cfg: dict, path: str, d_sae: int) -> int:
    """TopK's k, at most the number of latents (a larger k would keep latents that are not
    there)."""
    k = _int(cfg, "k", path)
    if k > d_sae:
        raise BadInput(f"{path!r}: k {k} is larger than the dictionary's {d_sae} latents: TopK "
                       "cannot keep more latents than it has")
    return k


def _bool(cfg: dict, key: str, default: bool, path: str) -> bool:
    """A switch of cfg.json: a JSON true or false. A string ("false") or a number is refused:
    Python would read "false" as true."""
    v = cfg.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadInput(f"{path!r}: {key} {v!r} is not a JSON boolean (true or false, without "
                       "quotes)")
    return v


def _int(cfg: dict, key: str, path: str, *, low: int = 1) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise BadInput(f"{path!r}: {key} {v!r} is not a whole number")
    return parse_int(str(v), f"{path!r}: {key}", low=low)


def _saelens(folder: str) -> Dictionary:
    cfg_path = os.path.join(folder, "cfg.json")
    cfg = read_json(cfg_path)
    meta: dict = next((m for m in (cfg.get("metadata"), cfg.get("meta")) if isinstance(m, dict)),
                      {})
    arch = str(cfg.get("architecture", "standard"))
    if arch not in _SAELENS_ARCH:
        raise BadInput(f"{cfg_path!r}: architecture {arch!r} is not one fptrace reads (it reads "
                       f"{', '.join(sorted(_SAELENS_ARCH))})")
    kind, role = _SAELENS_ARCH[arch]
    hook = cfg.get("hook_name", meta.get("hook_name"))
    if not isinstance(hook, str):
        raise BadInput(f"{cfg_path!r} does not say where the dictionary was trained (no "
                       "hook_name)")
    site = dictionary_site(hook, f"{cfg_path!r}: hook_name")
    layer = cfg.get("hook_layer", meta.get("hook_layer"))
    if layer is not None and _int({"hook_layer": layer}, "hook_layer", cfg_path, low=0) != \
            site.layer:
        raise BadInput(f"{cfg_path!r}: hook_layer {layer} and hook_name {hook!r} name different "
                       "blocks; the dictionary's place is ambiguous")
    out_site = site
    if role == "transcoder":
        out_hook = cfg.get("hook_name_out", meta.get("hook_name_out"))
        if not isinstance(out_hook, str):
            raise BadInput(f"{cfg_path!r}: a transcoder without hook_name_out")
        out_site = dictionary_site(out_hook, f"{cfg_path!r}: hook_name_out")
    norm = cfg.get("normalize_activations", "none")
    if norm not in (None, "none"):
        raise BadInput(f"{cfg_path!r}: normalize_activations {norm!r}: fptrace reads dictionaries "
                       "whose input is the raw stream (fold the scaling into the weights first)")
    d_in, d_sae = _int(cfg, "d_in", cfg_path), _int(cfg, "d_sae", cfg_path)
    d_out = _int(cfg, "d_out", cfg_path) if "d_out" in cfg else d_in
    weights = os.path.join(folder, "sae_weights.safetensors")
    t = _tensors(weights)
    _need(t, ("W_enc", "W_dec", "b_enc", "b_dec"), weights)
    _shape(t["W_enc"], (d_in, d_sae), "W_enc", weights)
    _shape(t["W_dec"], (d_sae, d_out), "W_dec", weights)
    _shape(t["b_enc"], (d_sae,), "b_enc", weights)
    _shape(t["b_dec"], (d_out,), "b_dec", weights)
    skip = arch.endswith("skip_transcoder")
    if skip or "W_skip" in t:
        W_skip = _skip(t, skip, role, d_in, d_out, weights, f"architecture {arch!r}",
                       "(d_out, d_in)")
    else:
        W_skip = None
    threshold, k = None, None
    if kind in ("jumprelu", "batchtopk"):
        if "threshold" not in t and kind == "batchtopk":
            kind = "topk"  # no stored threshold: per token, as SAELens's TopK runs it
        else:
            _need(t, ("threshold",), weights)
            _shape(t["threshold"], (d_sae,), "threshold", weights)
            threshold = t["threshold"]
    if kind == "topk":
        k = _k(cfg, cfg_path, d_sae)
    shift = _bool(cfg, "apply_b_dec_to_input", True, cfg_path) and role == "sae"
    return Dictionary(path=folder, format="saelens", kind=kind, role=role, site=site,
                      out_site=out_site, W_enc=t["W_enc"], b_enc=t["b_enc"], W_dec=t["W_dec"],
                      b_dec=t["b_dec"], threshold=threshold, k=k, shift_input=shift,
                      W_skip=W_skip)


def _skip(t: dict, declared: bool, role: str, d_in: int, d_out: int, path: str, what: str,
          stored: str) -> torch.Tensor:
    """A skip transcoder's W_skip as x·W_skip takes it (d_in, d_out), from a file that stores
    it `stored` ("(d_out, d_in)", applied as x·W_skipᵀ, or "(d_in, d_out)"): refused in an SAE,
    missing where the config declares one, in a transcoder whose config does not (`what`: what
    the config says), or of another shape."""
    if role != "transcoder":
        raise BadInput(f"{path!r}: a skip connection (W_skip) in an SAE: fptrace reads a W_skip "
                       "only in a transcoder (its dense term would rebuild part of what the "
                       "SAE reads, which no latent accounts for)")
    if not declared:
        raise BadInput(f"{path!r} holds W_skip, but its config ({what}) does not declare a skip "
                       "transcoder: which way it applies is not known")
    _need(t, ("W_skip",), path)
    _ranks(t, {"W_skip": 2}, path)
    if stored == "(d_out, d_in)":
        _shape(t["W_skip"], (d_out, d_in), "W_skip", path)
        return t["W_skip"].T.contiguous()
    _shape(t["W_skip"], (d_in, d_out), "W_skip", path, "its vectors and W_enc")
    return t["W_skip"]


def _sparsify(folder: str) -> Dictionary:
    cfg_path = os.path.join(folder, "cfg.json")
    cfg = read_json(cfg_path)
    hook = cfg.get("hookpoint") or os.path.basename(os.path.normpath(folder))
    site = dictionary_site(str(hook), f"{folder!r}: the hookpoint (the folder's name)")
    transcode = _bool(cfg, "transcode", False, cfg_path)
    skip = _bool(cfg, "skip_connection", False, cfg_path)
    if skip and not transcode:
        raise BadInput(f"{cfg_path!r}: skip_connection in an SAE (transcode false): fptrace reads "
                       "a W_skip only in a transcoder (its dense term would rebuild part of what "
                       "the SAE reads, which no latent accounts for)")
    weights = os.path.join(folder, "sae.safetensors")
    t = _tensors(weights)
    _need(t, ("encoder.weight", "encoder.bias", "W_dec", "b_dec"), weights)
    _ranks(t, {"encoder.weight": 2, "encoder.bias": 1, "W_dec": 2, "b_dec": 1}, weights)
    d_in = _int(cfg, "d_in", cfg_path) if "d_in" in cfg else int(t["encoder.weight"].shape[-1])
    n = _int(cfg, "num_latents", cfg_path, low=0) if "num_latents" in cfg else 0
    if n == 0:
        n = d_in * _int(cfg, "expansion_factor", cfg_path)
    d_out = int(t["b_dec"].shape[0]) if transcode else d_in
    _widths(d_in, n, d_out, weights)
    k = _k(cfg, cfg_path, n)
    _shape(t["encoder.weight"], (n, d_in), "encoder.weight", weights)
    _shape(t["encoder.bias"], (n,), "encoder.bias", weights)
    _shape(t["W_dec"], (n, d_out), "W_dec", weights)
    _shape(t["b_dec"], (d_out,), "b_dec", weights)
    W_skip = _skip(t, skip, "transcoder", d_in, d_out, weights, "skip_connection false",
                   "(d_out, d_in)") if skip or "W_skip" in t else None
    if transcode:
        if site.point is not Point.mlp_out:
            raise BadInput(f"{folder!r}: a sparsify transcoder at {hook!r}; fptrace reads "
                           "transcoders of an MLP (layers.L.mlp)")
        in_site = Site(site.layer, MLP_IN)
    else:
        in_site = site
    return Dictionary(path=folder, format="sparsify", kind="topk",
                      role="transcoder" if transcode else "sae", site=in_site, out_site=site,
                      W_enc=t["encoder.weight"].T.contiguous(), b_enc=t["encoder.bias"],
                      W_dec=t["W_dec"], b_dec=t["b_dec"], k=k, shift_input=not transcode,
                      W_skip=W_skip)


_LAYER = re.compile(r"layer_(\d+)")


def _gemmascope(path: str, site: str | None, what: str) -> Dictionary:
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    names = os.listdir(folder)
    file = path if not os.path.isdir(path) else os.path.join(
        folder, "params.npz" if "params.npz" in names else "params.safetensors")
    t = _tensors(file)
    _need(t, ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"), file)
    # no config gives the widths: each is read from a vector (b_enc: the latents, b_dec: the
    # output), and every matrix is checked against them before it is used
    _ranks(t, {"W_enc": 2, "W_dec": 2, "b_enc": 1, "b_dec": 1, "threshold": 1}, file)
    d_sae, d_out = int(t["b_enc"].shape[0]), int(t["b_dec"].shape[0])
    rows, cols = (int(x) for x in t["W_enc"].shape)
    d_in = cols if rows == d_sae and cols != d_sae else rows  # the other side of W_enc
    _widths(d_in, d_sae, d_out, file)
    source = "its vectors (b_enc: the latents, b_dec: the output width)"
    _shape(t["W_enc"], (d_in, d_sae), "W_enc", file, source)
    _shape(t["W_dec"], (d_sae, d_out), "W_dec", file, source)
    _shape(t["threshold"], (d_sae,), "threshold", file, source)
    role, in_site, out_site = _gemmascope_place(folder, site, what)
    # Gemma Scope 2's affine transcoders add x @ W_skip (d_in, d_out), as x @ W_enc is taken
    W_skip = _skip(t, True, role, d_in, d_out, file, "", "(d_in, d_out)") if "W_skip" in t \
        else None
    return Dictionary(path=folder, format="gemmascope", kind="jumprelu", role=role, site=in_site,
                      out_site=out_site, W_enc=t["W_enc"], b_enc=t["b_enc"], W_dec=t["W_dec"],
                      b_dec=t["b_dec"], threshold=t["threshold"], shift_input=False,
                      W_skip=W_skip)


def _gemmascope_place(folder: str, site: str | None, what: str) -> tuple[str, Site, Site]:
    """(role, input site, output site) from config.json (hook_name / hf_hook_point_in and _out)
    or from the path; `site` where neither says."""
    cfg_path = os.path.join(folder, "config.json")
    if os.path.isfile(cfg_path):
        cfg = read_json(cfg_path)
        hin = cfg.get("hook_name", cfg.get("hf_hook_point_in"))
        hout = cfg.get("hook_name_out", cfg.get("hf_hook_point_out", hin))
        if isinstance(hin, str) and isinstance(hout, str):
            s_in = dictionary_site(hin, f"{cfg_path!r}: hook point")
            s_out = dictionary_site(hout, f"{cfg_path!r}: hook point")
            if same_tensor(s_in, s_out):
                return "sae", s_in, s_in
            read = Site(s_in.layer, MLP_IN) if s_in.point is Point.mlp_out else s_in
            return "transcoder", read, s_out
    # the releases' layouts: gemma-scope-2b-pt-res/layer_12/width_16k/average_l0_82 (Gemma
    # Scope) and resid_post_all/layer_7_width_16k_l0_big (Gemma Scope 2): the layer is the last
    # component that starts with layer_N, what was read is named by the component before it
    # (never by a folder further up, whose name is the user's)
    parts = os.path.abspath(folder).replace(os.sep, "/").lower().split("/")
    at = [i for i, part in enumerate(parts) if _LAYER.match(part)]
    if not at:
        if site is None:
            raise BadInput(f"{what} {folder!r}: Gemma Scope weights whose folder does not say "
                           "where they were trained (no config.json, no layer_N in the path); "
                           f"give {param('site')}, e.g. blocks.12.hook_resid_post")
        s = dictionary_site(site, param("site"))
        return "sae", s, s
    m = _LAYER.match(parts[at[-1]])
    assert m is not None
    block = parse_int(m.group(1), f"{folder!r}: layer", low=0)
    words = set(re.split(r"[-_.]", parts[at[-1] - 1])) if at[-1] > 0 else set()
    if words & {"transcoder", "transcoders"}:
        return "transcoder", Site(block, MLP_IN), Site(block, Point.mlp_out)
    if "mlp" in words:
        s = Site(block, Point.mlp_out)
    elif words & {"res", "resid"}:
        s = Site(block, Point.resid_post)
    else:
        if site is None:
            raise BadInput(f"{what} {folder!r}: the path names a layer but not what was read "
                           f"(res, mlp, transcoder); give {param('site')}")
        s = dictionary_site(site, param("site"))
    return "sae", s, s


# ---- circuit-tracer's transcoder sets --------------------------------------------------------

CT_CONFIG = "config.yaml"
# its feature_input_hook / feature_output_hook (TransformerLens names within block L) that
# name the MLP's input and output
_CT_IN = ("mlp.hook_in", "ln2.hook_normalized", "hook_mlp_in")
_CT_OUT = ("mlp.hook_out", "hook_mlp_out")
_CT_THRESHOLD = "activation_function.threshold"
_CT_TENSORS = ("W_enc", "W_dec", "b_enc", "b_dec", _CT_THRESHOLD, "W_skip")
_CT_FILE = re.compile(r"layer_(\d+)\.safetensors")


def is_transcoder_set(path: str) -> bool:
    """Whether `path` is a folder holding a circuit-tracer transcoder set (its config.yaml)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, CT_CONFIG)) and \
        not os.path.isfile(os.path.join(path, "cfg.json"))


def read_transcoder_set(folder: str, what: str = "--transcoders") -> list[Dictionary]:
    """circuit-tracer's transcoder set in `folder` (see the module's text): one transcoder a
    layer file, in layer order; a block the set has no file for has no transcoder."""
    files, module_out = _ct_config(folder, what)
    return [_ct_layer(file, layer, module_out) for layer, file in sorted(files.items())]


def _ct_file(path: str, what: str) -> Dictionary:
    """One layer of a circuit-tracer set, named by its file beside the set's config.yaml; the
    set's folder given where one dictionary is wanted is refused (which layer is not said)."""
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        files, _ = _ct_config(path, what)
        some = min(files) if files else 0
        raise BadInput(f"{what} {path!r}: a circuit-tracer transcoder set of {len(files)} "
                       f"layer{'s' if len(files) != 1 else ''}: give one layer's file, e.g. "
                       f"{os.path.join(path, f'layer_{some}.safetensors')!r}")
    files, module_out = _ct_config(folder, what)
    real = os.path.realpath(path)
    layer = next((i for i, f in files.items() if os.path.realpath(f) == real), None)
    if layer is None:
        raise BadInput(f"{what} {path!r}: the set's {os.path.join(folder, CT_CONFIG)!r} does not "
                       "list this file, so its layer is not known")
    return _ct_layer(path, layer, module_out)


def _ct_config(folder: str, what: str) -> tuple[dict[int, str], bool]:
    """({layer: its file}, whether the output hook is the MLP module's own output) from a set's
    config.yaml, read as circuit-tracer's load_transcoders
    reads it: `transcoders` lists the files in layer order (hf:// URIs refused: fptrace reads
    local files; a relative path from the config's folder, else from the working directory as
    circuit-tracer reads it, refused where it names a file both ways and they differ); without
    it, the folder's
    layer_N.safetensors. Its kind and hooks checked: a per-layer set of the MLP."""
    import yaml

    path = os.path.join(folder, CT_CONFIG)
    try:
        cfg = yaml.safe_load(read_text(path))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise BadInput(f"cannot read {path!r} as YAML: {str(e).splitlines()[0][:120]}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise BadInput(f"cannot read {path!r} as YAML: nested too deep") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"{path!r}: expected a YAML mapping (model_kind, feature_input_hook, ...), "
                       f"found {type(cfg).__name__}")
    kind = cfg.get("model_kind")
    if kind == "cross_layer_transcoder":
        raise BadInput(f"{what} {folder!r}: a cross-layer transcoder (model_kind: "
                       "cross_layer_transcoder) is not read yet; fptrace reads circuit-tracer's "
                       "per-layer sets (model_kind: transcoder_set)")
    if kind != "transcoder_set":
        raise BadInput(f"{path!r}: model_kind {kind!r}: fptrace reads circuit-tracer's "
                       "transcoder_set")
    for key, names, what_it in (("feature_input_hook", _CT_IN, "input"),
                                ("feature_output_hook", _CT_OUT, "output")):
        hook = cfg.get(key)
        if hook not in names:
            raise BadInput(f"{path!r}: {key} {hook!r}: fptrace reads transcoders that map the "
                           f"MLP's input to its output; the MLP's {what_it} is "
                           f"{' or '.join(names)}")
    module_out = cfg["feature_output_hook"] == "mlp.hook_out"
    listed = cfg.get("transcoders")
    if listed is None:
        found = {_CT_FILE.fullmatch(n): n for n in os.listdir(folder)}
        files = {int(m.group(1)): os.path.join(folder, n) for m, n in found.items() if m}
        if not files:
            raise BadInput(f"{path!r} lists no transcoders and {folder!r} holds no "
                           "layer_N.safetensors")
        return files, module_out
    if not isinstance(listed, list) or not all(isinstance(f, str) for f in listed):
        raise BadInput(f"{path!r}: transcoders is not a list of file paths")
    if not listed:
        raise BadInput(f"{path!r}: transcoders lists no file: no transcoder to read")
    files = {}
    for layer, f in enumerate(listed):
        if "://" in f:
            raise BadInput(f"{path!r}: layer {layer}'s transcoder {f!r} is a URI; fptrace reads "
                           "local files only (it is offline): download it and list its path")
        here = os.path.join(folder, f)  # an absolute f stays as it is
        there = os.path.abspath(f)  # circuit-tracer's own reading: from the working directory
        if os.path.isfile(here):
            if os.path.isfile(there) and not os.path.samefile(here, there):
                raise BadInput(f"{path!r}: layer {layer}'s file {f!r} names two files, "
                               f"{here!r} from the config's folder and {there!r} from the "
                               "working directory (as circuit-tracer reads it): give its "
                               "absolute path")
            files[layer] = here
        elif os.path.isfile(there):
            files[layer] = there
        else:
            raise BadInput(f"{path!r}: layer {layer}'s file {f!r} does not exist in the "
                           f"config's folder ({here!r}) or the working directory")
    return files, module_out


def _ct_layer(file: str, layer: int, module_out: bool) -> Dictionary:
    """One layer file of a circuit-tracer set, as its load_relu_transcoder loads it: the widths
    from b_enc (latents) and b_dec (the model's), W_enc and W_dec (d_sae, d_model), JumpReLU
    where activation_function.threshold is stored, else ReLU; the input not shifted."""
    t = _tensors(file)
    other = sorted(set(t) - set(_CT_TENSORS))
    if other:  # its load_state_dict refuses what it does not hold
        raise BadInput(f"{file!r}: tensor{'s' if len(other) > 1 else ''} {', '.join(other)} "
                       f"{'are' if len(other) > 1 else 'is'} not circuit-tracer's (a layer file "
                       f"holds {', '.join(_CT_TENSORS)}; its threshold is {_CT_THRESHOLD})")
    _need(t, ("W_enc", "W_dec", "b_enc", "b_dec"), file)
    _ranks(t, {"W_enc": 2, "W_dec": 2, "b_enc": 1, "b_dec": 1, _CT_THRESHOLD: 1}, file)
    d_sae, d = int(t["b_enc"].shape[0]), int(t["b_dec"].shape[0])
    _widths(d, d_sae, d, file)
    source = "its vectors (b_enc: the latents, b_dec: the model's width)"
    _shape(t["W_enc"], (d_sae, d), "W_enc", file, source)
    _shape(t["W_dec"], (d_sae, d), "W_dec", file, source)
    threshold = t.get(_CT_THRESHOLD)
    if threshold is not None:
        _shape(threshold, (d_sae,), _CT_THRESHOLD, file, source)
        if bool((threshold < 0).any()):
            raise BadInput(f"{file!r}: a threshold below 0 ({float(threshold.min()):.4g}): "
                           "circuit-tracer's JumpReLU passes the negative pre-activations above "
                           "it, fptrace's does not; not read")
    W_skip = _skip(t, True, "transcoder", d, d, file, "", "(d_out, d_in)") if "W_skip" in t \
        else None
    return Dictionary(path=file, format="circuittracer",
                      kind="relu" if threshold is None else "jumprelu", role="transcoder",
                      site=Site(layer, MLP_IN), out_site=Site(layer, Point.mlp_out),
                      W_enc=t["W_enc"].T.contiguous(), b_enc=t["b_enc"], W_dec=t["W_dec"],
                      b_dec=t["b_dec"], threshold=threshold, shift_input=False, W_skip=W_skip,
                      module_out=module_out)


__all__ = [
    "CT_CONFIG",
    "FORMATS",
    "KINDS",
    "ROLES",
    "Dictionary",
    "activate",
    "check_model",
    "check_role",
    "is_transcoder_set",
    "latent_block",
    "read_dictionary",
    "read_json",
    "read_transcoder_set",
]
