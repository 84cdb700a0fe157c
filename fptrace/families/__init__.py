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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fptrace.errors import FptraceError
from fptrace.families.kinds import EmbedScale, MlpKind, NormKind, PositionKind, QkNorm, Scoring
from fptrace.points import BLOCK, Point

if TYPE_CHECKING:
    from types import ModuleType

    from transformers import PretrainedConfig

# modules of this package that are not families: the shared recompute operations, the parts,
# the kinds
NOT_FAMILIES = ("ops", "parts", "kinds")

# leaf module names inside a block -> what a reader calls them (shape steps); a family adds or
# overrides entries through Family.labels
COMMON_LABELS = {
    "q_proj": "Q projection", "k_proj": "K projection", "v_proj": "V projection",
    "q_norm": "Q norm", "k_norm": "K norm",
    "o_proj": "output projection W_O",
    "gate_proj": "MLP gate", "up_proj": "MLP up", "down_proj": "MLP down",
    "act_fn": "activation", "act": "activation", "activation_fn": "activation",
}



class FamilyDefinitionError(FptraceError, ImportError):
    """A family module is incomplete or contradicts another: a bug in fptrace, caught at
    import."""


def _intermediate_size(config: PretrainedConfig) -> int | None:
    return getattr(config, "intermediate_size", None)


