"""GPT-NeoX (Pythia): LayerNorm, per-head fused QKV, partial rotary, parallel residual by
default (attention and MLP both read the block's input)."""

from . import Family

FAMILY = Family(
    name="gpt_neox", title="GPT-NeoX", model_types=("gpt_neox",),
    blocks="gpt_neox.layers", embed="gpt_neox.embed_in",
    final_norm="gpt_neox.final_layer_norm", lm_head="lm_head", attn="attention", mlp="mlp",
    norm_type="layernorm", mlp_type="gelu", positions="rope", walkthrough="gpt_neox",
    parallel_residual=True, parallel_residual_attr="use_parallel_residual",
    w_o=("dense",),
    labels={"input_layernorm": "norm before attention",
            "post_attention_layernorm": "norm before the MLP",
            "query_key_value": "fused QKV projection", "dense_h_to_4h": "MLP up",
            "dense_4h_to_h": "MLP down"},
)
