"""Llama (and SmolLM): RMSNorm, RoPE, grouped-query attention, SwiGLU MLP."""

from . import Family

# the names every Llama-like block uses (Mistral, Qwen2/3, Phi-3, Gemma, OLMo 2 share them)
LLAMA_LABELS = {"input_layernorm": "norm before attention",
                "post_attention_layernorm": "norm before the MLP"}

FAMILY = Family(
    name="llama", title="Llama", model_types=("llama",),
    blocks="model.layers", embed="model.embed_tokens", final_norm="model.norm",
    lm_head="lm_head", attn="self_attn", mlp="mlp",
    norm_type="rmsnorm", mlp_type="swiglu", positions="rope", walkthrough="llama",
    labels=LLAMA_LABELS,
)
