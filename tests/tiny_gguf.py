"""A tiny GGUF of one family, written in the tests: a tiny random transformers model of the
family, its tensors under llama.cpp's names (the gguf package's name map, the one llama.cpp's
own converter uses), the metadata llama.cpp reads for that architecture, and the bundled
SmolLM2's tokenizer cut to its first VOCAB tokens (byte-level BPE: the merges whose two parts and
result are among them are kept, so the cut tokenizer is a whole one; every file parses the
tokenizer's arrays, at Python speed, so the cut makes a test's file ten times faster to read).

What llama.cpp's converter does to a family's weights besides renaming them is done here too,
each rule named by the family: Llama's W_Q and W_K permuted so each rotary pair sits side by
side (`rope_adjacent`), Gemma's norm weights stored with the 1 its RMSNorm adds (`norm_offset`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

VOCAB = 2048

# what the tiny files hold because llama.cpp or transformers' GGUF loader assumes it: every
# Gemma's tied head (its GGUF has no output tensor) and Gemma 2's query scale (llama.cpp's is
# 1/√head_dim; transformers reads no key for it and takes 256); Gemma 3's window pattern (6 in
# llama.cpp, whatever the config says) and no final softcap. What fptrace tells the loader from
# the file (Family.gguf_config) is left as the family's tiny config has it: Qwen3's 16-wide
# heads, Gemma 2's softcaps of 2 and 3, Qwen3-MoE's 32-wide experts and renormalised weights,
# Qwen2-MoE's 32- and 48-wide routed and shared experts, GPT-2's 64 positions.
CONFIG = {"gemma": {"tie_word_embeddings": True},
          "gemma2": {"head_dim": 256, "query_pre_attn_scalar": 256, "tie_word_embeddings": True},
          "gemma3": {"head_dim": 256, "query_pre_attn_scalar": 256, "tie_word_embeddings": True,
                     "final_logit_softcapping": None, "sliding_window_pattern": 6}}


def tiny_model(family: str, **overrides: Any) -> Any:
    """A tiny random float32 model of the family, its vocabulary VOCAB, its biases and norm
    weights away from their initial 0 and 1 (seeded: the same model each call)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from fptrace.families import FAMILIES

    cfg = dict(next(f for f in FAMILIES if f.name == family).tiny)
    config = AutoConfig.for_model(cfg.pop("model_type"), **{
        **cfg, "vocab_size": VOCAB, "tie_word_embeddings": False, **CONFIG.get(family, {}),
        **overrides})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():  # biases and norm weights away from their initial 0 and 1
        for name, p in model.named_buffers():  # DeepSeek's choice-only bias (0 at first):
            if name.endswith("e_score_correction_bias"):  # one that changes the choice
                p.normal_(0, 0.2)
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif "norm" in name or ".ln_" in name:  # GPT-2's LayerNorms are ln_1, ln_2, ln_f
                p.uniform_(0.5, 1.5)
            elif name.endswith("mlp.gate.weight"):  # a router whose choices are not ties;
                # DeepSeek's sigmoid scores kept off 0 and 1: where the chosen experts' scores
                # add up to less than 6.1e-5, llama.cpp renormalises by that floor instead
                # (transformers by their sum), which a router of std 1 at d 64 often reaches
                p.normal_(0, 0.3 if model.config.model_type == "deepseek_v3" else 1.0)
    return model


