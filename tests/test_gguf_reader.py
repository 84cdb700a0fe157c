"""fptrace's own GGUF reader (fptrace/models/gguf_reader.py), for the architectures transformers'
GGUF loader does not read: its fixes undo what llama.cpp's converter does to a weight, and a
file with a tensor missing, one too many, or a key the reader does not read is refused in one
line. Each family's tiny file read back into the original model, weight for weight, and run in
llama.cpp through the engine is in tests/test_llamacpp_families.py (one table with the families
transformers reads)."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_gguf import tiny_model
from typer.testing import CliRunner

from fptrace.cli.main import app

pytestmark = [pytest.mark.slow]

PROMPT = "The capital of France is"


def one_line_refusal(r, *needles: str) -> str:
    assert r.exit_code == 2, (r.exit_code, r.stderr[-800:])
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("fptrace: error: ")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-800:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_each_fix_undoes_what_the_converter_does():
    """The reader's fixes are the inverses of what tests/tiny_gguf.py does as llama.cpp's
    converter: Llama's W_Q/W_K row permutation (by the heads it is made with), GPT-NeoX's fused
    QKV written [Q; K; V], gpt-oss's interleaved gate and up written as two tensors (the
    weights transposed), DeepSeek's kv_b_proj split into attn_k_b (each head's key part
    transposed) and attn_v_b; and none is the identity."""
    from tiny_gguf import permute

    from fptrace.models.gguf_reader import (
        interleaved,
        latent_kv_joined,
        qkv_by_head,
        rope_adjacent_undone,
    )

    rng = np.random.default_rng(0)
    for heads, rows in ((4, 64), (2, 32)):
        w = rng.standard_normal((rows, 24)).astype(np.float32)
        assert not np.array_equal(permute(w, heads), w)
        assert np.array_equal(rope_adjacent_undone(permute(w, heads), heads), w)
    heads, hd = 4, 8
    by_head = rng.standard_normal((3 * heads * hd, 16)).astype(np.float32)
    # the converter's order: every head's q, then every head's k, then every head's v
    stacked = by_head.reshape(heads, 3, hd, 16).swapaxes(0, 1).reshape(by_head.shape)
    assert not np.array_equal(stacked, by_head)
    assert np.array_equal(qkv_by_head(stacked, heads), by_head)
    bias = by_head[:, 0].copy()
    assert np.array_equal(qkv_by_head(stacked[:, 0].copy(), heads), bias)
    # gpt-oss's experts: gate_up_proj (E, d, 2·I), gate the even columns; the file holds
    # ffn_gate_exps and ffn_up_exps (E, I, d) each, their biases (E, I) each
    gate_up = rng.standard_normal((3, 16, 10)).astype(np.float32)
    t = gate_up.transpose(0, 2, 1)
    stored = np.concatenate((t[:, ::2], t[:, 1::2]), axis=-2)  # as the reader stacks the two
    assert np.array_equal(interleaved(stored, True), gate_up)
    assert not np.array_equal(stored.swapaxes(-1, -2), gate_up)  # transposed alone is not it
    b = gate_up[:, 0]
    assert np.array_equal(interleaved(np.concatenate((b[:, ::2], b[:, 1::2]), axis=-2), False), b)
    # DeepSeek's kv_b_proj: heads × (key 6 + value 4) rows, a latent of 5 columns
    kv_b = rng.standard_normal((3 * 10, 5)).astype(np.float32)
    per_head = kv_b.reshape(3, 10, 5)
    k_b, v_b = per_head[:, :6].swapaxes(1, 2), per_head[:, 6:]
    assert np.array_equal(latent_kv_joined(k_b, v_b), kv_b)
    assert not np.array_equal(np.concatenate((k_b.reshape(3, 6, 5), v_b), axis=1).reshape(30, 5),
                              kv_b)  # the key part left as stored is not it


@pytest.mark.parametrize("arch", ["olmo2", "gptneox", "olmoe", "deepseek2", "gemma"])
def test_transformers_still_reads_none_of_them(arch):
    """The reader exists because transformers' GGUF loader does not list these architectures
    (gpt-oss it lists but cannot load: tests/test_llamacpp_families.py); when it does, check it
    against the reader (and drop the reader's family where it reads as well)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    assert arch not in GGUF_SUPPORTED_ARCHITECTURES


def without(model, gone: str):
    """The model as tiny_gguf.write reads it, less one weight."""
    from types import SimpleNamespace

    kept = {k: v for k, v in model.state_dict().items() if k != gone}
    return SimpleNamespace(config=model.config, state_dict=lambda: kept,
                           named_modules=model.named_modules)


@pytest.mark.parametrize("family,arch,gone,tensor", [
    ("olmo2", "olmo2", "model.layers.1.self_attn.k_norm.weight", "blk.1.attn_k_norm.weight"),
    ("gpt_neox", "gptneox", "gpt_neox.layers.0.attention.query_key_value.bias",
     "blk.0.attn_qkv.bias"),
    ("gpt_oss", "gpt-oss", "model.layers.1.self_attn.sinks", "blk.1.attn_sinks.weight"),
    ("deepseek_v3", "deepseek2", "model.layers.2.mlp.gate.e_score_correction_bias",
     "blk.2.exp_probs_b.bias"),
    # a `llama` file stating experts is Mixtral's: without a router it is refused, not read
    # as a Llama
    ("mixtral", "llama", "model.layers.1.mlp.gate.weight", "blk.1.ffn_gate_inp.weight")])
def test_a_file_missing_a_tensor_is_one_line(family, arch, gone, tensor, tmp_path, gguf,
                                             own_cache):
    from tiny_gguf import write

    path = str(tmp_path / f"no-{tensor}.gguf")
    write(without(tiny_model(family), gone), path, arch, gguf)
    r = CliRunner().invoke(app, ["run", PROMPT, "-m", path])
    one_line_refusal(r, "1 of the", f"{gone} ({tensor})", "no tensor", "random value")


@pytest.mark.parametrize("family,arch,key,value,shown", [
    ("olmo2", "olmo2", "attention.sliding_window", 4, "(4)"),
    ("deepseek_v3", "deepseek2", "rope.scaling.yarn_attn_factor", 0.5, "(0.5)")])
def test_a_key_the_reader_does_not_read_is_one_line(family, arch, key, value, shown, tmp_path,
                                                   gguf, own_cache):
    """An olmo2 file with a sliding window (OLMo 3's) is refused, not read as OLMo 2 without
    one; a deepseek2 file with a YaRN attention factor of its own (llama.cpp's override, which
    transformers' YaRN has no place for) likewise."""
    from gguf import GGUFValueType
    from tiny_gguf import write

    path = str(tmp_path / "unread.gguf")
    kind = GGUFValueType.FLOAT32 if isinstance(value, float) else GGUFValueType.UINT32
    write(tiny_model(family), path, arch, gguf, extra={f"{arch}.{key}": (value, kind)})
    r = CliRunner().invoke(app, ["run", PROMPT, "-m", path])
    one_line_refusal(r, f"{arch}.{key} {shown}", "does not read")


def test_a_tensor_no_weight_takes_is_one_line(tmp_path, gguf, own_cache):
    """A tensor the family's model has no weight for (an OLMo 2 file with a bias its
    attention has none of) is refused, not dropped."""
    import torch
    from tiny_gguf import write

    model = tiny_model("olmo2")
    state = dict(model.state_dict())
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    path = str(tmp_path / "extra.gguf")
    from types import SimpleNamespace

    write(SimpleNamespace(config=model.config, state_dict=lambda: state,
                          named_modules=model.named_modules), path, "olmo2", gguf)
    r = CliRunner().invoke(app, ["run", PROMPT, "-m", path])
    one_line_refusal(r, "1 of its tensors are no weight", "blk.0.attn_q.bias")
