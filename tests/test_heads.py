"""fptrace heads: the pattern scores against a plain computation on output_attentions (a
pre-norm family with GQA, a post-norm one), planted patterns, the OV eigenvalue measure against
the whole (V, V) circuit, the story's sentences against the grid, and the bad inputs."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny, tiny_gpt2
from typer.testing import CliRunner

from fptrace.models.loading import wrap_model

PROMPTS = [[5, 6, 7, 6, 9, 10, 6], [11, 12, 13, 14, 12]]


def _lm(family: str):
    return wrap_model(build_tiny(family), name=f"tiny-{family}", random_weights=True)


def _plain(model, rows, n=None):
    """Each score by hand from output_attentions (eager attention)."""
    model.config._attn_implementation = "eager"
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    sums = {k: torch.zeros(L, H, dtype=torch.float64) for k in ("previous", "duplicate",
                                                                 "induction", "first")}
    counts = dict.fromkeys(sums, 0)
    for ids, induction in rows:
        with torch.no_grad():
            att = model(torch.tensor([ids]), output_attentions=True).attentions
        A = torch.stack([a[0] for a in att]).double()  # (L, H, T, T)
        T = len(ids)
        for i in range(T):
            if i >= 1:
                sums["first"] += A[..., i, 0]
                counts["first"] += 1
            if i >= 2 and not induction:
                sums["previous"] += A[..., i, i - 1]
                counts["previous"] += 1
            earlier = [j for j in range(1, i) if ids[j] == ids[i]]
            if earlier:
                sums["duplicate"] += A[..., i, earlier].sum(-1)
                counts["duplicate"] += 1
            if induction and i >= n:
                sums["induction"] += A[..., i, i - n + 1]
                counts["induction"] += 1
    return {k: sums[k] / counts[k] for k in sums}


@pytest.mark.parametrize("family", ["llama", "olmo2"])  # pre-norm with GQA; post-norm
def test_scores_equal_a_plain_computation_on_output_attentions(family):
    from fptrace.commands.heads.core import heads, induction_items

    lm = _lm(family)
    r = heads(lm, PROMPTS, seed=3, induction=2, induction_length=6, check=False)
    rand = induction_items(lm, 2, 6, 3)
    plain = _plain(build_tiny(family), [(p, False) for p in PROMPTS]
                   + [(list(it.ids), True) for it in rand], n=6)
    for h in r.heads:
        for key in ("previous", "duplicate", "induction", "first"):
            assert getattr(h, key) == pytest.approx(float(plain[key][h.layer, h.head]),
                                                    abs=1e-5), (key, h.layer, h.head)


def _scores_of(planted):
    """The scores of one layer of 3 planted heads on a 12-token prompt with repeats."""
    from fptrace.commands.heads.core import Item, Tally, _tally, pattern_masks

    ids = (1, 2, 3, 4, 2, 5, 6, 3, 7, 8, 9, 4)
    T = len(ids)
    prev = torch.zeros(T, T)
    prev[0, 0] = 1
    prev[torch.arange(1, T), torch.arange(0, T - 1)] = 1
    sink = torch.zeros(T, T)
    sink[:, 0] = 1
    rand = torch.softmax(torch.randn(T, T, generator=torch.Generator().manual_seed(0)), -1)
    rand = rand.tril()
    rand = rand / rand.sum(-1, keepdim=True)
    A = {"previous": prev, "sink": sink, "random": rand}
    tally = Tally(1, 3)
    _tally(tally, [torch.stack([A[k] for k in planted])], Item("p", ids), pattern_masks(ids),
           None, None)
    return {k: {s: float(tally.mean(s)[0, i]) for s in ("previous", "duplicate", "first")}
            for i, k in enumerate(planted)}


def test_planted_patterns_score_as_built():
    from fptrace.commands.heads.core import THRESHOLDS

    s = _scores_of(["previous", "sink", "random"])
    assert s["previous"]["previous"] >= 0.99
    # a head that attends to the first token is a sink, never a previous-token head
    assert s["sink"]["first"] >= 0.99 and s["sink"]["previous"] == 0.0
    assert s["random"]["previous"] < THRESHOLDS["previous-token"]
    assert s["random"]["first"] < 0.99


def test_ov_eigen_measure_equals_the_whole_circuit():
    """On GPT-2 (LayerNorm, fused c_attn): Σλ/Σ|λ| of the (hd, hd) matrix equals that of the
    whole (V, V) circuit built token by token."""
    from fptrace.commands.heads.weights import ov_scores, value_weights

    lm = _lm("gpt2")
    ov = ov_scores(lm, 0, 16)
    m = lm.model
    E, U = m.transformer.wte.weight.float(), m.lm_head.weight.float()
    cfg = m.config
    H, d = cfg.n_head, cfg.n_embd
    hd = d // H
    gf = m.transformer.ln_f.weight.float()
    Uf = U * gf
    Uf = Uf - Uf.mean(-1, keepdim=True)
    blk = m.transformer.h[1]
    Ec = E - E.mean(-1, keepdim=True)
    Ec = Ec * torch.rsqrt(Ec.pow(2).mean(-1, keepdim=True) + blk.ln_1.eps) * blk.ln_1.weight
    Wv = value_weights(blk.attn, H, H, hd)
    Wo = blk.attn.c_proj.weight.float().T
    with torch.no_grad():
        for h in range(H):
            M = Uf @ Wo[:, h * hd:(h + 1) * hd] @ Wv[h * hd:(h + 1) * hd] @ Ec.T  # (V, V)
            lam = torch.linalg.eigvals(M.double())
            want = float(lam.real.sum() / lam.abs().sum())
            assert ov.eigen[1][h] == pytest.approx(want, abs=1e-3)


def test_the_story_says_what_the_grid_shows():
    from fptrace.commands.heads.core import heads

    r = heads(_lm("llama"), PROMPTS, induction=2, induction_length=6, check=False)
    for role in ("previous-token", "induction", "duplicate-token", "sink"):
        n = sum(role in h.roles for h in r.heads)
        said = [s for s in r.story if f" {role} head" in s and not s.startswith("the walk")]
        assert said, (role, r.story)
        if n:
            assert said[0].startswith(f"the {n} {role} head"), (said, n)
        else:
            assert said[0].startswith(f"no head is a {role} head"), said


def _cli(*argv):
    from fptrace.cli.main import app

    return CliRunner().invoke(app, ["heads", *argv, "--model", tiny_gpt2()])


@pytest.mark.parametrize("argv, says", [
    (("A",), "shorter than 3 tokens"),
    (("The cat sat", "--induction", "0"), "no token repeats"),
    (("The cat sat", "--induction", "2x40"), "beyond"),
    (("The cat sat", "--induction", "2y8"), "NxLEN"),
    (("The cat sat", "--seed", "x"), "--seed"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says):
    r = _cli(*argv)
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output


def test_cli_json_and_one_head():
    import json

    r = _cli("The cat sat on the cat mat", "--induction", "2x8", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["kind"] == "heads" and len(out["heads"]) == 4  # 2 blocks × 2 heads
    r = _cli("The cat sat on the cat mat", "--induction", "2x8", "--head", "1.1")
    assert r.exit_code == 0, r.output
    assert "Head 1.1" in r.stdout