@functools.lru_cache(maxsize=2)
def tokenizer_fields(bundled: str) -> list[tuple[str, Any, Any]]:
    """(key, value type, value) of every tokenizer.* field of the bundled GGUF, its vocabulary
    cut to the first VOCAB tokens."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(bundled)
    out = []
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = f.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == GGUFValueType.STRING:
                value: Any = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                value = [f.parts[i].tolist()[0] for i in f.data]
            out.append((key, (kind, sub), value))
        elif kind == GGUFValueType.STRING:
            out.append((key, kind, bytes(f.parts[f.data[0]]).decode("utf-8")))
        else:
            out.append((key, kind, f.parts[f.data[0]].tolist()[0]))
    kept = set(next(v for k, _, v in out if k == "tokenizer.ggml.tokens")[:VOCAB])

    def cut(key: str, value: Any) -> Any:
        if key == "tokenizer.ggml.merges":
            return [m for m in value if all(p in kept for p in (*m.split(" ", 1),
                                                                 m.replace(" ", "", 1)))]
        return value[:VOCAB] if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                        "tokenizer.ggml.scores") else value

    return [(k, t, cut(k, v)) for k, t, v in out]


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's permutation of W_Q or W_K (rows: heads × head_dim), which puts
    each rotary pair's two rows side by side."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def write(model: Any, path: str, arch: str, bundled: str, *, rope_adjacent: bool = False,
          norm_offset: float = 0.0, extra: dict | None = None, name: str | None = None,
          rope_scaling: bool = True) -> None:
    """Write `model` (a transformers *ForCausalLM, float32, vocabulary VOCAB) to `path` as a
    GGUF of llama.cpp's architecture `arch` (named `name` in its general.name); rope_scaling:
    with the config's YaRN keys, where it has them (gpt-oss's)."""
    import gguf

    cfg = model.config
    n = int(cfg.num_hidden_layers)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[_arch_enum(arch)], n)
    w = gguf.GGUFWriter(path, arch)
    # not the architecture's name: llama.cpp's vocabulary loader looks Phi-3's special tokens
    # up by their text in a file whose general.name says "phi3" or "phi-3", and fails
    # (`_Map_base::at`) on a vocabulary without them, as the bundled SmolLM2's
    w.add_name(name or "fptrace tiny model")
    w.add_context_length(int(cfg.max_position_embeddings))
    w.add_embedding_length(int(cfg.hidden_size))
    w.add_block_count(n)
    w.add_feed_forward_length(int(getattr(cfg, "intermediate_size", None)
                                  or getattr(cfg, "n_inner", None) or 4 * cfg.hidden_size))
    w.add_head_count(int(cfg.num_attention_heads))
    latent = cfg.model_type == "deepseek_v3"
    if latent:  # as its converter: one latent K/V head, and the latent attention's sizes
        _deepseek2_keys(w, cfg)
    else:
        w.add_head_count_kv(int(getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)))
    if hasattr(cfg, "rms_norm_eps"):
        w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    else:  # LayerNorm (GPT-2's layer_norm_epsilon, GPT-NeoX's layer_norm_eps)
        w.add_layer_norm_eps(float(getattr(cfg, "layer_norm_epsilon", None)
                                   or cfg.layer_norm_eps))
    if cfg.model_type == "gpt_neox":  # as its converter: the rotated width, the residual
        hd = int(cfg.hidden_size) // int(cfg.num_attention_heads)
        w.add_rope_dimension_count(int(cfg.rope_parameters["partial_rotary_factor"] * hd))
        w.add_parallel_residual(bool(cfg.use_parallel_residual))
    if hasattr(cfg, "rope_theta") or hasattr(cfg, "rope_parameters"):  # not GPT-2's
        theta = getattr(cfg, "rope_theta", None) or \
            (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        w.add_rope_freq_base(float(theta))
        scaling = getattr(cfg, "rope_parameters", None) or {}
        if rope_scaling and scaling.get("rope_type") == "yarn":  # gpt-oss's, as its converter
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(float(scaling["factor"]))
            w.add_rope_scaling_orig_ctx_len(int(scaling.get(
                "original_max_position_embeddings", 4096)))
    head_dim = getattr(cfg, "head_dim", None)
    if head_dim and not latent:
        w.add_key_length(int(head_dim))
        w.add_value_length(int(head_dim))
    for key, add in (("attn_logit_softcapping", w.add_attn_logit_softcapping),
                     ("final_logit_softcapping", w.add_final_logit_softcapping),
                     ("sliding_window", w.add_sliding_window)):
        if getattr(cfg, key, None) is not None:
            add(getattr(cfg, key))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, value in (extra or {}).items():
        w.add_key_value(key, *value)
    for key, kind, value in tokenizer_fields(bundled):
        if isinstance(kind, tuple):
            w.add_key_value(key, value, kind[0], sub_type=kind[1])
        else:
            w.add_key_value(key, value, kind)
    nh = int(cfg.num_attention_heads)
    nkv = int(getattr(cfg, "num_key_value_heads", nh))
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) \
        or getattr(cfg, "n_routed_experts", None)
    if experts:
        w.add_expert_count(int(experts))
        w.add_expert_used_count(int(cfg.num_experts_per_tok))
        w.add_expert_feed_forward_length(int(getattr(cfg, "moe_intermediate_size", None)
                                             or cfg.intermediate_size))
        if getattr(cfg, "shared_expert_intermediate_size", None):
            w.add_expert_shared_feed_forward_length(int(cfg.shared_expert_intermediate_size))
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    conv1d = conv1d_weights(model)
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":  # llama.cpp reads the token embedding
            continue
        if latent and hf_name.endswith("kv_b_proj.weight"):
            _deepseek2_kv_b(w, hf_name, tensor.detach().float().numpy(), cfg)
            continue
        if cfg.model_type == "gpt_oss" and ".mlp.experts." in hf_name:
            _gpt_oss_experts(w, hf_name, tensor.detach().float().numpy())
            continue
        if hf_name.endswith("mlp.gate.e_score_correction_bias"):  # DeepSeek-V3's, as its
            # converter names it
            hf_name = hf_name.replace("e_score_correction_bias", "e_score_correction.bias")
        if hf_name.endswith("self_attn.sinks"):  # gpt-oss's converter names it .weight
            hf_name += ".weight"
        if hf_name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            # transformers keeps each block's experts stacked, W_gate above W_up; llama.cpp
            # too, in three tensors
            block = hf_name.split(".")[2]
            data = tensor.detach().float().numpy().copy()
            if hf_name.endswith("gate_up_proj"):
                half = data.shape[1] // 2
                w.add_tensor(f"blk.{block}.ffn_gate_exps.weight", data[:, :half].copy())
                w.add_tensor(f"blk.{block}.ffn_up_exps.weight", data[:, half:].copy())
            else:
                w.add_tensor(f"blk.{block}.ffn_down_exps.weight", data)
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"no llama.cpp name for {hf_name} in {arch}")
        data = tensor.detach().float().numpy().copy()
        if hf_name in conv1d:  # GPT-2's Conv1D stores (in, out); GGUF, as nn.Linear, (out, in)
            data = data.T.copy()
        if hf_name.endswith(("query_key_value.weight", "query_key_value.bias")):
            # GPT-NeoX keeps its fused projection head by head ([q|k|v] of head 0, then head
            # 1, ...); its converter writes it [Q; K; V], as llama.cpp's graph cuts it
            data = data.reshape(nh, 3, -1, *data.shape[1:]).swapaxes(0, 1) \
                .reshape(data.shape).copy()
        if rope_adjacent and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            data = permute(data, nh)
        elif rope_adjacent and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            data = permute(data, nkv)
        if hf_name.endswith("shared_expert_gate.weight"):  # Qwen2-MoE's (1, d): a vector in GGUF
            data = data.reshape(-1)
        if norm_offset and "norm" in hf_name:
            data = data + np.float32(norm_offset)
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _deepseek2_keys(w: Any, cfg: Any) -> None:
    """DeepSeek-V3's keys as llama.cpp's deepseek2 converter writes them: one K/V head (the
    latent is shared), its key (latent + rotated part) and value (latent) widths, and each
    head's own (no-position + rotated part, value) under the _mla keys; the dense lead blocks,
    the experts' gating (sigmoid, their bias exp_probs_b), groups, scale and renormalisation."""
    import gguf

    rope, nope = int(cfg.qk_rope_head_dim), int(cfg.qk_nope_head_dim)
    w.add_head_count_kv(1)
    w.add_key_length(int(cfg.kv_lora_rank) + rope)
    w.add_value_length(int(cfg.kv_lora_rank))
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(int(cfg.v_head_dim))
    w.add_rope_dimension_count(rope)
    w.add_q_lora_rank(int(cfg.q_lora_rank))
    w.add_kv_lora_rank(int(cfg.kv_lora_rank))
    w.add_leading_dense_block_count(int(cfg.first_k_dense_replace))
    w.add_expert_shared_count(int(cfg.n_shared_experts))
    w.add_expert_weights_scale(float(cfg.routed_scaling_factor))
    w.add_expert_weights_norm(bool(cfg.norm_topk_prob))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_group_count(int(cfg.n_group))
    w.add_expert_group_used_count(int(cfg.topk_group))
    scaling = getattr(cfg, "rope_parameters", None) or {}
    if scaling.get("rope_type") == "yarn":  # YaRN's attention scale: 0.1 · mscale_all_dim
        w.add_rope_scaling_yarn_log_mul(0.1 * float(scaling.get("mscale_all_dim") or 0.0))


