"""fptrace heads: the pattern scores against a plain computation on output_attentions (a
pre-norm family with GQA, a post-norm one, two mixture-of-experts ones), heads planted by hand in
a tiny GPT-2, the OV eigenvalue measure against the whole (V, V) circuit, the story's sentences
against the grid, a family whose attention gives no weights, and the bad inputs.

Every model is built once per module and every result computed once (fixtures): the file runs
in seconds."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    build_tiny,
    hover_heatmap_cell,
    page_heatmap,
    save_with_gpt2_tokenizer,
    tiny_gpt2,
)
from planted_heads import planted_gpt2
from typer.testing import CliRunner

from fptrace.models.loading import wrap_model

PROMPTS = [[5, 6, 7, 6, 9, 10, 6], [11, 12, 13, 14, 12]]
SEED, N, LEN = 3, 2, 6  # the induction sequences: N of LEN tokens, repeated once


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


FAMILIES = ["llama", "olmo2", "mixtral", "qwen2_moe"]  # GQA pre-norm; post-norm; two MoE


@pytest.fixture(scope="module", params=FAMILIES)
def scored(request):
    """(family, its tiny model wrapped, heads' result without the checks)."""
    from fptrace.commands.heads.core import heads

    lm = wrap_model(build_tiny(request.param), name=f"tiny-{request.param}",
                    random_weights=True)
    return request.param, lm, heads(lm, PROMPTS, seed=SEED, induction=N, induction_length=LEN,
                                    check=False, ov_tokens=8)


def test_scores_equal_a_plain_computation_on_output_attentions(scored):
    """Dense (Llama with GQA, OLMo 2 post-norm) and mixture-of-experts (Mixtral, Qwen2-MoE)
    models alike: every head's scores are the attention output_attentions returns."""
    from fptrace.commands.heads.patterns import induction_items

    family, lm, r = scored
    rand = induction_items(lm, N, LEN, SEED)
    plain = _plain(build_tiny(family), [(p, False) for p in PROMPTS]
                   + [(list(it.ids), True) for it in rand], n=LEN)
    assert len(r.heads) == lm.model.config.num_hidden_layers * \
        lm.model.config.num_attention_heads
    for h in r.heads:
        for key in ("previous", "duplicate", "induction", "first"):
            assert getattr(h, key) == pytest.approx(float(plain[key][h.layer, h.head]),
                                                    abs=1e-5), (family, key, h.layer, h.head)


def test_the_story_says_what_the_grid_shows(scored):
    _, _, r = scored
    for role in ("previous-token", "induction", "duplicate-token", "sink"):
        n = sum(role in h.roles for h in r.heads)
        said = [s for s in r.story if (f" {role} head" in s or f" {role} role" in s)
                and not s.startswith("the walk")]
        assert said, (role, r.story)
        if n:
            assert said[0].startswith(f"the {n} {role} head"), (said, n)
        else:
            assert said[0].startswith(f"no head has the {role} role"), said


# ---- heads planted by hand ---------------------------------------------------------------------

PLANTED_PROMPTS = [torch.randint(0, 32, (20,), generator=torch.Generator().manual_seed(k))
                   .tolist() for k in range(2)]


def _planted(previous: bool = True, **kw):
    from fptrace.commands.heads.core import heads

    lm = wrap_model(planted_gpt2(previous), name="planted", random_weights=True)
    return heads(lm, PLANTED_PROMPTS, seed=2, induction=3, induction_length=12, ov_tokens=8,
                 **kw)


@pytest.fixture(scope="module")
def planted():
    """heads over the planted GPT-2, the checks run: {"L.H": HeadScores}."""
    return {f"{h.layer}.{h.head}": h for h in _planted().heads}


def test_a_planted_previous_token_head_scores_and_is_labelled(planted):
    h = planted["0.0"]
    assert h.previous >= 0.99
    assert h.roles == ("previous-token",) and h.next_share > 1.0


def test_a_planted_induction_head_is_labelled_through_the_previous_token_head(planted):
    h = planted["1.0"]
    assert h.induction >= 0.5 and h.roles == ("induction",) and h.loss_change > 0.1
    # without 0.0's output, 1.0 has no previous token to match: the score and the role go
    gone = {f"{x.layer}.{x.head}": x
            for x in _planted(previous=False, check=False, weights=False).heads}["1.0"]
    assert gone.induction < 0.4 and "induction" not in gone.roles


def test_a_first_token_head_is_a_sink_never_a_previous_token_head(planted):
    h = planted["0.1"]
    assert h.first >= 0.99 and h.previous <= 0.01
    assert h.roles == ("sink",) and "previous-token" not in h.pattern_only


def test_random_heads_are_not_labelled(planted):
    for name in ("0.2", "0.3", "1.1", "1.2", "1.3"):
        assert planted[name].roles == () and planted[name].pattern_only == (), name


# ---- the OV circuit ----------------------------------------------------------------------------

def test_ov_eigen_measure_equals_the_whole_circuit():
    """On GPT-2 (LayerNorm, fused c_attn): Σλ/Σ|λ| of the (hd, hd) matrix equals that of the
    whole (V, V) circuit built token by token."""
    from fptrace.commands.heads.weights import ov_scores, value_weights

    m = build_tiny("gpt2", vocab_size=96)
    lm = wrap_model(m, name="tiny-gpt2", random_weights=True)
    ov = ov_scores(lm, 0, 16)
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


def test_own_is_largest_is_the_whole_products_argmax(monkeypatch):
    """The probe's shortcut decides every row as `(O @ U.T).argmax(-1) == own` does: rows whose
    own token is the argmax (left for the whole product), rows it is not (ruled out), a tie
    with an earlier equal row (argmax takes the first), a row of NaN."""
    from fptrace.commands.heads import weights

    monkeypatch.setattr(weights, "PROBE", 16)
    g = torch.Generator().manual_seed(0)
    V, d, m = 600, 24, 400
    U = torch.randn(V, d, generator=g)
    U[7] = U[5]  # two equal rows: the first is the argmax
    O = torch.randn(m, d, generator=g)
    O[0] = U[5] * 3
    full = O @ U.T
    own = torch.randint(0, V, (m,), generator=g)
    own[: m // 2] = full[: m // 2].argmax(-1)  # half the rows: their own token is the largest
    own[0] = 7
    O[1] = float("nan")
    want = (O @ U.T).argmax(-1) == own
    got = weights.own_is_largest(O, U, own)
    assert torch.equal(got, want) and want[2:].sum() > 0 and not got[0]
    monkeypatch.setattr(weights, "WHOLE_ROWS", 3)  # the whole products a few rows at a time
    assert torch.equal(weights.own_is_largest(O, U, own), want)
    monkeypatch.setattr(weights, "PROBE", 1000)  # V ≤ 2·PROBE: the whole product alone
    assert torch.equal(weights.own_is_largest(O, U, own), want)
    assert weights.own_is_largest(O[:0], U, own[:0]).shape == (0,)


def test_copying_share_equals_the_models_own_logits(monkeypatch):
    """A head planted to copy (its OV circuit the identity on the embedding's subspace) and
    three random ones on a Llama with GQA: each head's share equals argmax(lm_head(norm(o))) ==
    the token, o computed through the block's own input norm, v_proj and o_proj."""
    from fptrace.commands.heads import weights

    monkeypatch.setattr(weights, "PROBE", 16)
    m = build_tiny("llama")
    cfg = m.config
    H, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    hd = d // H
    with torch.no_grad():
        E = m.model.embed_tokens.weight
        E[:, hd:] = 0
        E.copy_(E / E.norm(dim=-1, keepdim=True))
        m.lm_head.weight.copy_(E)
        attn = m.model.layers[1].self_attn
        attn.v_proj.weight[:hd] = 0
        attn.v_proj.weight[:hd, :hd] = torch.eye(hd)
        attn.o_proj.weight[:, :hd] = 0
        attn.o_proj.weight[:hd, :hd] = torch.eye(hd)
    lm = wrap_model(m, name="tiny-llama", random_weights=True)
    n = 64
    ov = weights.ov_scores(lm, 5, n)
    sample = torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(5))[:n]
    with torch.no_grad():
        for layer, block in enumerate(m.model.layers):
            a = block.self_attn
            v = a.v_proj(block.input_layernorm(E[sample]))
            for h in range(H):
                kv = h // (H // nkv)
                o = v[:, kv * hd:(kv + 1) * hd] @ a.o_proj.weight[:, h * hd:(h + 1) * hd].T
                top = m.lm_head(m.model.norm(o)).argmax(-1)
                assert ov.copying[layer][h] == (top == sample).float().mean().item()
    assert ov.copying[1][0] > 0.5 and max(ov.copying[0]) < 0.5
    monkeypatch.setattr(weights, "OV_ROWS", 7)  # a few sampled tokens a call: the same shares
    monkeypatch.setattr(weights, "WHOLE_ROWS", 3)
    assert weights.ov_scores(lm, 5, n).copying == ov.copying


def test_copying_share_a_chunk_at_a_time_with_a_post_norm(monkeypatch):
    """Gemma 2 (each block's heads read against their own post-norm's gains): the shares taken
    a few sampled tokens a call equal the shares taken at once."""
    from fptrace.commands.heads import weights

    monkeypatch.setattr(weights, "PROBE", 16)
    lm = wrap_model(build_tiny("gemma2"), name="tiny-gemma2", random_weights=True)
    want = weights.ov_scores(lm, 5, 40)
    monkeypatch.setattr(weights, "OV_ROWS", 7)
    monkeypatch.setattr(weights, "WHOLE_ROWS", 3)
    got = weights.ov_scores(lm, 5, 40)
    assert got.copying == want.copying and got.eigen == want.eigen


# ---- the command line --------------------------------------------------------------------------

def _cli(*argv, model=None):
    from fptrace.cli.main import app

    return CliRunner().invoke(app, ["heads", *argv, "--model", model or tiny_gpt2()])


@pytest.mark.parametrize("argv, says", [
    (("A",), "shorter than 3 tokens"),
    (("The cat sat", "--induction", "0"), "no token repeats"),
    (("The cat sat", "--induction", "2x40"), "beyond"),
    (("The cat sat", "--induction", "2y8"), "NxLEN"),
    (("The cat sat on the cat", "--induction", "2x8", "--ov-tokens", "9999999"),
     "vocabulary has"),
    (("The cat sat", "--seed", "x"), "--seed"),  # typer's own refusal: its one line through
])                                               # the real entry point is docs/bad-inputs.md's
def test_bad_input_is_one_line_and_exit_2(argv, says):
    r = _cli(*argv)
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output
    if "--seed" in argv:
        return
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0] == r.stderr.strip().splitlines()[-1], r.stderr


