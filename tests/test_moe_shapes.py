"""`fptrace shapes` on mixture-of-experts configs: it runs in float32 on the meta device, and its
total and active parameters agree with the model cards and with counts made here from the
config alone (never from fptrace's own figures)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import TINY_CONFIGS
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.shapes.core import shape_report
from fptrace.models.registry import known_models

runner = CliRunner()


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "deepseek_v3",
                                  "gpt_oss"])
def test_float32_moe_folder(tmp_path, name):
    """The tiny configs' folders in float32: shapes used to exit 70 ("Expected inputs of BF16
    type", transformers' grouped_mm experts on the meta device)."""
    from transformers import AutoConfig

    cfg = dict(TINY_CONFIGS[name])
    AutoConfig.for_model(cfg.pop("model_type"), **cfg).save_pretrained(tmp_path)
    res = runner.invoke(app, ["shapes", "--model", str(tmp_path), "--seq-len", "5", "--json"])
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["moe"]["n_experts"] > 1 and data["moe"]["top_k"] >= 1
    assert data["moe"]["active_params"] < data["n_params"]


def _mixtral_by_hand(c: dict) -> tuple[int, int, int]:
    """Total, active (embeddings and LM head included) and per-token matmul parameters of a
    Mixtral config, from its numbers alone."""
    d, L, V, I, E, k = (c[x] for x in ("hidden_size", "num_hidden_layers", "vocab_size",
                                        "intermediate_size", "num_local_experts",
                                        "num_experts_per_tok"))
    hd = d // c["num_attention_heads"]
    attn = d * c["num_attention_heads"] * hd * 2 + d * c["num_key_value_heads"] * hd * 2
    expert = 3 * d * I
    router = E * d
    norms = 2 * d
    total = L * (attn + router + norms + E * expert) + 2 * V * d + d
    active = L * (attn + router + norms + k * expert) + 2 * V * d + d
    matmul = L * (attn + router + k * expert) + V * d
    return total, active, matmul


def test_mixtral_8x7b_exact():
    """46,702,792,704 total and 12,879,925,248 active (embeddings counted, as Mixtral's card
    does); the FLOPs count the two chosen experts: the matmul parameters are ~8.7× what the
    attention, router and LM head alone make (the figure shapes used to report)."""
    r = shape_report("mixtral-8x7b", seq_len=8, dtype="bfloat16")
    total, active, matmul = _mixtral_by_hand(known_models()["mixtral-8x7b"].config)
    assert r.n_params == total == 46_702_792_704
    assert r.moe.total_params == total
    assert r.moe.active_params == active == 12_879_925_248
    assert r.cost.matmul_params == matmul
    assert r.cost.matmul_params / 1.47e9 > 8.5
    assert r.cost.flops_decode_step == 2 * matmul + 2 * 2 * 32 * 8 * 32 * 128
    (blocks,) = r.moe.blocks
    assert blocks.count == 32 and blocks.moe
    assert blocks.total * 32 + 2 * 32000 * 4096 + 4096 == total
    assert r.d_mlp == 14336 and r.moe.d_expert == 14336
    assert r.moe.active_weights_bytes["bfloat16"] == 2 * active


def _agrees(value: int, card: str) -> bool:
    """The card's figure ("46.7B") is the value rounded, or cut, to the card's digits."""
    digits = len(card[:-1].split(".")[1]) if "." in card else 0
    x = value / 1e9
    want = float(card[:-1])
    return round(x, digits) == want or math.floor(x * 10 ** digits) / 10 ** digits == want


# (alias, total on the card, active on the card, which active figure the card gives)
CARDS = [("mixtral-8x7b", "46.7B", "12.9B", "with embeddings"),
         ("qwen3-30b-a3b", "30.5B", "3.3B", "with embeddings"),
         ("olmoe-1b-7b", "6.9B", "1.3B", "with embeddings"),
         ("deepseek-v3", "671B", "37B", "without the token embedding"),
         ("gpt-oss-120b", "117B", "5.1B", "without the token embedding")]


