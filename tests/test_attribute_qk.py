"""`attribute --qk`: the terms sum to the model's own pre-softmax score, taken here from the
model's eager attention (its own eager_attention_forward, wrapped for one forward pass), on every
family's tiny config, variants of their options, sliding-window and softcapped families and the
bundled model; the weight shown is the model's; changing one token changes only what the split
says depends on it; bad inputs are refused in one line."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import build_tiny, tiny_gpt2
from typer.testing import CliRunner

from fptrace.addresses import Head
from fptrace.cli.main import app
from fptrace.commands.attribute.qk import attribute_qk
from fptrace.errors import BadInput, UnsupportedModel
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311, 12, 88]
runner = CliRunner()


def eager_scores(model, layer: int, ids) -> tuple:
    """The model's own scores of block `layer`, q·kᵀ·scaling before the mask and any softcap
    (nh, T, T), and its weights (nh, T, T): the modeling file's eager_attention_forward is
    wrapped for one forward pass in eager mode and records what the block's attention passes
    it (its query and key after the q/k norms and RoPE, and its scaling). Also
    scaling·‖q_i‖·‖k_j‖ (nh, T, T), the size of each score before q and k cancel."""
    attn = [m for m in model.modules() if type(m).__name__.endswith("Attention")][layer]
    module = sys.modules[type(attn).__module__]
    real = module.eager_attention_forward
    got = {}

    def spy(mod, query, key, value, attention_mask, scaling=None, **kwargs):
        out = real(mod, query, key, value, attention_mask, scaling=scaling, **kwargs)
        if mod is attn:
            k = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
            s = query.shape[-1] ** -0.5 if scaling is None else scaling
            got["scores"] = (torch.matmul(query, k.transpose(2, 3)) * s)[0].float()
            got["weights"] = out[1][0].float()
            got["size"] = (query.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :]
                           * abs(s))[0].float()
        return out

    impl = model.config._attn_implementation
    module.eager_attention_forward = spy
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            model(torch.tensor([ids]), use_cache=False)
    finally:
        module.eager_attention_forward = real
        model.set_attn_implementation(impl)
    return got["scores"], got["weights"], got["size"]


def sharpen(model, factor: float):
    """Every matrix of every attention module times `factor`: larger scores, so that softcaps
    bite and the weights are far from uniform."""
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__.endswith("Attention"):
                for p in m.parameters():
                    if p.dim() == 2:
                        p.mul_(factor)
    return model


def assert_matches(a, model, ids):
    """The split's score is the model's (1e-4 relative), the weight is the model's, and every
    way the result adds up (top + rest, each side's parts, the grid) gives the score.

    Relative to the score, or, where q and k nearly cancel, to 1% of scale·‖q‖·‖k‖: the model's
    own float32 score is only known to ~1e-7 of that size (a score of 0.003 from vectors whose
    product is 4 carries an error of ~4e-7 in the model itself)."""
    scores, weights, size = eager_scores(model, a.layer, ids)
    s = float(scores[a.head, a.query, a.key])
    floor = 1e-2 * float(size[a.head, a.query, a.key])
    assert abs(a.score - s) <= 1e-4 * max(abs(s), floor), (a.score, s, floor)
    assert a.weight == pytest.approx(float(weights[a.head, a.query, a.key]), rel=1e-6, abs=1e-9)
    assert a.recomputed_weight == pytest.approx(a.weight, abs=1e-5)
    assert a.ok, [c for c in a.checks if not c.ok]
    assert sum(t.value for t in a.top) + a.rest == pytest.approx(a.score, abs=1e-9)
    for side in (a.query_parts, a.key_parts):
        assert sum(p.value for p in side) == pytest.approx(a.score, abs=1e-9)
    assert sum(map(sum, a.grid)) == pytest.approx(a.score, abs=1e-9)
    assert a.n_terms == len(a.query_parts) * len(a.key_parts)


def test_terms_sum_to_the_models_score(tiny):
    """Every family's tiny config: the first and the last block, the last head (grouped-query
    heads read the last K/V head), the default query and key."""
    if tiny.parts.family.qk_weights is None:  # the generic fallback: refused, not guessed
        with pytest.raises(UnsupportedModel, match=r"^attribute qk needs"):
            attribute_qk(tiny, IDS, Head(0, 0))
        return
    nh, L = tiny.config.num_attention_heads, tiny.config.num_hidden_layers
    for layer in (0, L - 1):
        a = attribute_qk(tiny, IDS, Head(layer, nh - 1))
        assert (a.query, a.kv_head) == (len(IDS) - 1, (nh - 1) // (nh // a.model.n_kv_heads))
        _, weights, _ = eager_scores(tiny.model, layer, IDS)
        assert a.key == a.most_attended == int(weights[nh - 1, -1].argmax())
        assert_matches(a, tiny.model, IDS)


VARIANTS = {
    "gpt2-inverse-layer-scale": ("gpt2", {"scale_attn_by_inverse_layer_idx": True}),
    "gpt2-unscaled": ("gpt2", {"scale_attn_weights": False}),
    "gpt_neox-sequential": ("gpt_neox", {"use_parallel_residual": False}),
    "phi3-partial-rotary": ("phi3", {"partial_rotary_factor": 0.5}),
    "mistral-sliding": ("mistral", {"sliding_window": 3}),
    "llama-llama3-rope": ("llama", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    "qwen2-biases": ("qwen2", {}),
    "gemma2-softcap": ("gemma2", {}),
    "gemma3-qk-norm": ("gemma3", {}),
    "olmo2-whole-qk-norm": ("olmo2", {}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants_every_block_and_chosen_positions(variant):
    """Options of each family (sharpened attention, so that the weights are far from uniform):
    every block, the first and the last query head, the default key and chosen query/key
    positions."""
    family, overrides = VARIANTS[variant]
    model = sharpen(build_tiny(family, **overrides), 6.0)
    lm = wrap_model(model, name=f"tiny-{variant}", random_weights=True)
    nh = model.config.num_attention_heads
    for layer in range(model.config.num_hidden_layers):
        for head in (0, nh - 1):
            assert_matches(attribute_qk(lm, IDS, Head(layer, head)), model, IDS)
        assert_matches(attribute_qk(lm, IDS, Head(layer, nh - 1), query=5, key=4), model, IDS)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma2"])
def test_half_precision(family):
    """A bfloat16 model: the checks hold at half precision's tolerance, the weight shown is the
    model's own, and the score is the model's within its own rounding."""
    model = build_tiny(family).to(torch.bfloat16)
    lm = wrap_model(model, name=f"tiny-{family}", random_weights=True)
    a = attribute_qk(lm, IDS, Head(1, 1))
    scores, weights, size = eager_scores(model, 1, IDS)
    assert a.ok and a.model.dtype == "bfloat16"
    assert a.weight == float(weights[1, a.query, a.key])
    s = float(scores[1, a.query, a.key])
    assert abs(a.score - s) <= 2e-2 * max(abs(s), float(size[1, a.query, a.key]))


def test_softcap_before_and_after():
    model = sharpen(build_tiny("gemma2"), 12.0)
    lm = wrap_model(model, name="tiny-gemma2", random_weights=True)
    cap = model.config.attn_logit_softcapping
    found = False
    for head in range(model.config.num_attention_heads):
        for key in range(len(IDS)):
            a = attribute_qk(lm, IDS, Head(1, head), key=key)
            assert a.softcap == cap
            assert a.capped_score == pytest.approx(cap * torch.tanh(torch.tensor(a.score / cap))
                                                   .item(), rel=1e-9)
            assert_matches(a, model, IDS)
            found |= abs(a.score) > cap  # the cap bites: before and after differ a lot
    assert found
    assert any("soft-caps attention scores" in n for n in a.notes)


def test_sliding_window():
    model = build_tiny("gemma2")
    lm = wrap_model(model, name="tiny-gemma2", random_weights=True)
    window = model.config.sliding_window
    layer = model.config.layer_types.index("sliding_attention")
    i = len(IDS) - 1
    a = attribute_qk(lm, IDS, Head(layer, 0), key=i - window + 1)
    assert a.window == window
    assert_matches(a, model, IDS)
    assert i - a.most_attended < window
    with pytest.raises(BadInput, match=rf"outside block {layer}'s sliding window of {window}"):
        attribute_qk(lm, IDS, Head(layer, 0), key=i - window)
    full = model.config.layer_types.index("full_attention")
    assert_matches(attribute_qk(lm, IDS, Head(full, 0), key=0), model, IDS)


def _all_terms(a):
    return {(t.query, t.key): t.value for t in a.top}


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama", "qwen2", "qwen3", "gemma",
                                    "gemma2", "olmo2", "phi3"])
def test_changing_one_token_changes_only_what_depends_on_it(family):
    """Block 0, where the stream at a position is that position's embedding alone: a different
    token at the key leaves every part of the query's side exactly as it was (the size of what
    each adds to q) and every term of the query's parts with a key part that does not pass
    through the key's stream (its bias, where no K norm rescales it); the terms with the key's
    embedding change. The same holds the other way round."""
    model = build_tiny(family)
    lm = wrap_model(model, name=f"tiny-{family}", random_weights=True)
    fam = lm.parts.family
    i, j = len(IDS) - 1, len(IDS) - 3  # inside Gemma 2's 3-token window
    for changed, same in ((j, "query"), (i, "key")):
        before = attribute_qk(lm, IDS, Head(0, 1), query=i, key=j, top=1000)
        ids = list(IDS)
        ids[changed] = 500  # a token that is nowhere else in the prompt
        after = attribute_qk(lm, ids, Head(0, 1), query=i, key=j, top=1000)
        assert before.n_terms == len(before.top)  # every term is listed
        kept = before.query_parts if same == "query" else before.key_parts
        now = after.query_parts if same == "query" else after.key_parts
        assert [(p.part, p.norm) for p in kept] == [(p.part, p.norm) for p in now]  # exactly
        t0, t1 = _all_terms(before), _all_terms(after)
        for (q, k), v in t0.items():
            other = k if same == "query" else q
            if other.component == "bias" and not fam.qk_norm:
                assert t1[(q, k)] == v, (q, k)  # exactly equal
            if other.component == "embed":
                assert t1[(q, k)] != v, (q, k)


def test_bad_inputs():
    model = build_tiny("gemma2")
    lm = wrap_model(model, name="tiny-gemma2", random_weights=True)
    # the API's errors name its parameters (head=, query=, key=), not the command line's flags
    with pytest.raises(BadInput, match=r"^head=Head\(3, 0\): tiny-gemma2 has 3 blocks; the "
                       "block is 0 to 2"):
        attribute_qk(lm, IDS, Head(3, 0))
    with pytest.raises(BadInput, match=r"^head=Head\(0, 4\): each block of tiny-gemma2 has 4 "
                       "heads; the head is 0 to 3"):
        attribute_qk(lm, IDS, Head(0, 4))
    with pytest.raises(BadInput, match=r"^head='1.0': give a Head"):
        attribute_qk(lm, IDS, "1.0")
    with pytest.raises(BadInput, match="key 6 comes after query 5: the causal mask hides it"):
        attribute_qk(lm, IDS, Head(1, 0), query=5, key=6)
    with pytest.raises(BadInput, match="^key=8: the prompt has 8 tokens; the position is 0 to 7"):
        attribute_qk(lm, IDS, Head(1, 0), key=8)
    with pytest.raises(BadInput, match="^query=-9: the prompt has 8 tokens"):
        attribute_qk(lm, IDS, Head(1, 0), query=-9)
    a = attribute_qk(lm, IDS, Head(-1, 0), query=-2, key=-3)  # counted from the end
    assert (a.layer, a.query, a.key) == (2, 6, 5)


@pytest.mark.parametrize("args, message", [
    (["--qk", "1.1", "--versus", " dog"], "--qk splits an attention score"),
    (["--qk", "1"], "--qk '1': a block alone; give a block and a head as 23.4 or L23H4"),
    (["--qk", "one.two"], "--qk 'one.two': the block 'one': not a whole number"),
    (["--qk", "1.²"], "--qk '1.²': the head '²': not a whole number (ASCII digits 0-9)"),
    (["--qk", "1."], "--qk '1.': the head '': not a whole number"),
    (["--qk", ".1"], "--qk '.1': the block '': not a whole number"),
    (["--qk", "1.2.3"], "--qk '1.2.3': the head '2.3'"),
    (["--qk", "-"], "--qk '-': not a place"),
    (["--qk", ""], "--qk '': empty"),
    (["--qk", "99999999999999999999.0"], "the block '99999999999999999999' is too large"),
    (["--qk", "L1E0"], "--qk 'L1E0': an expert, not a head"),
    (["--qk", "1.0", "--query", "²"], "--query '²': the position '²': not a whole number"),
    (["--qk", "1.0", "--key", "1."], "--key '1.': the position '1.'"),
    (["--qk", "1.0", "--key", "9"], "--key 9: the prompt has 3 tokens; the position is 0 to 2"),
    (["--qk", "-1.-3"], "--qk -1.-3: each block of tiny-gpt2 has 2 heads; the head is 0 to 1"),
    (["--key", "1"], "--query, --key and --group go with --qk"),
    (["--qk", "1.0", "--group", "heads"], "--group must be one of term, source"),
    (["--qk", "2.0"], "--qk 2.0: tiny-gpt2 has 2 blocks; the block is 0 to 1"),
    (["--qk", "L2H0"], "--qk L2H0: tiny-gpt2 has 2 blocks; the block is 0 to 1"),
    (["--qk", "1.0", "--query", "1", "--key", "2"], "key 2 comes after query 1"),
])
def test_cli_bad_inputs(args, message):
    r = runner.invoke(app, ["attribute", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            *args])
    assert r.exit_code == 2, r.stdout
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("fptrace: error: ") and message in line, line


HOSTILE = ["²", "٣", "１", "-", "1.", ".1", "1.2.3", "99999999999999999999", "", "1 2", "+1"]


@pytest.mark.parametrize("command, option", [("attribute", "--qk"), ("report", "--qk"),
                                             ("attribute", "--query"), ("attribute", "--key")])
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_addresses_get_one_line_before_loading(tmp_path, command, option, value):
    """Every bad place is refused by the one address parser: exit 2, one line naming the option
    and the value, before any model loads."""
    args = ["--qk", "1.0"] + ([option, value] if option != "--qk" else [])
    if option == "--qk":
        args = ["--qk", value]
    if command == "report":
        args += ["--out", str(tmp_path / "r.html")]
    r = runner.invoke(app, [command, "The cat sat", "-m", tiny_gpt2(), "--random-weights", *args])
    assert r.exit_code == 2, (option, value, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fptrace: error: {option} {value!r}"), lines


def test_cli_short_forms_name_one_head_and_print_it_resolved():
    """`--qk -1.-1`, `L1H1` and `l1h1` are head 1 of block 1 of the 2-block, 2-head model: the
    same split, and the JSON and the header say 1 and 1 (never `1.-1`)."""
    seen = []
    for form in ("1.1", "-1.-1", "L1H1", "l1h1", "L-1H1"):
        r = runner.invoke(app, ["attribute", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                                "--qk", form, "--json"])
        assert r.exit_code == 0, (form, r.stderr)
        data = json.loads(r.stdout)
        assert (data["layer"], data["head"]) == (1, 1), form
        seen.append(data["score"])
    assert len(set(seen)) == 1
    r = runner.invoke(app, ["attribute", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            "--qk", "-1.-1"])
    assert r.exit_code == 0 and "Head 1.1: query 2" in r.stdout, r.stdout


def test_cli_json_plot_and_mismatch_exit(tmp_path, monkeypatch):
    png = tmp_path / "qk.png"
    r = runner.invoke(app, ["attribute", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            "--qk", "1.1", "--key", "0", "--json", "--plot", str(png)])
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["kind"] == "qk_attribution" and data["ok"] is True
    assert (data["layer"], data["head"], data["query"], data["key"]) == (1, 1, 2, 0)
    assert png.stat().st_size > 0
    r = runner.invoke(app, ["attribute", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            "--qk", "1.1", "--group", "source"])
    assert r.exit_code == 0 and "Query side" in r.stdout and "Key side" in r.stdout
    import fptrace.core.qk as mod

    real = mod.frozen_norm  # a wrong norm scale: the recomputed weights no longer match
    monkeypatch.setattr(mod, "frozen_norm", lambda m, x, t: (lambda c, g, b: (c, g * 20, b))(
        *real(m, x, t)))
    r = runner.invoke(app, ["attribute", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            "--qk", "1.1"])
    assert r.exit_code == 5, r.stdout
    assert "DOES NOT MATCH THE MODEL" in r.stdout
    assert r.stderr.strip().splitlines()[-1].startswith("fptrace: error: the split does not")


def test_two_passes_when_every_position_would_not_fit(monkeypatch):
    """Without --key, one pass keeps every position of every earlier block; past a budget a
    first pass finds the key and a second keeps two positions: the same split."""
    import fptrace.core.qk as mod

    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    one = attribute_qk(lm, IDS, Head(2, 3))
    monkeypatch.setattr(mod, "KEEP_BYTES", 0)
    two = attribute_qk(lm, IDS, Head(2, 3))
    assert (two.key, two.score, two.weight, two.top) == (one.key, one.score, one.weight, one.top)


def test_report_section(tmp_path):
    out = tmp_path / "report.html"
    r = runner.invoke(app, ["report", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            "--out", str(out)])
    assert r.exit_code == 0, r.stderr
    html = out.read_text(encoding="utf-8")
    assert "attends where it does" in html  # default: the head adding most to the top-1
    r = runner.invoke(app, ["report", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            "--out", str(out), "--qk", "1.0"])
    assert r.exit_code == 0, r.stderr
    assert "Why head 1.0 attends where it does" in out.read_text(encoding="utf-8")
    r = runner.invoke(app, ["report", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            "--out", str(tmp_path / "other.html"), "--qk", "1.²"])
    assert r.exit_code == 2 and "--qk '1.²': the head '²': not a whole number" in r.stderr
    assert "loaded" not in r.stderr  # refused before loading


@pytest.mark.slow
def test_bundled_model(smollm):
    prompt = "The capital of France is"
    ids = smollm.encode(prompt)
    for layer, head, key in ((20, 4, None), (20, 4, 3), (0, 0, None), (29, 8, 1)):
        a = attribute_qk(smollm, prompt, Head(layer, head), key=key)
        assert_matches(a, smollm.model, ids)
    assert a.kv_head == 2  # 9 query heads share 3 K/V heads