def _deepseek2_kv_b(w: Any, hf_name: str, data: np.ndarray, cfg: Any) -> None:
    """DeepSeek's kv_b_proj (heads × (no-position key + value) rows, latent columns) as its
    converter writes it for llama.cpp's latent attention: attn_k_b (heads, latent, no-position
    key), each head's key part transposed, and attn_v_b (heads, value, latent)."""
    block = hf_name.split(".")[2]
    nope = int(cfg.qk_nope_head_dim)
    kv_b = data.reshape(int(cfg.num_attention_heads), -1, data.shape[-1])
    w.add_tensor(f"blk.{block}.attn_k_b.weight", kv_b[:, :nope].swapaxes(1, 2).copy())
    w.add_tensor(f"blk.{block}.attn_v_b.weight", kv_b[:, nope:].copy())


def _gpt_oss_experts(w: Any, hf_name: str, data: np.ndarray) -> None:
    """gpt-oss's experts as its converter writes them: transformers keeps gate_up_proj (E, d,
    2·I) with gate and up interleaved (gate the even columns) and down_proj (E, I, d), each
    with a bias; llama.cpp's ffn_gate_exps, ffn_up_exps (E, I, d), ffn_down_exps (E, d, I)
    and their biases."""
    block = hf_name.split(".")[2]
    if hf_name.endswith("gate_up_proj_bias"):
        w.add_tensor(f"blk.{block}.ffn_gate_exps.bias", data[..., ::2].copy())
        w.add_tensor(f"blk.{block}.ffn_up_exps.bias", data[..., 1::2].copy())
    elif hf_name.endswith("gate_up_proj"):
        t = data.transpose(0, 2, 1)
        w.add_tensor(f"blk.{block}.ffn_gate_exps.weight", t[:, ::2, :].copy())
        w.add_tensor(f"blk.{block}.ffn_up_exps.weight", t[:, 1::2, :].copy())
    elif hf_name.endswith("down_proj_bias"):
        w.add_tensor(f"blk.{block}.ffn_down_exps.bias", data.copy())
    elif hf_name.endswith("down_proj"):
        w.add_tensor(f"blk.{block}.ffn_down_exps.weight", data.transpose(0, 2, 1).copy())
    else:
        raise ValueError(f"no llama.cpp name for {hf_name} in gpt-oss")