@pytest.mark.parametrize("alias,total,active,convention", CARDS, ids=[c[0] for c in CARDS])
def test_model_cards(alias, total, active, convention):
    """DeepSeek-V3's card counts 36.6B active "including the output head" and gpt-oss's 5.13B
    leaves the embedding lookup out: the figure without the token embedding is theirs."""
    r = shape_report(alias, seq_len=4, dtype="bfloat16")
    m = r.moe
    assert _agrees(r.n_params, total), (r.n_params, total)
    got = m.active_params if convention == "with embeddings" else m.active_params_no_embedding
    assert _agrees(got, active), (got, active)
    assert sum(b.total * b.count for b in m.blocks) < r.n_params
    assert m.active_params - m.active_params_no_embedding == r.vocab_size * r.d_model


def test_deepseek_v3_dense_and_moe_blocks():
    """Its first three blocks are dense: two kinds of block, each counted on its own."""
    r = shape_report("deepseek-v3", seq_len=4)
    dense, moe = r.moe.blocks
    assert (dense.count, dense.moe, moe.count, moe.moe) == (3, False, 58, True)
    assert dense.active == dense.total
    d, I, Ie, E = 7168, 18432, 2048, 256
    assert dense.total - moe.total == 3 * d * I - (E * 3 * d * Ie + E * d + 3 * d * Ie)
    assert moe.total - moe.active == (E - 8) * 3 * d * Ie
    assert r.moe.moe_blocks == 58 and r.moe.n_shared == 1
    assert sum(g.count * g.times for g in r.params) == r.n_params == 671_026_404_352


def test_moe_view_and_dense_view():
    import io

    from rich.console import Console

    from fptrace.commands.shapes.render import shape_view

    def text(r):
        buf = io.StringIO()
        Console(file=buf, width=120, color_system=None).print(shape_view(r, 120))
        return buf.getvalue()

    moe = text(shape_report("mixtral-8x7b", seq_len=4))
    assert "Mixture of experts: 8 experts, 2 active, d_expert 14336" in moe
    assert "12,879,925,248" in moe and "46,702,792,704" in moe
    assert "Mixture of experts" not in text(shape_report("mistral-7b", seq_len=4))


def test_geglu_gated_mlp_step():
    """Gemma's GeGLU MLP is gated too: its act(gate) · up step is shown like SwiGLU's."""
    r = shape_report("gpt2", seq_len=3)  # warm import
    import tempfile

    from transformers import AutoConfig

    cfg = dict(TINY_CONFIGS["gemma"])
    with tempfile.TemporaryDirectory() as tmp:
        AutoConfig.for_model(cfg.pop("model_type"), **cfg).save_pretrained(tmp)
        r = shape_report(tmp, seq_len=5)
    found = [s.shape for s in r.steps if s.label == "act(gate) · up"]
    assert found == [(1, 5, TINY_CONFIGS["gemma"]["intermediate_size"])]


def test_deepseek_v3_kv_cache_is_the_latent():
    """MLA caches 512 latent values and a 64-value RoPE key per block and token (what
    transformers' cache holds), not K and V of 128 heads."""
    r = shape_report("deepseek-v3", seq_len=4, dtype="bfloat16")
    assert r.cost.kv_cache_per_token_bytes == 61 * (512 + 64) * 2  # bfloat16


def test_deepseek_v3_cache_matches_the_model():
    """The tiny config's own cache after a forward pass holds what shapes counts."""
    import torch
    from conftest import build_tiny

    from fptrace.families.deepseek_v3 import kv_cache_values

    model = build_tiny("deepseek_v3")
    with torch.no_grad():
        out = model(torch.tensor([[1, 2, 3]]), use_cache=True)
    cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
    layer = cache.layers[0]
    per_token = sum(t.shape[1] * t.shape[-1] for t in (layer.keys, layer.values))
    assert per_token == kv_cache_values(model.config)


def test_deepseek_v3_attention_flops_use_its_head_widths():
    """Q·Kᵀ runs over 192 values a head (128 + 64), weights·V over 128: the decode step's
    attention part is 2 · 128 heads · (192 + 128) per cached position and block."""
    r = shape_report("deepseek-v3", seq_len=100, dtype="bfloat16")
    attn = r.cost.flops_decode_step - 2 * r.cost.matmul_params
    assert attn == 61 * 100 * 2 * 128 * (192 + 128)