def test_cli_json_and_one_head():
    import json

    r = _cli("The cat sat on the cat mat", "--induction", "2x8", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["kind"] == "heads" and len(out["heads"]) == 4  # 2 blocks × 2 heads
    r = _cli("The cat sat on the cat mat", "--induction", "0", "--no-check", "--head", "1.1")
    assert r.exit_code == 0, r.output
    assert "Head 1.1" in r.stdout


def test_a_family_whose_attention_gives_no_weights_is_one_line(tmp_path, monkeypatch):
    """A mixture-of-experts family fptrace loads, whose attention (as one that ignores eager
    attention would) returns no weights: heads says so in one line, exit 2."""
    from transformers.models.qwen2_moe import modeling_qwen2_moe as mod

    folder = tmp_path / "tiny-qwen2-moe"
    save_with_gpt2_tokenizer(build_tiny("qwen2_moe", vocab_size=50257, bos_token_id=50256,
                                        eos_token_id=50256), folder)
    forward = mod.Qwen2MoeAttention.forward

    def no_weights(self, *args, **kwargs):
        return forward(self, *args, **kwargs)[0], None

    monkeypatch.setattr(mod.Qwen2MoeAttention, "forward", no_weights)
    r = _cli("The cat sat on the cat mat", "--induction", "2x8", model=str(folder))
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0] == r.stderr.strip().splitlines()[-1], r.stderr
    assert "returned no weights" in errors[0] and "cannot read" in errors[0], errors


