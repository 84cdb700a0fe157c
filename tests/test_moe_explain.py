"""explain on an MoE block: every step of the router and the expert mix against the model's own
modules (the router's output, the experts module run on one expert at a time, the shared
expert and its gate, the MoE block), with torch.testing.assert_close."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny, build_tiny_moe

from fptrace.commands.explain.core import explain
from fptrace.families import FAMILIES
from fptrace.families.ops import Steps
from fptrace.models.loading import wrap_model

EXPLAINED_MOE = sorted(f.name for f in FAMILIES if f.moe is not None and f.recompute_block)
IDS = [5, 17, 42, 7, 9, 311, 2]


@pytest.mark.parametrize("name", EXPLAINED_MOE)
def test_every_moe_step_against_the_model(name):
    model = build_tiny_moe(name, seed=2)
    lm = wrap_model(model, name=f"tiny-{name}", random_weights=True)
    fam = lm.parts.family
    moe = fam.moe(lm.config)
    for layer, blk in enumerate(lm.parts.blocks):
        mlp = lm.parts.mlps[layer]
        if not hasattr(mlp, fam.router):  # a dense block (DeepSeek-V3's first)
            continue
        got = {}
        hooks = [mlp.register_forward_pre_hook(lambda m, a: got.__setitem__("x", a[0])),
                 mlp.register_forward_hook(lambda m, a, o: got.__setitem__("out", o)),
                 mlp.get_submodule(fam.router).register_forward_hook(
                     lambda m, a, o: got.__setitem__("router", o))]
        try:
            with torch.no_grad():
                model(torch.tensor([IDS]), use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        s = Steps(head=0, kv_head=0, n_heads=4, n_kv_heads=4)
        with torch.no_grad():
            from fptrace.families.ops import moe_mlp

            out = moe_mlp(got["x"], mlp, moe, s, fam)
            logits, weights, indices = got["router"]
            T = len(IDS)
            torch.testing.assert_close(s.kept["router logits"].reshape(T, -1), logits)
            ours_idx = s.kept["top-k experts"].reshape(T, -1).long()
            assert torch.equal(ours_idx.sort(-1).values, indices.sort(-1).values)
            x = got["x"].reshape(T, -1)
            experts = mlp.get_submodule(fam.experts)
            routed = torch.zeros_like(x)
            for e in range(moe.n_experts):
                chosen = (indices == e)  # (T, k)
                if not chosen.any():
                    continue
                w = (weights * chosen).sum(-1, keepdim=True)  # (T, 1): e's weight, or 0
                only_e = torch.full((T, 1), e, dtype=indices.dtype)
                theirs = experts(x, only_e, w.to(x.dtype))  # the model's experts, expert e only
                routed += theirs
                key = f"expert {e} × weight"
                if key in s.kept:  # the last position's experts are shown
                    torch.testing.assert_close(s.kept[key].reshape(T, -1), theirs)
                    assert e in indices[-1].tolist()
            shown = [k for k in s.kept if k.startswith("expert ") and k.endswith("× weight")]
            assert len(shown) == moe.top_k
            torch.testing.assert_close(s.kept["routed experts, summed"].reshape(T, -1), routed)
            if fam.shared_experts:
                shared = mlp.get_submodule(fam.shared_experts)(got["x"])
                if fam.shared_expert_gate:
                    shared = torch.sigmoid(mlp.get_submodule(fam.shared_expert_gate)(got["x"])) \
                        * shared
                torch.testing.assert_close(s.kept["shared experts"], shared)
            torch.testing.assert_close(out, got["out"][0] if isinstance(got["out"], tuple)
                                       else got["out"])


@pytest.mark.parametrize("name", EXPLAINED_MOE)
def test_explain_checks_the_router(name):
    lm = wrap_model(build_tiny(name), name=f"tiny-{name}", random_weights=True)
    e = explain(lm, IDS, layer=-1)
    targets = {c.target: c for c in e.checks}
    for t in ("router_logits", "router_choice", "router_weights", "mlp_out", "block"):
        assert targets[t].ok, targets[t]
    names = [st.name for st in e.steps]
    assert names.index("router logits") < names.index("top-k experts") \
        < names.index("expert weights") < names.index("routed experts, summed")


def test_a_wrong_choice_is_caught(monkeypatch):
    """The choice check is live: a routing rule that picks other experts fails it."""
    import fptrace.families.ops as ops

    lm = wrap_model(build_tiny("mixtral"), name="tiny-mixtral", random_weights=True)
    real = ops.route

    def flipped(logits, moe, bias=None):
        idx, w = real(-logits, moe, bias)
        return idx, w

    monkeypatch.setattr(ops, "route", flipped)
    e = explain(lm, IDS, layer=0)
    assert not e.match
    assert not next(c for c in e.checks if c.target == "router_choice").ok


def test_gpt_oss_sinks_against_the_models_weights():
    """gpt-oss: explain's attention weights (the sink's column dropped) equal the model's own
    eager attention weights, and each row plus its sink weight sums to 1."""
    model = build_tiny("gpt_oss", seed=3)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(torch.randn_like(layer.self_attn.sinks))
    lm = wrap_model(model, name="tiny-gpt_oss", random_weights=True)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        theirs = model(torch.tensor([IDS]), output_attentions=True).attentions
    for layer in range(len(lm.parts.blocks)):
        for head in (0, 3):
            e = explain(lm, IDS, layer=layer, head=head)
            assert e.match, [c for c in e.checks if not c.ok]
            ours = torch.tensor(next(m for m in e.matrices if m.name == "weights").rows)
            torch.testing.assert_close(ours, theirs[layer][0, head].float())
            rows = next(c for c in e.checks if c.target == "softmax_rows")
            assert "sink" in rows.name and rows.ok