@dataclass(frozen=True)
class Moe:
    """A mixture-of-experts MLP as one config sets it: how many experts, how many each token
    takes, and how the router turns its logits into the weights of the chosen ones."""

    n_experts: int  # routed experts per MoE block
    top_k: int  # routed experts each token takes
    d_expert: int  # hidden width of one routed expert
    n_shared: int = 0  # shared experts every token takes (0: none)
    d_shared: int = 0  # hidden width of the shared expert MLP (all shared experts together)
    # "softmax": over all experts, then the top k; "sigmoid": each logit on its own (DeepSeek-V3);
    # "softmax over the top k": the top k logits first, a softmax over them (gpt-oss)
    scoring: Scoring = Scoring.softmax
    renormalise: bool = False  # the chosen scores divided by their sum
    scale: float = 1.0  # the weights multiplied by this (DeepSeek-V3's routed_scaling_factor)
    n_groups: int = 1  # grouped top-k (DeepSeek-V3): experts in n_groups groups, of which ...
    topk_groups: int = 1  # ... the topk_groups best (by the sum of their 2 best scores) compete
    score_bias: bool = False  # a learned bias added to the scores for the choice only (DeepSeek-V3)
    router_bias: bool = False  # the router's linear map has a bias (gpt-oss)
    shared_gate: bool = False  # the shared expert's output × σ(its own gate · x) (Qwen2-MoE)

    def __post_init__(self) -> None:
        if not isinstance(self.scoring, Scoring):  # its word is taken too ("sigmoid")
            object.__setattr__(self, "scoring", Scoring(self.scoring))

    @property
    def header(self) -> str:
        """`8 experts, 2 active (+ 1 shared), d_expert 14336`."""
        shared = f" (+ {self.n_shared} shared)" if self.n_shared else ""
        return f"{self.n_experts} experts, {self.top_k} active{shared}, d_expert {self.d_expert}"


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
    checkpoint's order (first halves, then second halves) before they are compared;
    weights: the GGUF name (`blk.{layer}.NAME.weight`) of each linear module of a block, by its
    path in the block, and heads: the GGUF names the LM head's weight may have, the first
    present (a tied head is the token embedding), for `--emulate act-q8`, which quantizes each
    product's input the way llama.cpp does for that weight's type; operands: a name of `points`
    the graph does not give, read as operand i of a node it names in the same block (Qwen2's
    graph adds its unnamed attention output to the stream as `ffn_inp`'s operand 0: {"attn_out":
    ("ffn_inp", 0)}; more indices follow operands of unnamed operands, Phi-3's {"attn_out":
    ("l_out", 0, 0)}; engines/llamacpp/capture.py); added: the points whose nodes the stream
    receives from attention and from the MLP (the post-norms where the family has them);
    routing: for a mixture of experts, the nodes of each MoE block's router logits (T, E), the
    experts it chose (T, k) and their weights (T, k), which make the trace's routing; parts:
    a point the graph computes inside a fused product, Point -> (name, i, n): the i-th of n
    equal slices of that node's last dimension (Phi-3's gate and up, the halves of `ffn_up`);
    q_scaled: the graph's last `Qcur` is q already multiplied by 1/√head_dim (Phi-3 scales q
    before attention, whose own scale is then 1), so it is multiplied back before it is
    compared; experts: the GGUF names (gate, up, down: `blk.{layer}.NAME.weight`, 3-D) of the
    routed experts' weights, by the path in the block of the module that holds them stacked
    (transformers' experts module), for `--emulate act-q8`; no_emulation: why `--emulate` does
    not cover the family (one line; None where it does)."""

    archs: tuple[str, ...]
    points: dict
    rope_adjacent: bool = False
    weights: dict = field(default_factory=dict)
    heads: tuple[str, ...] = ("output", "token_embd")
    operands: dict = field(default_factory=dict)
    added: tuple = (Point.attn_out, Point.mlp_out)
    routing: tuple[str, str, str] | None = None
    parts: dict = field(default_factory=dict)
    q_scaled: bool = False
    experts: dict = field(default_factory=dict)
    no_emulation: str | None = None
    # graph names a block gives two nodes, of which the first is the point (GPT-NeoX's
    # `ffn_out`: the MLP's output, then the same plus the block's input); other names keep
    # the last node's
    first: tuple[str, ...] = ()

    def routed(self, arch: str, mlp_out: str, routing: tuple[str, str, str], experts: dict,
               weights: dict | None = None) -> LlamaCppNames:
        """These names for the mixture-of-experts architecture `arch` built on this one: the
        dense MLP's points dropped (each position goes through experts of its own), the MoE
        block's output (what the stream receives) named `mlp_out`, its router's nodes
        `routing`, its experts' weights `experts`; `weights`: its linear modules' names, where
        they differ from this one's."""
        from dataclasses import replace

        dense = (Point.mlp_gate, Point.mlp_up, Point.mlp_act, Point.mlp_out)
        points = {p: n for p, n in self.points.items() if p not in dense}
        return replace(self, archs=(arch,), points=points | {Point.mlp_out: mlp_out},
                       routing=routing, experts=experts,
                       weights=self.weights if weights is None else weights)


@dataclass(frozen=True)
class GGUFWeights:
    """How fptrace reads a GGUF file of an architecture transformers' GGUF loader does not read
    (models/gguf_reader.py builds the family's transformers model from it).

    arch: the GGUF architecture (general.architecture); model_type: the transformers model type
    built; config: config attribute -> the file's `{arch}.KEY` (a str), a value, or a function
    of the file's hyperparameter getter (`hparam(name)`) returning the value, a None leaving
    the config's default; tensors: the model's state-dict name -> the GGUF tensor's name, with
    `{i}` for the block (`model.layers.{i}.self_attn.q_proj.weight` -> `blk.{i}.attn_q.weight`),
    or a tuple of names whose tensors are stacked along the weight's rows (its axis −2: the
    experts' fused gate_up_proj, which llama.cpp keeps as ffn_gate_exps and ffn_up_exps),
    every weight of the model named; fixes: a state-dict name (with `{i}`) -> what llama.cpp's
    converter did to the weight besides renaming it, undone on reading: "rope_adjacent_q" /
    "rope_adjacent_k" (Llama's W_Q / W_K row permutation, by the query / key-value heads),
    "qkv_by_head" (a fused [Q; K; V] put back head by head, [q|k|v] of head 0 first, as
    GPT-NeoX keeps it), "gate_up_interleaved" / "gate_up_bias_interleaved" (gpt-oss's experts'
    gate and up, two tensors in the file, put back interleaved in one, gate in the even
    places; the weights transposed too), "transposed" (the last two axes swapped: gpt-oss's
    experts' down_proj), "one_added" (a norm weight stored as 1 + w, Gemma's: the 1 taken
    off, so that the model's own 1 + w is the stored value again); unread: the file's keys
    (`{arch}.KEY`) the reader does not turn into the config (OLMo 3's sliding window in an
    olmo2 file, a RoPE scaling): a file stating one is refused in one line, not read as a model
    it is not."""

    arch: str
    model_type: str
    config: dict
    tensors: dict
    fixes: dict = field(default_factory=dict)
    unread: tuple[str, ...] = ()
    # for an architecture another family's files share (Mixtral's `llama`: transformers' GGUF
    # loader reads Llama's), the files read: those stating an expert count (True, as llama.cpp
    # builds routed experts where `{arch}.expert_count` is set) or those not (False); None: all
    experts: bool | None = None


# what every Llama-like GGUF states the same way (GGUFWeights.config and .tensors): the config's
# sizes under llama.cpp's keys, and the embedding, final norm and head under its names
GGUF_LLAMA_CONFIG = {"hidden_size": "embedding_length", "num_hidden_layers": "block_count",
                     "num_attention_heads": "attention.head_count",
                     "num_key_value_heads": "attention.head_count_kv",
                     "rms_norm_eps": "attention.layer_norm_rms_epsilon",
                     "max_position_embeddings": "context_length"}
GGUF_LLAMA_TENSORS = {"model.embed_tokens.weight": "token_embd.weight",
                      "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


GGUF_ATTENTION = (("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
                  ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"))


def gguf_block_tensors(*pairs: tuple[str, str]) -> dict[str, str]:
    """Per-block weights named alike in every block: each (HF module, llama.cpp name) pair gives
    `model.layers.{i}.<module>.weight` ← `blk.{i}.<name>.weight`."""
    return {f"model.layers.{{i}}.{hf}.weight": f"blk.{{i}}.{gg}.weight" for hf, gg in pairs}


def gguf_default_rope(hparam: Callable[[str], object]) -> dict:
    """Plain RoPE (no scaling) with the file's base, llama.cpp's 10,000 where it states none."""
    return {"rope_type": "default", "rope_theta": hparam("rope.freq_base") or 1e4}


def gguf_expert_width(hparam: Callable[[str], object]) -> object:
    """The routed experts' width a MoE GGUF states (its dense width where it has no key of its
    own)."""
    return hparam("expert_feed_forward_length") or hparam("feed_forward_length")


def gguf_number(value: object, default: float) -> float:
    """A GGUF key's number as a float, or `default` where the key is absent (or not a
    number)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return default


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
    norm_type: NormKind
    mlp_type: MlpKind
    positions: PositionKind
    tiny: dict  # a tiny random-weight config of this family (tests build it), model_type first
    pos_embed: str | None = None  # learned absolute position embedding, if any
    # The module whose output[0] the stream receives from attention / the MLP. The attention
    # and MLP modules themselves unless the family normalises their outputs before adding them
    # (Gemma 2/3, OLMo 2: the post-norms).
    attn_added: str | None = None
    mlp_added: str | None = None
    embed_scale: EmbedScale | None = None  # the embedding is multiplied by √d_model (Gemma)
    qk_norm: QkNorm | None = None  # RMSNorm on Q and K: per head (Qwen3, Gemma 3) or whole (OLMo 2)
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
    # the MLP width from the config
    d_mlp: Callable[[PretrainedConfig], int | None] = _intermediate_size
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
    # Mixture of experts (mlp_type "moe"): the config's MoE facts, or None where the config
    # has no experts; and, from the MLP module of an MoE block, its router (whose output is
    # (logits, weights of the chosen, indices of the chosen)), its routed experts (3-D tensors
    # gate_up_proj (E, ...), down_proj (E, ...)) and its shared experts, if any. A block whose
    # MLP has no router is dense (DeepSeek-V3's first blocks).
    moe: Callable[[PretrainedConfig], Moe | None] | None = None
    router: str = "gate"
    experts: str = "experts"
    shared_experts: str | None = None
    shared_expert_gate: str | None = None
    router_score_bias: str | None = None  # the router's choice-only bias (Moe.score_bias)
    # the gate, up and down projections (from the MLP module) of a mixture's dense SwiGLU
    # MLPs: its shared experts' and its dense blocks' (DeepSeek-V3's first; Qwen-MoE's
    # mlp_only_layers), where `graph --neurons` finds their neurons
    moe_dense_mlp: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    attn_sinks: str | None = None  # the attention module's learned sink logit per head (gpt-oss)
    # the config attribute giving the values per head that z and W_O see, where it is not
    # head_dim (DeepSeek-V3's latent attention: v_head_dim)
    head_dim_attr: str | None = None
    # values a head of Q and K, if not head_dim
    qk_head_dim: Callable[[PretrainedConfig], int] | None = None
    # values one block caches per token, where it is not K and V of every key/value head
    # (DeepSeek-V3's latent attention caches the K/V latent and the shared RoPE key)
    kv_cache_values: Callable[[PretrainedConfig], int] | None = None
    # the names llama.cpp gives this family's points, for `--engine llama.cpp`; None: unmapped
    llamacpp_names: LlamaCppNames | None = None
    # what transformers' GGUF loader leaves at its config's default though a GGUF file of this
    # family (its llama.cpp architectures) states it, or the architecture implies it: config
    # attribute -> the file's `{arch}.KEY` (a str), or the value itself (models/gguf_metadata.py
    # hands them to the loader)
    gguf_config: dict = field(default_factory=dict)
    # how fptrace reads a GGUF file of this family whose architecture transformers' GGUF loader
    # does not read (GGUFWeights); None: transformers' loader reads it, or nothing does
    gguf_weights: GGUFWeights | None = None

    def __post_init__(self) -> None:
        """The kinds as enums, from their words too (a family file may write either); a word
        that is no kind raises ValueError naming it."""
        for name, kind in (("norm_type", NormKind), ("mlp_type", MlpKind),
                           ("positions", PositionKind), ("qk_norm", QkNorm),
                           ("embed_scale", EmbedScale)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                object.__setattr__(self, name, kind(value))

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

    def softcap(self, config: PretrainedConfig, which: str) -> float | None:
        """The attention ("attn") or final ("final") logit softcap of this config, or None."""
        attr = self.attn_softcap_attr if which == "attn" else self.final_softcap_attr
        value = getattr(config, attr, None) if attr else None
        return float(value) if value else None

    def uses_parallel_residual(self, config: PretrainedConfig) -> bool:
        if self.parallel_residual_attr is not None:
            return bool(getattr(config, self.parallel_residual_attr, self.parallel_residual))
        return self.parallel_residual

    def differences(self, n_heads: int, n_kv_heads: int, config: PretrainedConfig) -> list[str]:
        """How this family differs from GPT-2's block, fact by fact (empty for GPT-2)."""
        out = []
        if self.positions is PositionKind.rope:
            out.append("no position embedding: RoPE rotates Q and K inside attention")
        if self.norm_type.is_rms:
            out.append("RMSNorm instead of LayerNorm (no mean subtraction, no bias)"
                       + ("; the scale is (1 + w)" if self.norm_type.one_plus else ""))
        if self.mlp_type is MlpKind.swiglu:
            out.append("SwiGLU MLP: down(SiLU(gate(x)) · up(x)), three matrices instead of two")
        if self.mlp_type is MlpKind.moe:
            moe = self.moe(config) if self.moe else None
            if moe:
                out.append(f"mixture of experts: a router sends each token to {moe.top_k} of "
                           f"{moe.n_experts} expert MLPs"
                           + (f", plus {moe.n_shared} shared" if moe.n_shared else ""))
        if self.mlp_type is MlpKind.geglu:
            out.append("GeGLU MLP: down(GELU(gate(x)) · up(x)), three matrices instead of two")
        if n_kv_heads != n_heads:
            out.append(f"grouped-query attention: {n_kv_heads} K/V heads shared by {n_heads} "
                       f"query heads ({n_heads // n_kv_heads} each), repeated to match Q")
        if self.embed_scale is EmbedScale.sqrt_d:
            out.append("the token embedding is multiplied by √d_model")
        if self.qk_norm:
            out.append("RMSNorm on Q and K before RoPE"
                       + (" (per head)" if self.qk_norm is QkNorm.per_head
                          else " (whole projection)"))
        if self.post_norms:
            out.append("attention and MLP outputs are normalised before the residual add")
        if self.softcap(config, "attn"):
            out.append(f"attention scores soft-capped at {self.softcap(config, 'attn'):g}")
        if self.softcap(config, "final"):
            out.append(f"final logits soft-capped at {self.softcap(config, 'final'):g}")
        return out


_REQUIRED = ("name", "title", "model_types", "blocks", "embed", "final_norm", "lm_head", "attn",
             "mlp", "norm_type", "mlp_type", "positions", "tiny")


def check_family(module_name: str, module: ModuleType) -> Family:
    """The FAMILY of a family module, or FamilyDefinitionError naming what is missing."""
    where = f"family module fptrace.families.{module_name}"
    fam = getattr(module, "FAMILY", None)
    if not isinstance(fam, Family):
        raise FamilyDefinitionError(f"{where} defines no FAMILY = Family(...)")
    missing = [f for f in _REQUIRED if not getattr(fam, f)]
    if missing:
        raise FamilyDefinitionError(f"{where} is incomplete: no {', '.join(missing)}")
    for value, what in ((fam.norm_type, "norm_type"), (fam.mlp_type, "mlp_type"),
                        (fam.positions, "positions")):
        if value.value == "unknown":  # only the generic family of an unregistered model type
            known = ", ".join(k.value for k in type(value) if k.value != "unknown")
            raise FamilyDefinitionError(f"{where}: {what} is 'unknown'; a registered family "
                                        f"states it ({known})")
    if fam.tiny.get("model_type") not in fam.model_types:
        raise FamilyDefinitionError(f"{where}: its tiny config has model_type "
                                    f"{fam.tiny.get('model_type')!r}, not one of the family's "
                                    + ", ".join(fam.model_types))
    if (fam.recompute_block is None) != (fam.recompute_final_norm is None):
        raise FamilyDefinitionError(f"{where}: a block recomputation needs both recompute_block "
                                    "and recompute_final_norm")
    if (fam.mlp_type is MlpKind.moe) != (fam.moe is not None):
        raise FamilyDefinitionError(f"{where}: mlp_type 'moe' and moe go together")
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
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ValueError as e:  # a kind that is no member of its enum (Family.__post_init__)
            raise FamilyDefinitionError(f"family module fptrace.families.{name}: {e}") from None
        fam = check_family(name, module)
        for t in fam.model_types:
            if t in seen:
                raise FamilyDefinitionError(f"model type {t!r} is claimed by both the "
                                            f"{seen[t]} and the {fam.name} family")
            seen[t] = fam.name
        out.append(fam)
    return tuple(out)




def family_for_gguf(arch: str, experts: bool = False) -> Family | None:
    """The family whose llama.cpp names were checked on GGUF architecture `arch`, or None.
    Where two families' files share the architecture (Llama's and Mixtral's `llama`), the one
    with a router when the file states an expert count (`experts`: llama.cpp's own rule for
    building routed experts), the one without otherwise."""
    found = [fam for fam in FAMILIES if fam.llamacpp_names is not None
             and arch in fam.llamacpp_names.archs]
    if len(found) > 1:
        found = [fam for fam in found if fam.llamacpp_names is not None
                 and (fam.llamacpp_names.routing is not None) == experts]
    return found[0] if found else None


def llamacpp_names_for(arch: str, experts: bool = False) -> LlamaCppNames | None:
    """The llama.cpp name map checked on GGUF architecture `arch` (with routed experts where
    the file states an expert count), or None."""
    fam = family_for_gguf(arch, experts)
    return None if fam is None else fam.llamacpp_names


def gguf_config_for(arch: str, experts: bool = False) -> dict:
    """The config values transformers' GGUF loader misses for GGUF architecture `arch` (the
    family whose llama.cpp names are checked on it), or {}."""
    fam = family_for_gguf(arch, experts)
    return {} if fam is None else fam.gguf_config


def gguf_weights_for(arch: str, experts: bool = False) -> GGUFWeights | None:
    """How fptrace itself reads a GGUF file of architecture `arch` (a family's gguf_weights),
    or None where it leaves the file to transformers' GGUF loader; `experts`: the file states
    an expert count (a `llama` file with experts is Mixtral's, which fptrace reads)."""
    return next((fam.gguf_weights for fam in FAMILIES if fam.gguf_weights is not None
                 and fam.gguf_weights.arch == arch
                 and fam.gguf_weights.experts in (None, experts)), None)


def family_for_config(config: PretrainedConfig) -> Family | None:
    """The registered family of a transformers config, or None."""
    return _BY_TYPE.get(str(getattr(config, "model_type", "")))


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
