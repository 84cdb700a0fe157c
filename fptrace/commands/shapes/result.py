"""The result of `fptrace shapes`."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, ShapeStep, Token, result

# 1.4: mixture-of-experts models: ShapeReport.moe (total and active parameters), and beside it the
# routing every trace of an MoE model carries (Trace.routing, ModelInfo.moe in results.py)
SCHEMA_SINCE = "1.4"


@result
class ParamGroup:
    """Parameters of one part of the model."""

    name: str
    """The parameter: `block: <path inside a block> (<what it is>)` for block 0's (× the number of
    blocks), else the part and `weight` or `bias`."""
    count: int
    """Parameters in one instance."""
    times: int
    """Instances (blocks) of it."""
    shape: tuple[int, ...] = ()
    """The tensor's shape (nn.Linear stores (out, in); GPT-2's Conv1D (in, out))."""
    part: str = ""
    """`embedding`, `block`, `final` (the final norm), `head` (the LM head) or `other`."""


@result
class CostReport:
    """Memory and compute figures at the report's batch and sequence length."""

    weights_bytes: dict
    """Bytes of all weights per precision (float32, bfloat16, float16, int8, 4-bit)."""
    kv_cache_per_token_bytes: int
    """KV-cache bytes per token, all layers."""
    kv_cache_bytes: int
    """KV-cache bytes at the report's batch and sequence length."""
    residual_per_layer_bytes: int
    """Bytes of one (B, T, d) residual stream."""
    logits_all_numbers: int
    """Numbers in the logits for every position."""
    logits_all_bytes: int
    """Their bytes."""
    logits_last_numbers: int
    """Numbers in the logits for the last position only."""
    logits_last_bytes: int
    """Their bytes."""
    tied_saving_params: int
    """Parameters saved by tying the LM head (0 if untied)."""
    flops_prefill: int
    """FLOPs of one forward pass over the whole sequence (2 per multiply-add, attention included)."""
    flops_decode_step: int
    """FLOPs of one decoding step with a KV cache at that length."""
    matmul_params: int
    """Parameters that take part in one token's matrix multiplies (of an MoE model's routed
    experts, only the chosen ones)."""


@result
class GpuPlan:
    """`shapes --gpu-memory`: how many GPUs of that memory the weights and the KV cache need, and
    the smallest tensor-parallel size that splits the model that far."""

    gpu_memory_bytes: int
    """Memory of one GPU (`--gpu-memory`)."""
    weights_bytes: int
    """The weights in the report's dtype."""
    kv_cache_bytes: int
    """The KV cache at the report's batch and sequence length."""
    needed_bytes: int
    """weights + KV cache (activations and framework overhead not counted)."""
    gpus_needed: int
    """ceil(needed / GPU memory)."""
    tp: int | None
    """The smallest tensor-parallel size of at least gpus_needed that divides both the attention and
    the key/value head counts; null when none does."""
    tp_note: str
    """The plan in words."""


@result
class BlockCount:
    """The parameters of one kind of block (most models have one kind; DeepSeek-V3 two: its
    dense first blocks and its MoE blocks)."""

    blocks: str
    """Which blocks: `blocks 0–31`, `block 0`."""
    count: int
    """How many blocks of this kind."""
    moe: bool
    """Whether their MLP is a mixture of experts."""
    total: int
    """Parameters in one block of this kind."""
    active: int
    """Of them, those one token's forward pass reads (the chosen experts only)."""


@result
class MoeCount:
    """A mixture-of-experts model's parameters: all of them, and those one token uses."""

    n_experts: int
    """Routed experts per MoE block."""
    top_k: int
    """Routed experts each token takes."""
    n_shared: int
    """Shared experts each token takes besides."""
    d_expert: int
    """Hidden width of one routed expert."""
    moe_blocks: int
    """How many blocks have a mixture of experts (the rest a dense MLP)."""
    total_params: int
    """All parameters (as n_params)."""
    active_params: int
    """Parameters one token's forward pass reads, the token embedding and LM head included."""
    active_params_no_embedding: int
    """The same without the token embedding table (a lookup, not a multiply), unless it is tied
    to the LM head."""
    blocks: tuple[BlockCount, ...]
    """Total and active parameters per kind of block."""
    active_weights_bytes: dict
    """Bytes of the active parameters per precision: what one decoding step of one token
    reads."""
    convention: str
    """What counts as active, in words."""


@result
class ShapeReport:
    """`fptrace shapes --json`: shapes, parameters, memory and FLOPs of a config, computed on the meta
    device without weights."""

    model: str
    """The `--model` alias, path or hub id."""
    family: str
    """The architecture family."""
    source: str
    """Where the config came from."""
    n_layers: int
    """Number of blocks."""
    d_model: int
    """Width of the residual stream."""
    n_heads: int
    """Query heads."""
    n_kv_heads: int
    """Key/value heads."""
    head_dim: int
    """Values per head."""
    d_mlp: int | None
    """Width of the MLP's hidden layer, or null when the config does not say."""
    vocab_size: int
    """Rows of the token embedding."""
    context_length: int | None
    """Longest sequence the positions allow, or null."""
    norm_type: str
    """The norm: layernorm, rmsnorm, or rmsnorm (1 + w) (RMSNorm scaled by 1 + γ, Gemma)."""
    mlp_type: str
    """The MLP: gelu (two matrices), swiglu or geglu (gated, three matrices), or moe (a router and
    routed experts, SwiGLU each, plus shared experts where the family has them)."""
    positions: str
    """Positions: learned (absolute embeddings) or rope (rotary, inside attention)."""
    tied_embeddings: bool
    """Whether the LM head is the token embedding matrix."""
    batch: int
    """Batch size the shapes and costs are for (`--batch`)."""
    seq_len: int
    """Sequence length the shapes and costs are for."""
    tokens: tuple[Token, ...]
    """The prompt's tokens, when a prompt was given."""
    tokenizer: str | None
    """The offline tokenizer used, or null."""
    steps: tuple[ShapeStep, ...]
    """Every step of the forward pass with its shape, inside block 0 in detail."""
    hidden_states: tuple
    """[count, shape] of the `output_hidden_states` tuple."""
    params: tuple[ParamGroup, ...]
    """Parameters per part; `count` × `times` summed over parts is `n_params`."""
    n_params: int
    """All parameters, counting tied tensors once."""
    cost: CostReport
    """Memory and FLOP figures."""
    dtype: str
    """Precision the activation figures are for (`--dtype`)."""
    differences: tuple[str, ...]
    """How this family differs from GPT-2."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers (random weights, truncation, ...)."""
    seconds: float
    """Time the report took."""
    plan: GpuPlan | None = None
    """With `--gpu-memory`: the GPU plan; else null."""
    moe: MoeCount | None = None
    """For a mixture-of-experts model: total and active parameters; else null."""
    kind: str = "shapes"
    schema_version: str = SCHEMA_VERSION