# ---- the report's section and the TUI's heads tab ----------------------------------------------

REPORT_PROMPT = "The cat sat on the cat mat"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """(the page holding heads' report section as `fptrace report --heads --heads-induction 2x8`
    computes it, heads' own result over the same prompt and settings)."""
    from fptrace.cli.options import LoadOptions
    from fptrace.cli.sections import Page, collect
    from fptrace.commands.heads.core import heads
    from fptrace.core.trace import run_trace
    from fptrace.models.loading import load_model
    from fptrace.render.page import build_html

    lm = load_model(tiny_gpt2())
    section = dict(collect())["heads"]
    assert [o[0] for o in section.options] == ["heads", "heads_induction"]
    values = {"heads": True, "heads_induction": "2x8"}
    section.check(values)
    result = section.compute(Page(lm, REPORT_PROMPT, LoadOptions(), None), values)
    assert section.compute(Page(lm, REPORT_PROMPT, LoadOptions(), None),
                           {"heads": False, "heads_induction": "2x8"}) is None
    out = tmp_path_factory.mktemp("heads-page") / "report.html"
    out.write_text(build_html(run_trace(lm, REPORT_PROMPT, lens_grid=True), [(section, result)]),
                   encoding="utf-8")
    own = heads(lm, [REPORT_PROMPT], induction=2, induction_length=8)
    return out, own


