"""The family registry: every architecture fact fptrace uses, one file per family.

A family module (gpt2.py, llama.py, gemma2.py, ...) holds the whole family: its facts
(FAMILY = Family(...)), the tiny random-weight config the tests build of it, and the block
recomputation `explain` runs (its `block` and `final_norm`, written with the shared operations of
ops.py). Every module of this package but ops.py and parts.py is a family module; they are found
by walking the package, imported and checked here, at import time, so a family cannot be
half-added: a module without FAMILY, a missing fact, a tiny config of another model type, or a
model type claimed twice is refused with a message naming what is wrong.

Nothing outside this package branches on a family's name: the tracer, explain, shapes and the
renderers ask the Family (or the ModelParts resolved through it) instead. Adding a family is
adding its file.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

from fptrace.points import BLOCK, Point
from fptrace.errors import FptraceError

# modules of this package that are not families: the shared recompute operations, the parts
NOT_FAMILIES = ("ops", "parts")

# leaf module names inside a block -> what a reader calls them (shape steps); a family adds or
# overrides entries through Family.labels
COMMON_LABELS = {
    "q_proj": "Q projection", "k_proj": "K projection", "v_proj": "V projection",
    "q_norm": "Q norm", "k_norm": "K norm",
    "o_proj": "output projection W_O",
    "gate_proj": "MLP gate", "up_proj": "MLP up", "down_proj": "MLP down",
    "act_fn": "activation", "act": "activation", "activation_fn": "activation",
}

NORM_TYPES = ("layernorm", "rmsnorm", "rmsnorm (1 + w)")
MLP_TYPES = ("gelu", "swiglu", "geglu")
POSITIONS = ("learned", "rope")


class FamilyDefinitionError(FptraceError, ImportError):
    """A family module is incomplete or contradicts another: a bug in fptrace, caught at
    import."""


def _intermediate_size(config: Any) -> int | None:
    return getattr(config, "intermediate_size", None)


@dataclass(frozen=True)
class Tap:
    """Where a block shows one of its points (points.py): the output ("out") or the input
    ("in") of a module, by its path from the block ("" is the block itself); item: which element
    of a tuple output; part (i, n): the i-th of n equal slices of the last dimension (a fused
    projection's output)."""

    module: str
    side: str = "out"
    item: int = 0
    part: tuple[int, int] | None = None


@dataclass(frozen=True)
class LlamaCppNames:
    """How llama.cpp's compute graph names the points of a family (`--engine llama.cpp`).

    archs: the GGUF architectures (general.architecture) the names were checked on; points:
    Point -> the graph name without its `-{layer}` suffix (block points) or whole (embed,
    final_norm, logits); rope_adjacent: llama.cpp's q and k keep each rotary pair side by side
    (the GGUF converter permuted W_Q and W_K for its rotation), so they are put back in the
    checkpoint's order (first halves, then second halves) before they are compared."""

    archs: tuple[str, ...]
    points: dict
    rope_adjacent: bool = False


@dataclass(frozen=True)
class Family:
    """Where the parts of one architecture live and what each adds to the residual stream.

    Paths are dotted, from the *ForCausalLM root (embed, blocks, final_norm, lm_head) or from one
    block (attn, mlp, attn_added, mlp_added, norms)."""

    name: str  # short name shown in the header and JSON, e.g. "gemma2"
    title: str  # what a reader calls it, e.g. "Gemma 2"
    model_types: tuple[str, ...]  # values of config.model_type served by this family
    blocks: str  # the ModuleList of blocks
    embed: str  # token embedding
    final_norm: str
    lm_head: str
    attn: str  # the attention module (its weights: W_Q, W_K, W_V, W_O)
    mlp: str  # the MLP module
    norm_type: str  # one of NORM_TYPES
    mlp_type: str  # one of MLP_TYPES
    positions: str  # one of POSITIONS
    tiny: dict  # a tiny random-weight config of this family (tests build it), model_type first
    pos_embed: str | None = None  # learned absolute position embedding, if any
    # The module whose output[0] the stream receives from attention / the MLP. The attention
    # and MLP modules themselves unless the family normalises their outputs before adding them
    # (Gemma 2/3, OLMo 2: the post-norms).
    attn_added: str | None = None
    mlp_added: str | None = None
    embed_scale: str | None = None  # "sqrt_d": the embedding is multiplied by √d_model (Gemma)
    qk_norm: str | None = None  # "per_head" (Qwen3, Gemma 3) or "whole" (OLMo 2) RMSNorm on Q, K
    attn_softcap_attr: str | None = None  # config attribute: cap·tanh(scores / cap)
    final_softcap_attr: str | None = None  # config attribute: cap·tanh(logits / cap)
    parallel_residual: bool = False  # attn and MLP both read resid_pre (GPT-NeoX)
    parallel_residual_attr: str | None = None  # config attribute that overrides the default
    w_o: tuple[str, ...] = ("o_proj",)  # leaf names of the attention output projection
    # The norm in front of attention, from one block (None: the projections read the stream
    # itself, OLMo 2), and the reader of its query and key projections:
    # qk_weights(attn, nh, nkv, hd) -> (W_Q (nh·hd, d), b_Q or None, W_K (nkv·hd, d), b_K or None)
    # as nn.Linear stores them. Without a reader, `attribute --qk` does not cover the family.
    attn_norm: str | None = None
    qk_weights: Callable[..., Any] | None = None
    labels: dict = field(default_factory=dict)  # leaf name -> shape-step label (over COMMON)
    d_mlp: Callable[[Any], int | None] = _intermediate_size  # the MLP width from the config
    # explain's recomputation, from the checkpoint's own weights, of one block:
    # block(x, blk, cfg, layer, steps, model, family) -> the stream leaving the block, and of
    # the final norm: final_norm(x, norm, cfg, steps); None: explain does not cover the family
    recompute_block: Callable[..., Any] | None = None
    recompute_final_norm: Callable[..., Any] | None = None
    # The points a block's modules show (diff --deep records them there): Point -> Tap. The
    # block's input and output, the attention weights (the attention module's second output
    # under eager attention) and the post-norms are added by block_taps().
    taps: dict = field(default_factory=dict)
    # q, k and v after their norms and RoPE show in no module: heads(*outputs of head_taps,
    # attn, cfg, layer, steps, model, family) recomputes them from the projections' outputs,
    # with the config's own RoPE; explain's block runs the same function.
    head_taps: tuple[str, ...] = ()
    heads: Callable[..., Any] | None = None
    # the names llama.cpp gives this family's points, for `--engine llama.cpp`; None: unmapped
    llamacpp_names: LlamaCppNames | None = None

    # ------------------------------------------------------------------ derived facts
    @property
    def post_norms(self) -> bool:
        """Sublayer outputs are normalised before the residual add."""
        return self.attn_added is not None or self.mlp_added is not None

    def block_taps(self, parallel: bool) -> dict[Point, Tap]:
        """Every point of one block a module shows, in the order of points.BLOCK; a
        parallel residual has no resid_mid (the MLP side reads the block's input)."""
        taps = {Point.resid_pre: Tap("", "in"), Point.attn_weights: Tap(self.attn, item=1),
                Point.resid_post: Tap(""), **self.taps}
        if self.attn_added:
            taps[Point.ln1_post] = Tap(self.attn_added)
        if self.mlp_added:
            taps[Point.ln2_post] = Tap(self.mlp_added)
        if parallel:
            taps.pop(Point.resid_mid, None)
        return {p: taps[p] for p in BLOCK if p in taps}

    def label(self, leaf: str, in_attn: bool) -> str | None:
        if leaf in self.w_o and in_attn:
            return "output projection W_O"
        return self.labels.get(leaf, COMMON_LABELS.get(leaf))

    def softcap(self, config: Any, which: str) -> float | None:
        """The attention ("attn") or final ("final") logit softcap of this config, or None."""
        attr = self.attn_softcap_attr if which == "attn" else self.final_softcap_attr
        value = getattr(config, attr, None) if attr else None
        return float(value) if value else None

    def uses_parallel_residual(self, config: Any) -> bool:
        if self.parallel_residual_attr is not None:
            return bool(getattr(config, self.parallel_residual_attr, self.parallel_residual))
        return self.parallel_residual

    def differences(self, n_heads: int, n_kv_heads: int, config: Any) -> list[str]:
        """How this family differs from GPT-2's block, fact by fact (empty for GPT-2)."""
        out = []
        if self.positions == "rope":
            out.append("no position embedding: RoPE rotates Q and K inside attention")
        if self.norm_type.startswith("rmsnorm"):
            out.append("RMSNorm instead of LayerNorm (no mean subtraction, no bias)"
                       + ("; the scale is (1 + w)" if "1 + w" in self.norm_type else ""))
        if self.mlp_type == "swiglu":
            out.append("SwiGLU MLP: down(SiLU(gate(x)) · up(x)), three matrices instead of two")
        if self.mlp_type == "geglu":
            out.append("GeGLU MLP: down(GELU(gate(x)) · up(x)), three matrices instead of two")
        if n_kv_heads != n_heads:
            out.append(f"grouped-query attention: {n_kv_heads} K/V heads shared by {n_heads} "
                       f"query heads ({n_heads // n_kv_heads} each), repeated to match Q")
        if self.embed_scale == "sqrt_d":
            out.append("the token embedding is multiplied by √d_model")
        if self.qk_norm:
            out.append("RMSNorm on Q and K before RoPE"
                       + (" (per head)" if self.qk_norm == "per_head" else " (whole projection)"))
        if self.post_norms:
            out.append("attention and MLP outputs are normalised before the residual add")
        if self.softcap(config, "attn"):
            out.append(f"attention scores soft-capped at {self.softcap(config, 'attn'):g}")
        if self.softcap(config, "final"):
            out.append(f"final logits soft-capped at {self.softcap(config, 'final'):g}")
        return out


_REQUIRED = ("name", "title", "model_types", "blocks", "embed", "final_norm", "lm_head", "attn",
             "mlp", "norm_type", "mlp_type", "positions", "tiny")


def check_family(module_name: str, module: Any) -> Family:
    """The FAMILY of a family module, or FamilyDefinitionError naming what is missing."""
    fam = getattr(module, "FAMILY", None)
    where = f"family module fptrace.families.{module_name}"
    if not isinstance(fam, Family):
        raise FamilyDefinitionError(f"{where} defines no FAMILY = Family(...)")
    missing = [f for f in _REQUIRED if not getattr(fam, f)]
    if missing:
        raise FamilyDefinitionError(f"{where} is incomplete: no {', '.join(missing)}")
    for value, allowed, what in ((fam.norm_type, NORM_TYPES, "norm_type"),
                                 (fam.mlp_type, MLP_TYPES, "mlp_type"),
                                 (fam.positions, POSITIONS, "positions")):
        if value not in allowed:
            raise FamilyDefinitionError(f"{where}: {what} {value!r} is not one of "
                                        + ", ".join(allowed))
    if fam.tiny.get("model_type") not in fam.model_types:
        raise FamilyDefinitionError(f"{where}: its tiny config has model_type "
                                    f"{fam.tiny.get('model_type')!r}, not one of the family's "
                                    + ", ".join(fam.model_types))
    if (fam.recompute_block is None) != (fam.recompute_final_norm is None):
        raise FamilyDefinitionError(f"{where}: a block recomputation needs both recompute_block "
                                    "and recompute_final_norm")
    if bool(fam.heads) != bool(fam.head_taps):
        raise FamilyDefinitionError(f"{where}: heads and head_taps go together")
    bad = [k for k, t in fam.taps.items() if not isinstance(k, Point) or not isinstance(t, Tap)
           or t.side not in ("in", "out")]
    if bad:
        raise FamilyDefinitionError(f"{where}: taps must map a Point to a Tap (side 'in' or "
                                    f"'out'): {bad[0]!r}")
    return fam


def family_modules() -> tuple[str, ...]:
    """The names of the family modules: every module of this package but NOT_FAMILIES."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                        if m.name not in NOT_FAMILIES))


def load_families(names: tuple[str, ...] | None = None) -> tuple[Family, ...]:
    """Import and check every family module (or those named); model types must be claimed
    once."""
    names = family_modules() if names is None else names
    out: list[Family] = []
    seen: dict[str, str] = {}
    for name in names:
        fam = check_family(name, importlib.import_module(f"{__name__}.{name}"))
        for t in fam.model_types:
            if t in seen:
                raise FamilyDefinitionError(f"model type {t!r} is claimed by both the "
                                            f"{seen[t]} and the {fam.name} family")
            seen[t] = fam.name
        out.append(fam)
    return tuple(out)




def llamacpp_names_for(arch: str) -> LlamaCppNames | None:
    """The llama.cpp name map checked on GGUF architecture `arch`, or None."""
    for fam in FAMILIES:
        if fam.llamacpp_names is not None and arch in fam.llamacpp_names.archs:
            return fam.llamacpp_names
    return None


def family_for_config(config: Any) -> Family | None:
    """The registered family of a transformers config, or None."""
    return _BY_TYPE.get(getattr(config, "model_type", None))


def supported_types() -> list[str]:
    return sorted(_BY_TYPE)


def with_walkthrough() -> str:
    """The families explain covers, with the model types each serves, for messages."""
    return ", ".join(f"{f.name} ({'/'.join(f.model_types)})" if f.model_types != (f.name,)
                     else f.name for f in FAMILIES if f.recompute_block)


# Last, once every name above exists: the family modules import Family (and parts.py imports
# family_for_config) from this package while it is being initialised.
FAMILIES: tuple[Family, ...] = load_families()
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}
