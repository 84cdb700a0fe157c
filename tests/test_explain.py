"""explain: the straight-line recomputation equals the model, block by block, and says so
loudly when it does not."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import TINY_CONFIGS, build_tiny, registered, tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.explain.core import explain
from fptrace.errors import BadInput, UnsupportedModel
from fptrace.families.ops import Steps
from fptrace.models.loading import wrap_model

# every tiny config whose family (from the registry) has a block recomputation
EXPLAINED = sorted(name for name, cfg in TINY_CONFIGS.items()
                   if (f := registered(cfg["model_type"])) is not None and f.recompute_block)
IDS = [5, 17, 42, 7, 9, 311]
runner = CliRunner()


@pytest.fixture(scope="module", params=EXPLAINED)
def tiny_lm(request):
    return wrap_model(build_tiny(request.param), name=f"tiny-{request.param}",
                      random_weights=True)


def test_block_equals_hidden_states(tiny_lm):
    """Independent of explain's own hooks: block k of the family module maps
    hidden_states[k] to hidden_states[k + 1] (the last entry is after the final norm, so the
    last block is compared through final_norm)."""
    lm = tiny_lm
    fam = lm.parts.family
    with torch.inference_mode():
        hs = lm.model(torch.tensor([IDS]), output_hidden_states=True).hidden_states
        L = len(lm.parts.blocks)
        for k in range(L):
            s = Steps(head=0, kv_head=0, n_heads=lm.config.num_attention_heads,
                      n_kv_heads=getattr(lm.config, "num_key_value_heads", None)
                      or lm.config.num_attention_heads)
            y = fam.recompute_block(hs[k], lm.parts.blocks[k], lm.config, k, s, lm.model, fam)
            if k < L - 1:
                torch.testing.assert_close(y, hs[k + 1])
            else:
                torch.testing.assert_close(fam.recompute_final_norm(y, lm.parts.final_norm,
                                                                     lm.config, s),
                                           hs[-1])


def test_every_layer_and_head_matches(tiny_lm):
    lm = tiny_lm
    for layer in range(len(lm.parts.blocks)):
        for head in (0, lm.config.num_attention_heads - 1):
            e = explain(lm, IDS, layer=layer, head=head)
            assert e.match, [c for c in e.checks if not c.ok]
            assert e.layer == layer and e.head == head
            block = next(c for c in e.checks if c.name.startswith(f"block {layer} output"))
            assert block.value < 1e-4


def test_attention_rows_and_causal_zeros(tiny_lm):
    e = explain(tiny_lm, IDS, layer=-1, head=1)
    weights = next(m for m in e.matrices if m.name == "weights")
    masked = next(m for m in e.matrices if m.name == "scores + mask")
    T = len(IDS)
    cfg = tiny_lm.config
    types_ = getattr(cfg, "layer_types", None)
    window = cfg.sliding_window if types_ and types_[e.layer] == "sliding_attention" else None
    assert len(weights.rows) == T and len(weights.labels) == T
    for i, (row, srow) in enumerate(zip(weights.rows, masked.rows)):
        lo = max(0, i - window + 1) if window else 0  # a sliding window sees the last `window`
        if tiny_lm.parts.family.attn_sinks:  # gpt-oss: the sink takes a share of each row
            assert 0.0 < sum(row) < 1.0
        else:
            assert math.isclose(sum(row), 1.0, abs_tol=1e-5)
        assert all(v == 0.0 for v in row[i + 1:])  # exactly zero above the diagonal
        assert all(v == 0.0 for v in row[:lo])
        assert all(v > 0.0 for v in row[lo:i + 1])
        assert all(v == -math.inf for v in srow[i + 1:])


def test_step_names_follow_the_family():
    gpt2 = wrap_model(build_tiny("gpt2"), name="tiny-gpt2", random_weights=True)
    names = [s.name for s in explain(gpt2, IDS).steps]
    order = ["ln_1", "c_attn (fused QKV)", "split → Q, K, V", "heads", "scores", "causal mask",
             "softmax", "weights · V", "concat heads", "c_proj (W_O)", "residual add", "ln_2",
             "c_fc (MLP up)", "GELU", "c_proj (MLP down)", "ln_f (final norm)",
             "last position", "lm_head (unembed)"]
    assert [n for n in names if n in order] == [n for n in names if n in order]
    positions = [names.index(n) for n in order]
    assert positions == sorted(positions)
    llama = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    e = explain(llama, IDS, head=3)
    names = [s.name for s in e.steps]
    for n in ("input_layernorm (RMSNorm)", "RoPE on Q and K", "repeat K/V (GQA)",
              "SiLU(gate) · up", "down_proj", "norm (final RMSNorm)"):
        assert n in names
    assert e.kv_head == 1  # 4 query heads over 2 key/value heads
    k_proj = next(s for s in e.steps if s.name == "k_proj")
    assert k_proj.shape == (1, len(IDS), 32)  # 2 KV heads × 16
    unembed = next(s for s in e.steps if s.name == "lm_head (unembed)")
    assert "untied" in unembed.note


def test_sampling_side_by_side():
    lm = wrap_model(build_tiny("qwen2"), name="tiny-qwen2", random_weights=True)
    e = explain(lm, IDS, temperature=0.7, top_k=5, top_p=0.5, seed=3)
    s = e.sampling
    assert s.kept[0] == 1 and s.kept[2] == 5 and s.kept[1] == 1000
    assert s.picks[0].id == s.rows[0].id  # greedy takes the most probable
    again = explain(lm, IDS, temperature=0.7, top_k=5, top_p=0.5, seed=3).sampling
    assert again.picks == s.picks
    for row in s.rows:
        assert len(row.probs) == 4


def test_a_wrong_recomputation_is_caught(monkeypatch):
    """The check can fail: break RoPE in the walkthrough and the match is gone."""
    from fptrace.families import ops

    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    monkeypatch.setattr(ops, "rotate_half", lambda t: torch.zeros_like(t))
    e = explain(lm, IDS, layer=1)
    assert not e.match
    failed = [c.name for c in e.checks if not c.ok]
    assert any(n.startswith("block 1 output") for n in failed)


def test_bad_layer_and_head():
    lm = wrap_model(build_tiny("gpt2"), name="tiny-gpt2", random_weights=True)
    # the API's errors name its parameters
    with pytest.raises(BadInput, match="^layer=3: tiny-gpt2 has 3 blocks; the block is 0 to 2"):
        explain(lm, IDS, layer=3)
    with pytest.raises(BadInput, match="^layer=-4: tiny-gpt2 has 3 blocks"):
        explain(lm, IDS, layer=-4)
    with pytest.raises(BadInput, match="^head=4: each block of tiny-gpt2 has 4 heads; the head "
                       "is 0 to 3"):
        explain(lm, IDS, head=4)
    with pytest.raises(BadInput, match="^layer='1': the block must be an int"):
        explain(lm, IDS, layer="1")
    assert explain(lm, IDS, layer=-1, head=-1).layer == 2
    with pytest.raises(BadInput, match=r"^top_p must be in \(0, 1\], not 1.2"):
        explain(lm, IDS, top_p=1.2)  # the parameter's name: --top-p is the CLI's
    with pytest.raises(BadInput, match=r"^temperature must be 0 or more"):
        explain(lm, IDS, temperature=-1)


def test_family_without_walkthrough():
    lm = wrap_model(build_tiny("starcoder2"), name="tiny-starcoder2", random_weights=True)
    with pytest.raises(UnsupportedModel, match="starcoder2.*gemma.*gpt2.*gpt_neox.*llama.*phi3.*qwen2"):
        explain(lm, IDS)


def test_gpt_neox_sequential_residual():
    """GPT-NeoX with use_parallel_residual=False: the MLP reads x + attn_out."""
    import conftest

    cfg = dict(conftest.TINY_CONFIGS["gpt_neox"], use_parallel_residual=False)
    old = conftest.TINY_CONFIGS["gpt_neox"]
    conftest.TINY_CONFIGS["gpt_neox"] = cfg
    try:
        lm = wrap_model(build_tiny("gpt_neox"), name="tiny-neox-seq", random_weights=True)
    finally:
        conftest.TINY_CONFIGS["gpt_neox"] = old
    e = explain(lm, IDS, layer=1)
    assert e.match, [c for c in e.checks if not c.ok]
    names = [s.name for s in e.steps if s.section == "mlp"]
    assert names[0] == "residual add" and "post_attention_layernorm" in names


@pytest.mark.slow
@pytest.mark.parametrize("layer", [0, 3, 29])
def test_bundled_model_matches(smollm, layer):
    e = explain(smollm, "The capital of France is", layer=layer, head=2)
    assert e.match, [c for c in e.checks if not c.ok]
    assert [t.text for t in e.tokens] == ["The", " capital", " of", " France", " is"]
    assert e.sampling.picks[0].text == " Paris"
    assert e.kv_head == 0  # 9 query heads over 3 key/value heads
    end = {s.name: s for s in e.steps if s.section == "end"}
    assert "tied" in end["lm_head (unembed)"].note


@pytest.mark.slow
def test_bundled_block_equals_hidden_states(smollm):
    fam = smollm.parts.family
    ids = smollm.tokenizer.encode("The capital of France is")
    with torch.inference_mode():
        hs = smollm.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        for k in (0, 7, 15):
            s = Steps(head=0, kv_head=0, n_heads=9, n_kv_heads=3)
            y = fam.recompute_block(hs[k], smollm.parts.blocks[k], smollm.config, k, s,
                                    smollm.model, fam)
            torch.testing.assert_close(y, hs[k + 1], rtol=1e-5, atol=1e-4)


def _cli(*args):
    return runner.invoke(app, ["explain", *args], catch_exceptions=False)


def test_cli_gpt2_example_from_the_issue():
    r = _cli("The cat sat", "--model", "gpt2", "--random-weights", "--layer", "0")
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    for text in ("c_attn (fused QKV)", "(1, 12, 3, 64)", "(1, 12, 3, 3)", "K ␣cat", "Q The",
                 "GELU", "RANDOM WEIGHTS", "tied", "greedy", "top-p 0.9",
                 "recomputed block 0 output matches the model: max |Δ| ="):
        assert text in out, text


def test_cli_mismatch_is_loud(monkeypatch):
    from fptrace.families import gpt2

    monkeypatch.setattr(gpt2, "layer_norm", lambda x, ln, eps: x)
    r = _cli("The cat sat", "--model", tiny_gpt2(), "--random-weights")
    assert r.exit_code == 5
    assert "DOES NOT MATCH" in r.stdout
    assert r.stderr.strip().splitlines()[-1].startswith("fptrace: error: the recomputation")


@pytest.mark.slow
def test_cli_json_on_bundled_model(smollm):
    r = _cli("The capital of France is", "--layer", "3", "--head", "2", "--json",
             "--temperature", "0", "--top-k", "3")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["kind"] == "explain" and data["match"] is True
    assert data["layer"] == 3 and data["head"] == 2
    names = [s["name"] for s in data["steps"]]
    assert "RoPE on Q and K" in names and "softmax" in names
    assert data["sampling"]["kept"][1] == 1  # temperature 0 is greedy
    assert data["matrices"][0]["rows"][0][1] is None  # −∞ written as null ...
    assert "matrices[0].rows[0][1]" in data["nonfinite"]  # ... and listed


@pytest.mark.parametrize("args,needle", [
    (["--top-p", "0"], "--top-p"), (["--top-p", "1.5"], "--top-p"),
    (["--temperature", "-0.5"], "--temperature"), (["--top-k", "0"], "--top-k")])
def test_cli_bad_sampling_options(args, needle):
    r = _cli("The cat sat", "--model", tiny_gpt2(), "--random-weights", *args)
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("fptrace: error:") and needle in line
    assert "loaded" not in r.stderr  # refused before loading


HOSTILE = ["²", "٣", "１", "-", "1.", ".1", "1.2.3", "99999999999999999999", "", "1 2", "+1"]


@pytest.mark.parametrize("option", ["--layer", "--head"])
@pytest.mark.parametrize("value", HOSTILE + ["1.0", "L1H0"])
def test_hostile_addresses_get_one_line_before_loading(option, value):
    r = _cli("The cat sat", "--model", tiny_gpt2(), "--random-weights", option, value)
    assert r.exit_code == 2, (option, value, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fptrace: error: {option} {value!r}"), lines


@pytest.mark.parametrize("args,needle", [  # the tiny GPT-2: 2 blocks, 2 heads
    (["--layer", "2"], "--layer 2: tiny-gpt2 has 2 blocks; the block is 0 to 1"),
    (["--head", "2"], "--head 2: each block of tiny-gpt2 has 2 heads; the head is 0 to 1"),
    (["--layer", "²"], "--layer '²': the block '²': not a whole number"),
    (["--layer", "1."], "--layer '1.': the block '1.'"),
    (["--head", "٣"], "--head '٣': the head '٣': not a whole number"),
    (["--head", "1.2"], "--head '1.2': the head '1.2'"),
    (["--head", ""], "--head '': empty"),
    (["--layer", "99999999999999999999"], "is too large"),
])
def test_cli_bad_layer_head(args, needle):
    r = _cli("The cat sat", "--model", tiny_gpt2(), "--random-weights", *args)
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("fptrace: error:") and needle in line and "Traceback" not in r.output
