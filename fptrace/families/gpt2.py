"""GPT-2: learned absolute positions, LayerNorm, fused QKV (Conv1D), GELU MLP."""

from . import Family

FAMILY = Family(
    name="gpt2", title="GPT-2", model_types=("gpt2",),
    blocks="transformer.h", embed="transformer.wte", pos_embed="transformer.wpe",
    final_norm="transformer.ln_f", lm_head="lm_head", attn="attn", mlp="mlp",
    norm_type="layernorm", mlp_type="gelu", positions="learned", walkthrough="gpt2",
    w_o=("c_proj",),
    labels={"ln_1": "norm before attention", "ln_2": "norm before the MLP",
            "c_attn": "fused QKV projection", "c_fc": "MLP up", "c_proj": "MLP down"},
    d_mlp=lambda config: getattr(config, "n_inner", None) or 4 * config.n_embd,
)
