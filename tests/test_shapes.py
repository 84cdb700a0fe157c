"""`fptrace shapes`: shapes recorded on the meta device, exact parameter counts, costs."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_CONFIGS
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.shapes.core import shape_report
from fptrace.models.registry import known_models

runner = CliRunner()


def step(report, label):
    found = [s.shape for s in report.steps if s.label.startswith(label)]
    assert found, f"no step {label!r} in {[s.label for s in report.steps]}"
    return found[0]


def test_llama_8b_prompt():
    r = shape_report("llama-3.1-8b", "The capital of France is")
    assert [t.id for t in r.tokens] == [128000, 791, 6864, 315, 9822, 374]
    assert step(r, "input_ids") == (1, 6)
    assert step(r, "LM head W_U (128256, 4096) → logits at every") == (1, 6, 128256)
    assert step(r, "last position only") == (1, 1, 4096)
    assert r.hidden_states == (33, (1, 6, 4096))
    assert step(r, "Q split into heads") == (1, 32, 6, 128)
    assert step(r, "K split into heads") == (1, 8, 6, 128)
    assert step(r, "K, V repeated") == (1, 32, 6, 128)
    assert step(r, "scores") == (1, 32, 6, 6)
    assert step(r, "act(gate) · up") == (1, 6, 14336)
    assert r.n_params == 8_030_261_248
    assert len(r.differences) == 4


def test_gpt2_the_cat_sat():
    r = shape_report("gpt2", "The cat sat")
    assert [t.id for t in r.tokens] == [464, 3797, 3332]
    for who in "QKV":
        assert step(r, f"{who} split into heads") == (1, 12, 3, 64)
    assert step(r, "scores") == (1, 12, 3, 3)
    assert step(r, "softmax") == (1, 12, 3, 3)
    assert step(r, "MLP up") == (1, 3, 3072)
    assert step(r, "LM head W_U (50257, 768) → logits at every") == (1, 3, 50257)
    assert step(r, "+ position embedding") == (1, 3, 768)
    assert r.n_params == 124_439_808
    assert r.tied_embeddings and r.cost.tied_saving_params == 50257 * 768
    assert r.differences == ()


# published totals, independent of fptrace's own counting
PUBLISHED = {"gpt2": 124_439_808, "llama-3.1-8b": 8_030_261_248, "smollm2-135m": 134_515_008,
             "qwen2.5-0.5b": 494_032_768, "mistral-7b": 7_241_732_096,
             "llama-3.2-1b": 1_235_814_400}


@pytest.mark.parametrize("alias", sorted(known_models()))
def test_param_total_matches_meta_model(alias):
    from transformers import AutoModelForCausalLM

    from fptrace.models.sources import config_from_dict

    r = shape_report(alias, seq_len=4)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config_from_dict(known_models()[alias].config))
    assert r.n_params == sum(p.numel() for p in model.parameters())
    assert sum(g.count * g.times for g in r.params) == r.n_params
    if alias in PUBLISHED:
        assert r.n_params == PUBLISHED[alias]


def test_logits_all_positions_vs_last():
    r = shape_report("llama-3.1-8b", seq_len=3000)
    assert r.cost.logits_all_numbers == 384_768_000
    assert r.cost.logits_all_bytes == 384_768_000 * 4
    assert r.cost.logits_last_numbers == 128_256
    assert r.cost.kv_cache_per_token_bytes == 2 * 32 * 8 * 128 * 4


def test_cli_shapes_json_and_table():
    res = runner.invoke(app, ["shapes", "--model", "gpt2", "The cat sat", "--json"])
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["kind"] == "shapes" and data["n_params"] == 124_439_808
    table = runner.invoke(app, ["shapes", "--model", "gpt2", "The cat sat"])
    assert "124,439,808" in table.stdout and "(1, 12, 3, 3)" in table.stdout


def test_cli_shapes_bad_input():
    for args in (["--model", "gpt-3"], ["--seq-len", "0"], ["--seq-len", "-3"],
                 ["--dtype", "float8"], ["--model", "mistral-7b", "some prompt"]):
        res = runner.invoke(app, ["shapes", *args])
        assert res.exit_code != 0, args
        assert res.stderr.strip().startswith("fptrace: error: "), res.stderr
        assert len(res.stderr.strip().splitlines()) == 1


def test_cli_seq_len_beyond_context_warns():
    res = runner.invoke(app, ["shapes", "--model", "gpt2", "--seq-len", "2000", "--json"])
    assert res.exit_code == 0
    assert "beyond the context window" in res.stderr
    assert json.loads(res.stdout)["seq_len"] == 2000


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_every_family_shapes(tmp_path, name):
    """shapes on the meta device for every family's tiny config: the parameter groups add up to
    the model's own count, and the block's steps are named through the family's labels."""
    import torch

    cfg = dict(TINY_CONFIGS[name])
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config.save_pretrained(tmp_path)
    r = shape_report(str(tmp_path), seq_len=5)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert r.n_params == sum(p.numel() for p in model.parameters())
    labels = [s.label for s in r.steps]
    assert any(l.startswith("attention output") for l in labels)
    assert any(l.startswith("MLP output") for l in labels)
    assert r.steps[-1].shape == (1, 1, config.vocab_size)
    if getattr(config, "final_logit_softcapping", None):
        assert any("final logits soft-capped" in d for d in r.differences)
    # a gated MLP (SwiGLU and GeGLU alike: gemma's GELU gate was once missed) shows its product
    from fptrace.families.parts import resolve_parts

    mlp = resolve_parts(model).mlps[0]
    gated = any(hasattr(mlp, n) for n in ("gate_proj", "gate_up_proj"))
    assert any(l.startswith("act(gate) · up") for l in labels) == gated, (name, labels)