def _page_grid(out):
    return page_heatmap(out, "Head roles")


def test_the_report_grid_holds_every_heads_role_and_scores(page):
    from fptrace.commands.heads.render import cell

    out, own = page
    grid = _page_grid(out)
    L = max(h.layer for h in own.heads) + 1
    assert grid["rows"] == [f"block {b}" for b in range(L)]
    for h in own.heads:
        assert grid["labels"][h.layer][h.head] == cell(h)
        tip = grid["tips"][h.layer][h.head]
        assert f"previous-token {h.previous:.3f}" in tip and f"first-token {h.first:.3f}" in tip
        assert f"induction {h.induction:.3f}" in tip
        want = "not checked" if h.loss_change is None else f"{h.loss_change:+.3f} nats"
        assert f"repeated-half loss {want}" in tip
        top = max(x for x in (h.previous, h.duplicate, h.induction) if x is not None)
        assert grid["values"][h.layer][h.head] == pytest.approx(top, rel=1e-6)


@pytest.mark.system
def test_hovering_a_cell_in_chromium_shows_its_scores(page):
    from fptrace.commands.heads.render import cell

    out, own = page
    h = own.heads[-1]
    text, tip = hover_heatmap_cell(out, "Head roles", h.layer, h.head)
    assert text == cell(h)
    assert f"block {h.layer} · head {h.head}" in tip
    assert f"previous-token {h.previous:.3f}" in tip and f"OV eigen {h.eigen:.3f}" in tip


def _plain_text(renderable) -> str:
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def test_the_tui_heads_tab_shows_the_selected_heads_role(monkeypatch):
    import asyncio
    import threading

    from fptrace.commands.heads import tui as heads_tui
    from fptrace.commands.heads.render import role_text
    from fptrace.commands.heads.tui import measure
    from fptrace.commands.tui.app import FptraceApp
    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2())
    go_on = threading.Event()  # the worker measures once the test has pressed a key meanwhile

    def held(*args):
        assert go_on.wait(60)
        return measure(*args)

    monkeypatch.setattr(heads_tui, "measure", held)

    async def go():
        app = FptraceApp(lm=lm)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("escape", "slash")
            for ch in REPORT_PROMPT:
                await pilot.press("space" if ch == " " else ch)
            await pilot.press("enter")
            await pilot.pause()
            await pilot.press("down", "down", "h")  # block 1, head 1
            await pilot.pause()
            app.show_tab("heads")
            await pilot.pause()
            assert app.busy is not None  # measured on a worker: the interface still answers
            await pilot.press("H")  # a key pressed meanwhile is refused in the status line
            await pilot.pause()
            assert app.head == 1 and "busy" in str(app.query_one("#status").render())
            await pilot.press("question_mark")  # a key that does not compute still answers
            await pilot.pause()
            assert "keys:" in str(app.query_one("#status").render())
            go_on.set()
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.busy is None
            pane = _plain_text(app.query_one("#pane-heads").render()._renderable)
            own = app.head_roles[1]
            h = next(x for x in own.heads if (x.layer, x.head) == (1, 1))
            assert f"Head 1.1: {role_text(h)}" in pane, pane
            assert f"previous-token {h.previous:.3f}" in pane
    asyncio.run(go())


def _first_copies(lm, rand, n):
    """The clean pass (heads' own, `attention`) with the model's cache: each sequence's block
    outputs and its first copy's keys and values, block by block; firsts None where the model's
    cache is not a plain growing one (kv_cache.plain_cache)."""
    from fptrace.commands.heads.core import attention
    from fptrace.models.kv_cache import cached_rows, plain_cache

    kept = []
    cache = plain_cache(lm)
    attention(lm, [it.ids for it in rand], states=kept, cache=cache)
    states = {it: [(out[b], is_tuple) for out, is_tuple in kept] for b, it in enumerate(rand)}
    firsts = None if cache is None else {it: cached_rows(cache, b, n)
                                         for b, it in enumerate(rand)}
    return states, firsts


