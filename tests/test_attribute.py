"""Attribution sums to the model's own logit on every family; the per-head parts sum to their
block's attention; --versus is the difference of two attributions; the frozen norms are the
model's norms at that input; bad targets are refused with how they tokenize."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from conftest import build_tiny, tiny_gpt2
from fptrace.cli.main import app
from fptrace.commands.attribute.core import attribute
from fptrace.core.attribution import frozen_norm
from fptrace.errors import BadInput
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311]
runner = CliRunner()


def _model_logits(lm, ids):
    """The model's own last-position logits, before any final softcap (lm_head's output)."""
    got = {}

    def keep(module, args, output):
        got["x"] = output[0, -1]

    h = lm.model.lm_head.register_forward_hook(keep)
    try:
        with torch.inference_mode():
            capped = lm.model(torch.tensor([ids]), use_cache=False).logits[0, -1]
    finally:
        h.remove()
    return got["x"].float(), capped.float()


def test_parts_sum_to_the_model_logit(tiny):
    a = attribute(tiny, IDS)
    pre, capped = _model_logits(tiny, IDS)
    assert a.target.id == int(capped.argmax())
    assert a.ok
    assert a.model_logit == pytest.approx(float(pre[a.target.id]), rel=1e-6, abs=1e-6)
    assert sum(c.value for c in a.contributions) == pytest.approx(a.model_logit, abs=1e-4)
    if getattr(tiny.config, "final_logit_softcapping", None):
        assert a.capped_logit == pytest.approx(float(capped[a.target.id]), rel=1e-6)
    else:
        assert a.capped_logit is None


def test_heads_sum_to_their_block(tiny):
    a = attribute(tiny, IDS)
    n_heads = tiny.config.num_attention_heads
    for layer in a.layers:
        parts = [c for c in a.contributions if c.layer == layer.layer
                 and c.component in ("attn_head", "attn_bias", "attn")]
        assert len([c for c in parts if c.component == "attn_head"]) == n_heads
        assert sum(c.value for c in parts) == pytest.approx(layer.attn, abs=1e-6)
        assert tuple(c.value for c in parts if c.component == "attn_head") == \
            pytest.approx(a.head_grid[layer.layer], abs=1e-9)


def test_versus_is_the_difference_of_two_attributions(tiny):
    a = attribute(tiny, IDS)
    other = next(t for t in range(10, 20) if t != a.target.id)
    b = attribute(tiny, IDS, target=f"#{other}")
    d = attribute(tiny, IDS, target=f"#{a.target.id}", versus=f"#{other}")
    assert d.ok and d.versus.id == other
    assert d.model_logit == pytest.approx(a.model_logit - b.model_logit, abs=1e-5)
    for x, y, z in zip(d.contributions, a.contributions, b.contributions):
        assert (x.component, x.layer, x.head) == (y.component, y.layer, y.head)
        assert x.value == pytest.approx(y.value - z.value, abs=1e-5)


def test_frozen_norm_is_the_model_norm_at_that_input(tiny):
    """The linear map the attribution uses reproduces the model's final norm (and, for
    post-norm families, the post-attention norm) exactly at the input it was frozen at."""
    torch.manual_seed(0)
    x = torch.randn(tiny.config.hidden_size) * 3
    fam = tiny.parts.family
    norms = [tiny.parts.final_norm] + ([tiny.parts.attn_adds[0]] if fam.attn_added else [])
    for norm in norms:
        centre, gain, bias = frozen_norm(norm, x, fam.norm_type)
        y = ((x - x.mean()) if centre else x) * gain + (0 if bias is None else bias)
        with torch.inference_mode():
            want = norm(x[None])[0].float()
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


def test_bad_targets():
    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    with pytest.raises(BadInput, match="outside the vocabulary"):
        attribute(lm, IDS, target="#100000")
    with pytest.raises(BadInput, match="same token"):
        attribute(lm, IDS, target="#7", versus="#7")


@pytest.mark.slow
def test_bundled_model(smollm):
    a = attribute(smollm, "The capital of France is")
    assert a.ok and a.target.text == " Paris"
    assert abs(a.difference) < 1e-4
    with pytest.raises(BadInput, match="is 3 tokens"):
        attribute(smollm, "The capital of France is", target=" Parisian hills")
    d = attribute(smollm, "The capital of France is", target=" Paris", versus=" London")
    assert d.ok and d.model_logit > 0


def test_cli_json_and_mismatch_exit(monkeypatch):
    r = runner.invoke(app, ["attribute", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            "--json"])
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["kind"] == "attribution" and data["ok"] is True
    import fptrace.core.attribution as mod

    real = mod.frozen_norm
    monkeypatch.setattr(mod, "frozen_norm", lambda m, x, t: (lambda c, g, b: (c, g * 1.1, b))(
        *real(m, x, t)))
    r = runner.invoke(app, ["attribute", "The cat sat", "-m", tiny_gpt2(), "--random-weights"])
    assert r.exit_code == 5
    assert "DO NOT SUM" in r.stdout
    assert r.stderr.strip().splitlines()[-1].startswith("fptrace: error: the parts do not sum")


def test_cli_target_of_several_tokens():
    r = runner.invoke(app, ["attribute", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            "--target", " on the mat"])
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert "is 3 tokens" in line and "' on'" in line
