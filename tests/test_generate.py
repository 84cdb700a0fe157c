"""generate: every step with the KV cache equals a full forward without one, greedy equals
model.generate, seeded sampling repeats, and the cache is what the shapes say."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import TINY_CONFIGS, build_tiny, make_gpt2_folder, tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.generate.core import generate
from fptrace.core.trace import run_trace
from fptrace.errors import BadInput
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 99]
runner = CliRunner()


@pytest.fixture(scope="module", params=sorted(TINY_CONFIGS))
def tiny_lm(request):
    return wrap_model(build_tiny(request.param), name=f"tiny-{request.param}",
                      random_weights=True)


def full_forward_logits(lm, ids):
    with torch.inference_mode():
        return lm.model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()


def test_cached_steps_equal_full_forward_and_model_generate(tiny_lm):
    lm = tiny_lm
    got = []
    g = generate(lm, IDS, max_new_tokens=8, logits_out=got)
    new = [t.id for t in g.generated]
    for k, logits in enumerate(got):
        torch.testing.assert_close(logits, full_forward_logits(lm, IDS + new[:k]),
                                   rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        ref = lm.model.generate(torch.tensor([IDS]), do_sample=False, max_new_tokens=8,
                                pad_token_id=0)
    assert new == ref[0, len(IDS):].tolist()[:len(new)]


def test_kv_cache_shapes_and_bytes(tiny_lm):
    lm = tiny_lm
    cfg = lm.config
    g = generate(lm, IDS, max_new_tokens=4, stop_at_eos=False)
    n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    L = cfg.num_hidden_layers
    assert [s.phase for s in g.steps] == ["prefill", "decode", "decode", "decode"]
    latent = lm.parts.family.kv_cache_values
    if latent is not None:  # latent attention (DeepSeek-V3): the cache holds the latent
        for k, s in enumerate(g.steps):
            positions = len(IDS) + k
            assert s.kv_layers == L and s.positions[-1] == positions - 1
            assert s.kv_bytes == L * positions * latent(cfg) * 4  # float32
        return
    assert g.steps[0].input_shape == (1, len(IDS)) and g.steps[1].input_shape == (1, 1)
    assert g.steps[0].stream_shape == (1, len(IDS), cfg.hidden_size)
    assert g.steps[2].stream_shape == (1, 1, cfg.hidden_size)
    types_ = getattr(cfg, "layer_types", None) or ["full_attention"] * L
    window = getattr(cfg, "sliding_window", None)
    sliding = [window is not None and t == "sliding_attention" for t in types_]
    for k, s in enumerate(g.steps):
        positions = len(IDS) + k
        assert s.kv_layers == L
        assert s.positions[-1] == positions - 1
        if not any(sliding):
            assert s.kv_shape == (1, n_kv, positions, head_dim)
            assert s.kv_layout == (f"layers 0–{L - 1}: (1, {n_kv}, {positions}, {head_dim})",)
            assert s.kv_bytes == 2 * L * n_kv * positions * head_dim * 4  # float32 K + V
            continue
        # sliding-window layers keep at most `window` positions; the others keep them all
        kept = {}
        for entry in s.kv_layout:
            where, shape = entry.split(": ")
            first, _, last = where.split(" ")[1].partition("–")
            for i in range(int(first), int(last or first) + 1):
                kept[i] = tuple(int(d) for d in shape.strip("()").split(", "))
        assert sorted(kept) == list(range(L))
        for i in range(L):
            assert kept[i][:2] == (1, n_kv) and kept[i][3] == head_dim
            assert kept[i][2] <= window if sliding[i] else kept[i][2] == positions
        assert s.kv_bytes == sum(2 * n_kv * kept[i][2] * head_dim * 4 for i in range(L))


def test_layers_of_a_step_equal_a_trace_of_the_whole_sequence():
    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    g = generate(lm, IDS, max_new_tokens=3, layers=True, stop_at_eos=False)
    new = [t.id for t in g.generated]
    for k, step in enumerate(g.steps):
        ref = run_trace(lm, IDS + new[:k])
        for a, b in zip(step.layers, ref.layers):
            assert math.isclose(a.resid_norm_last, b.resid_norm_last, rel_tol=1e-5)
            assert a.lens_id == b.lens_id
        assert step.alternatives[0].id == ref.top_k[0].id


def test_seeded_sampling_repeats():
    lm = wrap_model(build_tiny("qwen2"), name="tiny-qwen2", random_weights=True)
    a = generate(lm, IDS, max_new_tokens=10, temperature=1.5, seed=4, stop_at_eos=False)
    b = generate(lm, IDS, max_new_tokens=10, temperature=1.5, seed=4, stop_at_eos=False)
    c = generate(lm, IDS, max_new_tokens=10, temperature=1.5, seed=5, stop_at_eos=False)
    assert [t.id for t in a.generated] == [t.id for t in b.generated]
    assert [t.id for t in a.generated] != [t.id for t in c.generated]
    top = generate(lm, IDS, max_new_tokens=6, temperature=1.0, top_k=2, seed=1,
                   stop_at_eos=False)
    assert all(s.token.id in [x.id for x in s.alternatives[:2]] for s in top.steps)
    assert a.strategy == "temperature 1.5" and top.strategy == "temperature 1, top-k 2"


def test_stops_at_end_of_sequence():
    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    first = generate(lm, IDS, max_new_tokens=1).generated[0].id
    lm.model.generation_config.eos_token_id = first
    try:
        g = generate(lm, IDS, max_new_tokens=10)
    finally:
        lm.model.generation_config.eos_token_id = 2
    assert g.stop_reason == "eos" and len(g.steps) == 1


def test_bad_input():
    lm = wrap_model(build_tiny("gpt2"), name="tiny-gpt2", random_weights=True)  # context 64
    with pytest.raises(BadInput, match=r"^max_new_tokens must be at least 1, not 0"):
        generate(lm, IDS, max_new_tokens=0)
    with pytest.raises(BadInput, match="context window of 64.*-n 59"):
        generate(lm, IDS, max_new_tokens=60)
    with pytest.raises(BadInput, match=r"^top_p must be in \(0, 1\]"):
        generate(lm, IDS, temperature=1.0, top_p=0)  # the parameter's name: --top-p is the CLI's
    with pytest.raises(BadInput, match=r"^temperature must be 0 or more"):
        generate(lm, IDS, temperature=-1)
    with pytest.raises(BadInput, match=r"^top_k must be at least 1 \(or None for off\), not 0"):
        generate(lm, IDS, top_k=0)


@pytest.mark.slow
def test_bundled_greedy_equals_model_generate(smollm):
    got = []
    g = generate(smollm, "The capital of France is", max_new_tokens=8, logits_out=got)
    ids = smollm.tokenizer.encode("The capital of France is")
    with torch.inference_mode():
        ref = smollm.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=8)
    assert [t.id for t in g.generated] == ref[0, len(ids):].tolist()
    assert g.generated[0].text == " Paris"
    new = [t.id for t in g.generated]
    for k in (0, 3, 7):
        torch.testing.assert_close(got[k], full_forward_logits(smollm, ids + new[:k]),
                                   rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_gpt2_folder(tmp_path_factory.mktemp("gen-model"))[0])


def test_cli_lines_and_json(folder):
    r = runner.invoke(app, ["generate", "The cat sat", "-m", folder, "-n", "3"])
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert "prefill (1, 3)" in out and "decode  (1, 1)" in out
    assert "(1, 2, 3, 16)" in out and "(1, 2, 5, 16)" in out  # the cache grows
    assert "tokens/s" in out and "KV cache" in out
    data = json.loads(runner.invoke(app, ["generate", "The cat sat", "-m", folder, "-n", "3",
                                          "--json", "--layers"]).stdout)
    assert data["kind"] == "generation" and len(data["steps"]) == 3
    assert len(data["steps"][1]["layers"]) == 3  # embedding + 2 blocks


@pytest.mark.parametrize("args,needle", [
    (["-n", "0"], "-n must be at least 1"), (["-n", "40"], "context window"),
    (["--top-p", "1.5"], "--top-p"), (["--temperature", "-1"], "--temperature"),
    (["--top-k", "-2"], "--top-k")])
def test_cli_bad_input(folder, args, needle):
    r = runner.invoke(app, ["generate", "The cat sat", "-m", folder, *args])
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("fptrace: error:") and needle in line


def test_sampled_steps_label_each_probability():
    """Sampling: the chosen token's p under the model and under the sampling distribution
    stand side by side, each labelled, and the alternatives say they are the model's; the
    numbers are the model's softmax and the sampling distribution's (recomputed here)."""
    import io

    from rich.console import Console

    from fptrace.commands.generate.render import step_columns, step_header, step_line
    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2(), random_weights=True, device="cpu")
    g = generate(lm, "The cat sat", max_new_tokens=2, temperature=0.7, top_k=5, seed=1)
    cols = step_columns(None, 10, g.model.d_model, g.model.n_kv_heads, g.model.head_dim,
                        sampled=True)
    out = Console(file=io.StringIO(), width=250, color_system=None)
    out.print(step_header(cols))
    out.print(step_line(g.steps[0], "", cols))
    text = out.file.getvalue()
    assert "p model" in text and "p sampled" in text and "alternatives (p model)" in text
    s = g.steps[0]
    with torch.inference_mode():
        logits = lm.model(torch.tensor([lm.encode("The cat sat")])).logits[0, -1].float()
    assert s.token.prob == pytest.approx(float(torch.softmax(logits, -1)[s.token.id]), rel=1e-5)
    tempered = torch.softmax(logits / 0.7, -1)
    top = tempered.topk(5)
    kept = torch.zeros_like(tempered).scatter(0, top.indices, top.values)
    assert s.sample_prob == pytest.approx(float(kept[s.token.id] / kept.sum()), rel=1e-4)
    assert f"{s.token.prob:.2f}" in text and f"{s.sample_prob:.2f}" in text