# a block returning a tensor, a tuple; other attentions (fused QKV, MLA, post-norm); sliding
# windows and gpt-oss's sinks, whose cache keeps less: the whole-sequence path alone
CHECK_FAMILIES = ["llama", "gpt2", "gpt_neox", "deepseek_v3", "olmo2", "gemma2", "gpt_oss"]


@pytest.mark.parametrize("family", CHECK_FAMILIES)
def test_the_induction_check_is_the_same_by_every_path(family, monkeypatch):
    """The check skips the blocks before a removed head (their clean outputs stand in) and,
    where the model's cache allows, runs the second copy alone against the first copy's cached
    keys and values: every head's loss change equals the one of whole passes that zero the
    head at the second copy's positions; and a row a pass (a pass over CHECK_BYTES) too."""
    from fptrace.addresses import Head
    from fptrace.commands.heads import checks
    from fptrace.commands.heads.checks import induction_check
    from fptrace.commands.heads.patterns import induction_items

    lm = wrap_model(build_tiny(family), name=f"tiny-{family}", random_weights=True)
    rand = induction_items(lm, N, LEN, SEED)
    states, firsts = _first_copies(lm, rand, LEN)
    assert (firsts is None) == (family in ("gemma2", "gpt_oss"))  # a sliding window: no cache
    clean = 0.0  # every side is the removed-head losses themselves
    cfg = lm.model.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    every = [Head(layer, h) for layer in range(L) for h in range(H)]
    whole = induction_check(lm, rand, LEN, every, clean)
    ways = [induction_check(lm, rand, LEN, every, clean, states)]
    if firsts is not None:
        ways += [induction_check(lm, rand, LEN, every, clean, None, firsts),
                 induction_check(lm, rand, LEN, every, clean, states, firsts)]
    monkeypatch.setattr(checks, "CHECK_BYTES", 1)  # every pass one row
    ways.append(induction_check(lm, rand, LEN, every, clean, states, firsts))
    assert all("forward" not in vars(b) for b in lm.parts.blocks)  # restored
    for got in ways:
        for h in every:
            assert got[h] == pytest.approx(whole[h], abs=1e-5), h
    assert len({round(v, 6) for v in whole.values()}) > 1  # the heads' changes differ


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2"])  # gemma2: sliding windows
def test_the_induction_check_equals_a_plain_ablation_on_the_models_own_logits(family):
    """Each head's loss change (the head removed at the second copy's positions only; the check
    runs the second copy against the cached first one, stops at the final norm's input and
    takes the LM head only where the loss reads it, in passes cut by cost) equals the plain
    one: the model's full forward of the whole sequence with the head's slice of the output
    projection's input zeroed at positions ≥ LEN by a hook written here, the cross-entropy of
    the repeated half from the model's own logits, minus the clean one. Gemma 2's sliding
    windows leave its cache out: there the check runs the whole sequences."""
    from fptrace.addresses import Head
    from fptrace.commands.heads.checks import induction_check
    from fptrace.commands.heads.core import heads
    from fptrace.commands.heads.patterns import induction_items

    lm = wrap_model(build_tiny(family), name=f"tiny-{family}", random_weights=True)
    rand = induction_items(lm, N, LEN, SEED)
    cfg = lm.model.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    ids = torch.tensor([list(it.ids) for it in rand])
    gpt2 = family == "gpt2"

    def plain(head=None):
        handles = []
        if head is not None:
            blocks = lm.model.transformer.h if gpt2 else lm.model.model.layers
            attn = blocks[head.layer].attn if gpt2 else blocks[head.layer].self_attn
            proj = attn.c_proj if gpt2 else attn.o_proj

            def zero(module, args):
                z = args[0].clone()  # (B, 2·LEN, H·hd)
                z[:, LEN:, head.head * hd:(head.head + 1) * hd] = 0
                return (z,)
            handles.append(proj.register_forward_pre_hook(zero))
        try:
            with torch.no_grad():
                logits = lm.model(ids).logits.float()  # (B, 2n, V)
        finally:
            for h in handles:
                h.remove()
        return float(sum(torch.nn.functional.cross_entropy(lg[LEN:2 * LEN - 1], row[LEN + 1:])
                         for lg, row in zip(logits, ids, strict=True)) / len(rand))

    states, firsts = _first_copies(lm, rand, LEN)
    assert (firsts is None) == (family == "gemma2")  # the cached path where the cache allows
    clean = plain()
    every = [Head(layer, h) for layer in range(L) for h in range(H)]
    got = induction_check(lm, rand, LEN, every, clean, states, firsts)
    for h in every:
        assert got[h] == pytest.approx(plain(h) - clean, abs=1e-5), h
    assert len({round(v, 6) for v in got.values()}) > 1  # the heads' changes differ
    whole = heads(lm, [], seed=SEED, induction=N, induction_length=LEN, weights=False)
    assert whole.clean_loss == pytest.approx(clean, abs=1e-5)  # the clean pass's own loss
    checked = [x for x in whole.heads if x.loss_change is not None]
    for x in checked:
        assert x.loss_change == pytest.approx(got[Head(x.layer, x.head)], abs=1e-5)


