"""Attribution sums to the model's own logit on every family; the per-head parts sum to their
block's attention; --versus is the difference of two attributions; the frozen norms are the
model's norms at that input; bad targets are refused with how they tokenize."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import build_tiny, tiny_gpt2
from typer.testing import CliRunner

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
    # the Python API's parameters are named as passed; the CLI names its flags (below)
    with pytest.raises(BadInput, match=r"^target #100000: outside the vocabulary"):
        attribute(lm, IDS, target="#100000")
    with pytest.raises(BadInput, match=r"^target and versus are the same token$"):
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
    assert line.startswith("fptrace: error: --target ' on the mat'")
    r = runner.invoke(app, ["attribute", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            "--target", "#7", "--versus", "#7"])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines()[-1] == \
        "fptrace: error: --target and --versus are the same token"


MOE = ["deepseek_v3", "gpt_oss", "mixtral", "olmoe", "qwen2_moe", "qwen3_moe"]
MOE_IDS = [5, 17, 42, 7, 9, 311, 2, 80]


@pytest.mark.parametrize("family", MOE)
def test_each_chosen_expert_is_a_term_of_its_own(family):
    """On a mixture of experts, each expert the last position chose is a term (its output ×
    its routing weight, here from the model's own experts module run with every other
    weight zeroed), the shared experts another (the MoE block's output minus the experts
    module's, both from hooks), each through the final norm frozen at the model's own final
    stream; the parts still sum to the model's logit."""
    from conftest import build_tiny_moe

    model = build_tiny_moe(family)
    lm = wrap_model(model, name=f"tiny-{family}", random_weights=True)
    a = attribute(lm, MOE_IDS, top=100)
    assert a.ok, a.difference
    seen, hooks = {}, []
    for i, layer in enumerate(model.model.layers):
        experts = getattr(layer.mlp, "experts", None)
        if experts is None:
            continue
        hooks.append(experts.register_forward_pre_hook(
            lambda m, args, i=i: seen.setdefault(i, {}).update(args=args)))
        hooks.append(experts.register_forward_hook(
            lambda m, args, out, i=i: seen[i].update(experts=out[-1].clone())))
        hooks.append(layer.mlp.register_forward_hook(
            lambda m, args, out, i=i: seen[i].update(
                mlp=(out[0] if isinstance(out, tuple) else out)[0, -1].clone())))
    hooks.append(model.model.norm.register_forward_pre_hook(
        lambda m, args: seen.update(final=args[0][0, -1].clone())))
    try:
        with torch.no_grad():
            model(torch.tensor([MOE_IDS]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    norm = model.model.norm
    x = seen.pop("final")
    with torch.no_grad():
        gain = norm.weight * torch.rsqrt(x.pow(2).mean() + norm.variance_epsilon)
        u = model.lm_head.weight[a.target.id]
    got = {(c.layer, c.component, c.expert): c.value for c in a.contributions}
    assert seen, "no MoE block"
    for i, kept in seen.items():
        hidden, idx, w = kept["args"][:3]
        assert (i, "mlp", None) not in got  # the block is split
        experts = model.model.layers[i].mlp.experts
        for e in idx[-1].tolist():
            with torch.no_grad():
                only = experts(hidden[-1:], idx[-1:], torch.where(idx[-1:] == e, w[-1:], 0))
                want = float((only[0] * gain) @ u)
            assert got[(i, "expert", e)] == pytest.approx(want, rel=1e-4, abs=1e-5), (i, e)
        n_experts = sum(1 for (l, k, _) in got if l == i and k == "expert")
        assert n_experts == idx.shape[-1]
        if family in ("qwen2_moe", "deepseek_v3"):
            with torch.no_grad():
                want = float(((kept["mlp"] - kept["experts"]) * gain) @ u)
            assert got[(i, "shared_experts", None)] == pytest.approx(want, rel=1e-4, abs=1e-5)
        else:
            assert (i, "shared_experts", None) not in got
        layer = a.layers[i]
        assert layer.mlp == pytest.approx(sum(v for (l, k, _), v in got.items() if l == i and
                                              k in ("expert", "shared_experts")))
    if family == "deepseek_v3":  # block 0 is dense: one MLP part
        assert (0, "mlp", None) in got


def test_experts_that_do_not_add_up_are_one_part(monkeypatch):
    """Where the experts' terms do not add up to the block's output, the block is one `mlp`
    part, a note says so, and the parts still sum to the logit."""
    from conftest import build_tiny_moe

    from fptrace.core import attribution as engine

    lm = wrap_model(build_tiny_moe("mixtral"), name="tiny-mixtral", random_weights=True)
    good = attribute(lm, MOE_IDS)
    real = engine.expert_output
    monkeypatch.setattr(engine, "expert_output", lambda p, l, x, e: real(p, l, x, e) * 1.5)
    bad = attribute(lm, MOE_IDS)
    assert bad.ok and bad.total == pytest.approx(good.total)
    assert {c.component for c in bad.contributions if c.layer == 1} == {"attn_head", "mlp"}
    assert any("do not add up to the mixture of experts' output" in n for n in bad.notes)
    assert not any("mixture of experts' output" in n for n in good.notes)