def conv1d_weights(model: Any) -> set[str]:
    """The state-dict names of the weights of transformers' Conv1D modules (GPT-2's linear
    layers), which llama.cpp's converter transposes."""
    from transformers.pytorch_utils import Conv1D

    return {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, Conv1D)}


def _arch_enum(arch: str) -> str:
    """The MODEL_ARCH member of a GGUF architecture name."""
    import gguf

    for member, name in gguf.MODEL_ARCH_NAMES.items():
        if name == arch:
            return member.name
    raise ValueError(f"gguf knows no architecture {arch!r}")


def scaled(path: str, out: str, tensor: str, factor: float) -> str:
    """A copy of the GGUF at `path` with one float32 tensor scaled where it lies (a seeded
    fault)."""
    import shutil

    from gguf import GGUFReader

    shutil.copyfile(path, out)
    reader = GGUFReader(out, "r+")
    t = next(t for t in reader.tensors if t.name == tensor)
    t.data[...] = (np.asarray(t.data) * np.float32(factor)).astype(t.data.dtype)
    reader.data.flush()
    del reader
    return out


def emulated_q4_1(model: Any, tmp_path: Any, arch: str, bundled: str, prompt: str,
                  **write_options: Any) -> tuple[Any, Any]:
    """A Q4_1 file of `model` (ggml's own quantizer) diffed against llama.cpp with every step
    of --emulate on: (the file loaded by fptrace, the emulation's report)."""
    import gguf as G

    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine
    from fptrace.engines.llamacpp.emulate import STEPS
    from fptrace.engines.llamacpp.quantize import one_type, requantize
    from fptrace.models.loading import load_model

    f32, q41 = str(tmp_path / "f32.gguf"), str(tmp_path / "q4_1.gguf")
    write(model, f32, arch, bundled, **write_options)
    types = requantize(f32, q41, one_type("Q4_1"), G.LlamaFileType.MOSTLY_Q4_1, "Q4_1")
    assert types["blk.0.attn_output.weight"] == "Q4_1"
    if any(name.endswith("_exps.weight") for name in types):
        assert types["blk.0.ffn_down_exps.weight"] == "Q4_1"
        assert types["blk.0.ffn_gate_inp.weight"] == "F32"  # llama.cpp keeps routers in f32
    lm = load_model(q41, device="cpu")
    em = engine_diff(lm, engine("llama.cpp"), q41, prompt, emulate=tuple(STEPS)).emulation
    assert [r.label for r in em.rungs] == ["off"] + [f"+{s}" for s in STEPS]
    return lm, em


def assert_emulation_closes_the_gap(lm: Any, em: Any) -> None:
    """Every step on: one of the two blocks, fed llama.cpp's own input, gives llama.cpp's
    numbers to float32's summation order, both are far closer than with no step, and act-q8
    alone already closes part of the gap."""
    off, q8, full = em.rungs[0], next(r for r in em.rungs if r.label == "+act-q8"), em.rungs[-1]
    assert len(full.alone) == len(lm.parts.blocks) == 2
    exact = min(full.alone)
    assert exact < 1e-5 and exact * 1000 < min(off.alone), (full.alone, off.alone)
    assert all(a * 4 < b for a, b in zip(full.alone, off.alone, strict=True)), \
        (full.alone, off.alone)
    assert full.worst < off.worst and full.median < off.median, (full.rel, off.rel)
    assert q8.alone_median * 2 < off.alone_median, (q8.alone, off.alone)