def test_cheapest_passes_is_the_least_cost_cut():
    """The passes against every cut of a few items into runs, by brute force, for random
    costs; a pass too large (None) is never made unless it holds one item."""
    import itertools
    import random

    from fptrace.commands.heads.checks import cheapest_passes

    rng = random.Random(5)
    for n in range(1, 8):
        for most in (1, 3, n):
            table = {(j, i): rng.choice([None, 1.0, 2.5, 4.0, 7.0]) if i - j > 1 else
                     rng.choice([1.0, 2.5, 4.0])
                     for j in range(n) for i in range(j + 1, n + 1)}
            for (j, i), c in list(table.items()):  # too large: every larger pass too
                if c is None:
                    for a in range(j + 1):
                        for b in range(i, n + 1):
                            table[(a, b)] = None
            costs = []
            for k in range(n):
                for cuts in itertools.combinations(range(1, n), k):
                    edges = (0, *cuts, n)
                    runs = list(itertools.pairwise(edges))
                    if all(i - j <= most and (table[(j, i)] is not None or i - j == 1)
                           for j, i in runs):
                        costs.append(sum(table[r] or 0.0 for r in runs))
            got = cheapest_passes(n, most, lambda j, i, table=table: table[(j, i)])
            assert [j for j, _ in got] == [0, *[i for _, i in got][:-1]] and got[-1][1] == n
            assert all(i - j <= most and (table[(j, i)] is not None or i - j == 1)
                       for j, i in got)
            assert sum(table[r] or 0.0 for r in got) == min(costs), (n, most)


def test_prompt_batches_hold_every_prompt_once_within_their_bounds():
    """Short prompts are not padded to a long one's length (the shipped prompts' lengths:
    eight a pass padded 5-token prompts to 92), and no pass exceeds its bounds."""
    from fptrace.commands.heads.core import PROMPT_TOKENS, WEIGHTS_BYTES, prompt_batches
    from fptrace.commands.heads.patterns import Item

    lengths = [3, 4] + [5] * 22 + [6] * 4 + [7] + [8] * 4 + [10] * 3 + [90, 92, 92, 94, 104]
    items = [Item(str(k), tuple(range(n))) for k, n in enumerate(lengths)]
    got = prompt_batches(items, 270)
    assert sorted(it.name for p in got for it in p) == sorted(it.name for it in items)
    padded = sum(len(p) * max(len(it.ids) for it in p) for p in got)
    assert padded < 1.1 * sum(lengths)  # 720 for 682: one pass of the five long ones at most
    for p in got:
        T = max(len(it.ids) for it in p)
        assert len(p) * T <= PROMPT_TOKENS and len(p) * 270 * T * T * 4 <= WEIGHTS_BYTES
    alone = prompt_batches([Item("a", tuple(range(2000))), Item("b", (1, 2))], 270)
    assert [len(p) for p in alone] == [1, 1]  # a prompt over the bounds is a pass of its own


def test_a_block_at_a_time_gives_the_same_scores(monkeypatch):
    """The blocks' attention weights are tallied a few blocks at once, within WEIGHTS_BYTES (a
    long prompt's a block at a time): with a budget of one byte every block is tallied alone
    (and every prompt and sequence is a pass of its own); the scores and --head's evidence
    equal those of every block in one product."""
    from fptrace.addresses import Head
    from fptrace.commands.heads import core

    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    kw = {"seed": SEED, "induction": N, "induction_length": LEN, "check": False,
          "ov_tokens": 0, "head": Head(1, 0)}
    want = core.heads(lm, PROMPTS, **kw)
    monkeypatch.setattr(core, "WEIGHTS_BYTES", 1)
    got = core.heads(lm, PROMPTS, **kw)
    for a, b in zip(want.heads, got.heads, strict=True):
        for k in ("previous", "duplicate", "induction", "first"):
            assert getattr(b, k) == pytest.approx(getattr(a, k), rel=1e-6, abs=1e-9), (a, k)
    assert sorted((e.prompt, e.query, e.key) for e in got.evidence) == \
        sorted((e.prompt, e.query, e.key) for e in want.evidence)


def test_head_evidence_is_the_strongest_pairs_of_the_models_own_attention():
    """--head lists the strongest (query, key) pairs of its patterns, read from the model's own
    attention (output_attentions): on a prompt of hundreds of duplicate-token pairs, the
    weights listed are the largest of every previous-token and duplicate-token pair."""
    from fptrace.addresses import Head
    from fptrace.commands.heads import core
    from fptrace.commands.heads.patterns import EVIDENCE

    model = build_tiny("llama")
    lm = wrap_model(model, name="tiny-llama", random_weights=True)
    ids = [5, 6, 7] * 14  # 42 tokens
    r = core.heads(lm, [ids], induction=0, check=False, ov_tokens=0, head=Head(1, 1))
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        A = model(torch.tensor([ids]), output_attentions=True).attentions[1][0, 1].double()
    pairs = [float(A[i, i - 1]) for i in range(2, len(ids))]
    pairs += [float(A[i, j]) for i in range(len(ids)) for j in range(1, i) if ids[j] == ids[i]]
    assert len(pairs) > 10 * EVIDENCE
    assert [e.weight for e in r.evidence] == pytest.approx(
        sorted(pairs, reverse=True)[:EVIDENCE], rel=1e-5)


def test_what_would_not_fit_in_memory_is_refused_before_any_pass(monkeypatch):
    """One line (BadInput), before any forward pass, where the longest pass (its attention
    weights read whole) or what the induction check holds for every sequence would not fit in
    the free memory; neither where they fit."""
    from fptrace.commands.heads import core
    from fptrace.errors import BadInput
    from fptrace.models import memory

    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)

    def no_pass(*a, **k):
        raise AssertionError("a pass ran")

    monkeypatch.setattr(core, "attention", no_pass)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10 << 10)  # 10 KiB
    with pytest.raises(BadInput, match=r"pass over 42 tokens .* is free on cpu"):
        core.heads(lm, [[5, 6, 7] * 14], induction=0, check=False, ov_tokens=0)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10 << 20)  # 10 MiB
    with pytest.raises(BadInput, match=r"2,000 induction sequences of 12 tokens \(each one's "
                       r"block outputs .* held for the check\)"):
        core.heads(lm, PROMPTS, induction=2000, induction_length=6, ov_tokens=0)
    with pytest.raises(AssertionError, match="a pass ran"):  # without the check: it fits
        core.heads(lm, PROMPTS, induction=2000, induction_length=6, ov_tokens=0, check=False)
    # the OV scores' float32 copies of a 50,000-token vocabulary (about 50 MB): refused; with
    # --ov-tokens 0 they are not made
    big = wrap_model(build_tiny("llama", vocab_size=50000), name="tiny-llama-50k",
                     random_weights=True)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 20 << 20)  # 20 MiB
    with pytest.raises(BadInput, match=r"the OV scores over 8 sampled tokens .* needs about"):
        core.heads(big, PROMPTS, induction=0, check=False, ov_tokens=8)
    with pytest.raises(AssertionError, match="a pass ran"):
        core.heads(big, PROMPTS, induction=0, check=False, ov_tokens=0)
    # a trillion sequences: refused before they are drawn (drawing them would never end)
    with pytest.raises(BadInput, match=r"1,000,000,000,000 induction sequences of 12 tokens "
                       r"needs about .*; give fewer induction sequences$"):
        core.heads(lm, PROMPTS, induction=10 ** 12, induction_length=6, ov_tokens=0,
                   check=False)
