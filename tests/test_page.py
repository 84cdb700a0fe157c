"""The report's interactive page: the data it shows (the lens grid's cells, checked against the
model's own hidden states, module outputs and logits), the page itself (one file, its data
embedded as JSON from the typed results), `--html` on the analysis commands, and a real
browser that hovers, clicks and presses keys with every network request refused."""

from __future__ import annotations

import json
import re

import pytest
import torch

from fptrace.core.trace import run_trace


def _ids(lm, n=6, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, lm.config.vocab_size, (n,), generator=g).tolist()


def _own_streams(lm, ids):
    """The model's own numbers: hidden states, logits at every position, and the outputs of
    the modules whose outputs the stream receives (hooks of this test, not fptrace's)."""
    outs: dict[tuple[str, int], torch.Tensor] = {}
    handles = []
    for name, mods in (("attn", lm.parts.attn_adds), ("mlp", lm.parts.mlp_adds),
                       ("block", lm.parts.blocks)):
        for i, m in enumerate(mods):
            def grab(_m, _a, out, key=(name, i)):
                outs[key] = (out[0] if isinstance(out, tuple) else out).detach().float()
            handles.append(m.register_forward_hook(grab))
    try:
        with torch.inference_mode():
            ref = lm.model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return ref, outs


def test_the_pages_script_and_style_are_files_that_parse():
    """page.js, pagegraph.js and page.css are package files a JavaScript and a CSS parser read
    without an error (the parsers do find errors: a broken copy of each fails), and build_html
    inlines them unchanged."""
    from importlib.resources import files

    import esprima
    import tinycss2

    from fptrace.render.page import SCRIPTS, inlined

    def css_errors(text):
        rules = tinycss2.parse_stylesheet(text, skip_comments=True, skip_whitespace=True)
        found = [r for r in rules if r.type == "error"]
        for r in rules:
            if r.type == "qualified-rule":
                found += [d for d in tinycss2.parse_declaration_list(
                    r.content, skip_comments=True, skip_whitespace=True) if d.type == "error"]
        return found

    assert SCRIPTS == ("page.js", "pagegraph.js")
    for name in SCRIPTS:
        js = files("fptrace.render").joinpath(name).read_text(encoding="utf-8")
        assert inlined(name) == js
        assert esprima.parseScript(js).body
        with pytest.raises(esprima.Error):
            esprima.parseScript(js.replace("function", "functio", 1))
    css = files("fptrace.render").joinpath("page.css").read_text(encoding="utf-8")
    assert inlined("page.css") == css
    assert css_errors(css) == [] and len(css) > 1000
    assert css_errors(css.replace(";", " ;}", 1)) or css_errors(css.replace(":", "", 1))


def test_a_page_file_that_would_end_its_element_is_refused(monkeypatch):
    import fptrace.render.page as page

    class Fake:
        def __init__(self, text):
            self.text = text

        def joinpath(self, name):
            return self

        def read_text(self, encoding):
            return self.text

    monkeypatch.setattr(page, "files", lambda package: Fake("var a = 1; // </SCRIPT>"))
    with pytest.raises(ValueError, match="page.js holds </script"):
        page.inlined("page.js")
    monkeypatch.setattr(page, "files", lambda package: Fake("a { color: red } </style>"))
    with pytest.raises(ValueError, match="page.css holds </style"):
        page.inlined("page.css")


def test_lens_grid_cells_are_what_the_model_computed(tiny):
    ids = _ids(tiny)
    t = run_trace(tiny, ids, lens_grid=True)
    ref, outs = _own_streams(tiny, ids)
    L = len(tiny.parts.blocks)
    T = len(ids)
    assert t.lens_positions == tuple(range(T)) and len(t.lens_grid) == L + 1
    # the streams: the embedding and each block's output (hidden_states[L] has the final norm)
    streams = [ref.hidden_states[0][0]] + [outs[("block", i)][0] for i in range(L)]
    cap = getattr(tiny.config, "final_logit_softcapping", None)
    for k, row in enumerate(t.lens_grid):
        assert len(row) == T
        with torch.inference_mode():
            logits = tiny.model.lm_head(tiny.parts.final_norm(streams[k])).float()  # (T, V)
            if cap:
                logits = torch.tanh(logits / cap) * cap
        probs = logits.softmax(-1)
        for j, c in enumerate(row):
            assert c.resid_norm == pytest.approx(float(streams[k][j].norm()), rel=1e-5)
            p, idx = probs[j].topk(len(c.top_k))
            assert [x.prob for x in c.top_k] == pytest.approx(p.tolist(), rel=1e-4, abs=1e-7)
            assert c.top_k[0].id == int(idx[0]) and (c.id, c.prob) == (c.top_k[0].id,
                                                                      c.top_k[0].prob)
            for x in c.top_k:
                assert x.logit == pytest.approx(float(logits[j, x.id]), rel=1e-4, abs=1e-5)
            if k == 0:
                assert c.added_norm is c.attn_norm is c.mlp_norm is None
                continue
            added = streams[k][j] - streams[k - 1][j]
            assert c.added_norm == pytest.approx(float(added.norm()), rel=1e-4, abs=1e-6)
            if c.attn_norm is None:  # withheld only where the split does not add up
                parts = outs[("attn", k - 1)][0, j] + outs[("mlp", k - 1)][0, j]
                assert float((added - parts).norm()) > 1e-4 * float(added.norm())
                continue
            assert c.attn_norm == pytest.approx(float(outs[("attn", k - 1)][0, j].norm()),
                                                rel=1e-5)
            assert c.mlp_norm == pytest.approx(float(outs[("mlp", k - 1)][0, j].norm()),
                                               rel=1e-5)
    # the last row's lens is the model's own prediction at every position
    own = ref.logits[0].float().softmax(-1)
    for j, c in enumerate(t.lens_grid[-1]):
        assert c.id == int(own[j].argmax()) and c.prob == pytest.approx(float(own[j].max()),
                                                                         rel=1e-4)
    # and the grid agrees with the last-position rows of the table
    for k, layer in enumerate(t.layers):
        assert t.lens_grid[k][-1].resid_norm == pytest.approx(layer.resid_norm_last, rel=1e-5)
        if layer.attn_norm_last is not None and t.lens_grid[k][-1].attn_norm is not None:
            assert t.lens_grid[k][-1].attn_norm == pytest.approx(layer.attn_norm_last, rel=1e-5)


# ---- the page and --html (a tiny GPT-2 folder with the real GPT-2 tokenizer)

from conftest import make_gpt2_folder  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from fptrace.cli.main import app  # noqa: E402

runner = CliRunner()
PROMPT = "The cat sat on"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_gpt2_folder(tmp_path_factory.mktemp("page-model"), n_layer=3)[0])


@pytest.fixture(scope="module")
def lm(folder):
    from fptrace.models.loading import load_model

    return load_model(folder)


@pytest.fixture(scope="module")
def report(folder, tmp_path_factory):
    """The report with every section that offers the page data: explain (block 1), attribution,
    causal tracing and ablation."""
    out = tmp_path_factory.mktemp("page") / "report.html"
    r = runner.invoke(app, ["report", PROMPT, "-m", folder, "--out", str(out), "--layer", "1",
                            "--noise", " cat", "--ablate"])
    assert r.exit_code == 0, r.stderr
    return out


def _block(html, name):
    m = re.search(rf'<script type="application/json" id="{name}">(.*?)</script>', html, re.S)
    assert m, name
    return json.loads(m.group(1))


def _section(data, title):
    return next(s for s in data["sections"] if s["title"].startswith(title))


def test_report_page_is_one_file_holding_the_typed_results(report, lm):
    from fptrace.commands.ablate.core import ablate
    from fptrace.commands.attribute.core import attribute
    from fptrace.commands.explain.core import explain
    from fptrace.commands.patch.core import patch

    html = report.read_text(encoding="utf-8")
    # one file: inline style and script, nothing to fetch, and a policy that forbids fetching
    assert not re.search(r"<(script|img|iframe|link)[^>]*\s(src|href)=\"(?!data:)", html)
    assert "<link" not in html and "@import" not in html and "url(" not in html
    # the SVG namespace is a name the drawing's script gives createElementNS, never fetched
    names = html.replace('"http://www.w3.org/2000/svg"', '"svg-namespace"')
    assert "http://" not in names and "https://" not in names
    assert "default-src 'none'" in html
    t = run_trace(lm, PROMPT, lens_grid=True)
    trace = _block(html, "fptrace-trace")
    assert trace["kind"] == "trace" and trace["tokens"] == [
        {"position": x.position, "id": x.id, "text": x.text, "piece": x.piece,
         "template": x.template} for x in t.tokens]
    for row, own in zip(trace["lens_grid"], t.lens_grid, strict=True):
        for c, o in zip(row, own, strict=True):
            assert (c["id"], c["text"]) == (o.id, o.text)
            assert c["prob"] == pytest.approx(o.prob, rel=1e-6)
            assert c["resid_norm"] == pytest.approx(o.resid_norm, rel=1e-6)
            assert [x["id"] for x in c["top_k"]] == [x.id for x in o.top_k]
    data = _block(html, "fptrace-data")
    grid = _section(data, "Causal tracing")["heatmaps"][0]
    own_patch = patch(lm, PROMPT, noise=" cat", seed=0)
    assert grid["values"] == [pytest.approx(list(r), rel=1e-6) for r in own_patch.grid]
    assert grid["blocks"] == list(range(len(own_patch.grid)))
    grid = _section(data, "Ablation")["heatmaps"][0]
    own_ablation = ablate(lm, PROMPT, all_heads=True, all_mlps=True)
    assert grid["values"] == [pytest.approx(list(h) + [m], rel=1e-6, abs=1e-9) for h, m in
                              zip(own_ablation.head_grid, own_ablation.mlp_column)]
    assert grid["columns"][-1] == "MLP"
    own_attr = attribute(lm, PROMPT)
    blocks = _section(data, "Direct logit attribution")["blocks"]
    for b, la in zip(blocks, own_attr.layers, strict=True):
        assert b["block"] == la.layer
        assert b["rows"][0][1] == pytest.approx(la.attn, rel=1e-6, abs=1e-9)
        assert b["rows"][1][1] == pytest.approx(la.mlp, rel=1e-6, abs=1e-9)
    steps = _section(data, "Block 1")["blocks"][0]
    own_explain = explain(lm, PROMPT, layer=1, head=0)
    assert steps["block"] == 1
    assert [r[0] for r in steps["rows"]] == [f"{s.index}. {s.name}" for s in own_explain.steps]


def test_a_prompt_cannot_end_the_data_block(folder, tmp_path):
    out = tmp_path / "p.html"
    hostile = "</script><script>alert(1)</script> <!-- x"
    r = runner.invoke(app, ["run", hostile, "-m", folder, "--html", str(out)])
    assert r.exit_code == 0, r.stderr
    html = out.read_text(encoding="utf-8")
    from fptrace.render.page import SCRIPTS

    # the trace's data block, the page data's and one per script of the page's own: no more
    n = 2 + len(SCRIPTS)
    assert html.count("<script") == n and html.count("</script>") == n
    assert _block(html, "fptrace-trace")["prompt"] == hostile


def test_a_right_to_left_override_is_inert_in_the_title_and_prompt_line(folder, tmp_path):
    """U+202E reverses what follows it wherever it is live: the page writes it (and every
    other character the terminal escapes) as its escape in the title and the prompt line, as
    the terminal does; the trace's JSON keeps the prompt as typed."""
    out = tmp_path / "p.html"
    hostile = "invoice\u202egpj.exe\u202c and\nmore"
    r = runner.invoke(app, ["run", hostile, "-m", folder, "--html", str(out)])
    assert r.exit_code == 0, r.stderr
    page = out.read_text(encoding="utf-8")
    head, _, _ = page.partition('<script type="application/json"')
    assert "\u202e" not in head and "\u202c" not in head
    assert "<title>fptrace: invoice\\u202egpj.exe\\u202c and\\nmore</title>" in head
    assert "<p>Prompt: <code>invoice\\u202egpj.exe\\u202c and\\nmore</code></p>" in head
    assert _block(page, "fptrace-trace")["prompt"] == hostile


@pytest.mark.parametrize("argv,title", [
    (["run"], None),
    (["explain", "--layer", "1"], "Block 1"),
    (["attribute"], "Direct logit attribution"),
    (["attribute", "--qk", "1.0"], "Direct logit attribution"),
    (["patch", "--noise", " cat"], "Causal tracing"),
    (["ablate", "--all-heads", "--all-mlps"], "Ablation"),
    (["steer", "--add", " dog", "--subtract", " cat", "--layer", "0"], "Steering"),
])
def test_html_on_the_analysis_commands(folder, tmp_path, argv, title):
    out = tmp_path / "page.html"
    r = runner.invoke(app, [argv[0], PROMPT, "-m", folder, *argv[1:], "--json",
                            "--html", str(out)])
    assert r.exit_code == 0, r.stderr
    json.loads(r.stdout)  # stdout is still the result's JSON, and only that
    assert f"wrote {out}" in r.stderr
    html = out.read_text(encoding="utf-8")
    trace = _block(html, "fptrace-trace")
    assert trace["lens_grid"] and trace["prompt"] == PROMPT
    data = _block(html, "fptrace-data")
    if title is not None:
        assert _section(data, title)
    if argv[:2] == ["attribute", "--qk"]:
        maps = _section(data, title)["heatmaps"]
        assert any(m["title"].startswith("head 1.0's score") for m in maps)
    # written by fptrace: a second run replaces it without --force
    r = runner.invoke(app, [argv[0], PROMPT, "-m", folder, *argv[1:], "--html", str(out)])
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("name,argv,needle", [
    ("page.txt", [], "a report is an .html file"),
    ("missing/page.html", [], "does not exist"),
    ("theirs.html", [], "not a file fptrace wrote"),
    ("page.html", ["--engine", "llama.cpp"], "--html is not available with --engine llama.cpp"),
])
def test_bad_html_paths_are_one_line_before_loading(folder, tmp_path, name, argv, needle):
    theirs = tmp_path / "theirs.html"
    theirs.write_text("<p>mine</p>")
    r = runner.invoke(app, ["run", PROMPT, "-m", folder, *argv, "--html", str(tmp_path / name)])
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fptrace: error: ") and needle in lines[0]
    assert "Traceback" not in r.output
    assert theirs.read_text() == "<p>mine</p>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.html"]


def test_html_replaces_someone_elses_file_with_force(folder, tmp_path):
    theirs = tmp_path / "theirs.html"
    theirs.write_text("<p>mine</p>")
    r = runner.invoke(app, ["explain", PROMPT, "-m", folder, "--html", str(theirs), "--force"])
    assert r.exit_code == 0, r.stderr
    assert 'id="fptrace-trace"' in theirs.read_text(encoding="utf-8")


# ---- a real browser: every request refused, hover, click, keys

def _chromium():
    import shutil

    return next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


def _numbers(text, name):
    """The value after `name = ` in a tooltip's text."""
    m = re.search(re.escape(name) + r" = (\S+)", text)
    assert m, (name, text)
    return float(m.group(1))


def _rows(page, selector):
    return page.evaluate(
        "s => Array.from(document.querySelectorAll(s + ' tbody tr')).map("
        "tr => Array.from(tr.cells).map(td => td.textContent))", selector)


@pytest.mark.system
@pytest.mark.skipif(_chromium() is None, reason="Debian's chromium is not installed "
                                                 "(scripts/install_browser.sh installs it)")
def test_the_page_in_chromium_with_every_request_refused(report, lm, tmp_path):
    pytest.importorskip("playwright")
    from playwright.sync_api import sync_playwright

    from fptrace.commands.attribute.core import attribute
    from fptrace.commands.patch.core import patch
    from fptrace.render.text import visible

    t = run_trace(lm, PROMPT, lens_grid=True)  # the typed results the page must show
    own_patch = patch(lm, PROMPT, noise=" cat", seed=0)
    own_attr = attribute(lm, PROMPT)
    uri = report.as_uri()
    refused, requests, console, errors = [], [], [], []

    def route(r):
        if r.request.url == uri:
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=_chromium(), headless=True, chromium_sandbox=False,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.route("**/*", route)
        page.on("request", lambda req: requests.append(req.url))
        page.on("console", lambda m: console.append((m.type, m.text)))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(uri, wait_until="load")
        n_images = page.evaluate("Array.from(document.images).filter(i => i.complete && "
                                 "i.naturalWidth > 0).length")
        L1, N = len(t.lens_grid), len(t.lens_positions)
        assert page.locator("#lens tbody td").count() == L1 * N

        # hover a lens cell: its tooltip holds the trace's values for that cell
        k, j = 2, 1
        page.hover(f'#lens td[data-row="{k}"][data-pos="{j}"]')
        tip = page.inner_text("#tip")
        cell = t.lens_grid[k][j]
        assert f"block {k - 1} · position {t.lens_positions[j]}" in tip
        assert f"“{visible(cell.text)}” (id {cell.id})" in tip
        assert _numbers(tip, "p") == pytest.approx(cell.prob, rel=1e-5)
        assert _numbers(tip, "‖resid‖") == pytest.approx(cell.resid_norm, rel=1e-5)
        assert _numbers(tip, "‖attn‖") == pytest.approx(cell.attn_norm, rel=1e-5)
        assert _numbers(tip, "‖mlp‖") == pytest.approx(cell.mlp_norm, rel=1e-5)

        # click a token: its row across blocks opens
        assert page.is_hidden("#token-panel")
        page.click('.strip button[data-pos="0"]')
        assert page.is_visible("#token-panel")
        assert f"position {t.lens_positions[0]}" in page.inner_text("#token-panel h3")
        rows = _rows(page, "#token-panel")
        assert len(rows) == L1
        for k, row in enumerate(rows):
            c = t.lens_grid[k][0]
            assert float(row[1]) == pytest.approx(c.resid_norm, rel=1e-5)
            assert row[5] == visible(c.text) and float(row[6]) == pytest.approx(c.prob, rel=1e-5)
            if k:
                assert float(row[3]) == pytest.approx(c.attn_norm, rel=1e-5)
                assert float(row[4]) == pytest.approx(c.mlp_norm, rel=1e-5)

        # click a block: what its attention and MLP added at each position, its explain steps
        # and its attribution terms
        page.click('#lens th button[data-row="2"]')
        assert page.is_visible("#block-panel")
        panel = page.inner_text("#block-panel")
        assert "Block 1: what its attention and MLP added" in panel
        rows = _rows(page, "#block-panel")
        for j in range(N):
            c = t.lens_grid[2][j]
            assert float(rows[j][4]) == pytest.approx(c.attn_norm, rel=1e-5)
            assert float(rows[j][5]) == pytest.approx(c.mlp_norm, rel=1e-5)
        assert "Explain: block 1 recomputed step by step" in panel
        terms = {r[0]: r[1] for r in rows if len(r) == 2}
        la = own_attr.layers[1]
        assert float(terms["attention (every head and the W_O bias)"]) == pytest.approx(
            la.attn, rel=1e-5, abs=1e-9)
        assert float(terms["MLP"]) == pytest.approx(la.mlp, rel=1e-5, abs=1e-9)

        # keys: arrows move the selection, Escape closes, Enter opens
        page.click('#lens td[data-row="1"][data-pos="1"]')
        assert page.get_attribute("#explore", "data-pos") == "1"
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowDown")
        assert (page.get_attribute("#explore", "data-pos"),
                page.get_attribute("#explore", "data-row")) == ("2", "2")
        assert page.evaluate("document.activeElement.dataset.row + ','"
                             " + document.activeElement.dataset.pos") == "2,2"
        assert page.get_attribute('.strip button[data-pos="2"]', "aria-pressed") == "true"
        assert f"position {t.lens_positions[2]}" in page.inner_text("#token-panel h3")
        for _ in range(N + 2):
            page.keyboard.press("ArrowLeft")
        page.keyboard.press("ArrowUp")
        assert (page.get_attribute("#explore", "data-pos"),
                page.get_attribute("#explore", "data-row")) == ("0", "1")
        page.keyboard.press("Escape")
        assert page.is_hidden("#token-panel") and page.is_hidden("#block-panel")
        page.keyboard.press("Enter")
        assert page.is_visible("#token-panel") and page.is_visible("#block-panel")
        assert "Block 0:" in page.inner_text("#block-panel h3")

        # another section's heatmap: causal tracing, hovered cell by cell
        box = page.locator(".section-heatmap", has_text="Causal tracing")
        box.locator('td[data-i="1"][data-j="2"]').hover()
        tip = page.inner_text("#tip")
        assert "block 1 · 2 ␣sat" in tip
        assert float(tip.rsplit("= ", 1)[1]) == pytest.approx(own_patch.grid[1][2], rel=1e-5)
        box.locator('td[data-i="1"][data-j="2"]').click()  # a cell opens its block
        assert "Block 1:" in page.inner_text("#block-panel h3")

        # the route sees what a page asks for: a page that fetches an image is caught
        fetching = tmp_path / "fetching.html"
        fetching.write_text('<img src="http://example.invalid/x.png">')
        other = browser.new_page()
        caught = []
        other.route("**/*", lambda r: (caught.append(r.request.url), r.abort())
                    if r.request.url != fetching.as_uri() else r.continue_())
        other.goto(fetching.as_uri(), wait_until="load")
        assert caught == ["http://example.invalid/x.png"]
        browser.close()

    assert refused == [] and errors == []
    assert [c for c in console if c[0] == "error"] == []
    assert [u for u in requests if u != uri and not u.startswith("data:")] == []
    # trace, attention, attribution, QK split, causal tracing, ablation: decoded, none refused
    assert n_images == 6


def test_html_on_features_and_diff_deep(folder, lm, tmp_path):
    from test_features_dictionary import weights, write_saelens

    from fptrace.commands.diff.deep import deep_diff
    from fptrace.models.loading import load_model

    d = int(lm.config.hidden_size)
    sae = write_saelens(tmp_path / "sae", weights(d_in=d, n=4 * d, d_out=d),
                        hook="blocks.1.hook_resid_post")
    out = tmp_path / "features.html"
    r = runner.invoke(app, ["features", PROMPT, "-m", folder, "--sae", str(sae),
                            "--html", str(out)])
    assert r.exit_code == 0, r.stderr
    maps = _section(_block(out.read_text(encoding="utf-8"), "fptrace-data"),
                    "Features")["heatmaps"]
    assert len(maps) == 1 and len(maps[0]["columns"]) == len(_block(
        out.read_text(encoding="utf-8"), "fptrace-trace")["tokens"])
    r = runner.invoke(app, ["features", "train", "p.txt", "--html", str(tmp_path / "t.html")])
    assert r.exit_code == 2 and "--html is the page of a prompt's features" in r.stderr

    out = tmp_path / "diff.html"
    r = runner.invoke(app, ["diff", PROMPT, "-m", folder, "--dtype-b", "bfloat16", "--deep",
                            "--html", str(out)])
    assert r.exit_code in (0, 1), r.stderr
    data = _block(out.read_text(encoding="utf-8"), "fptrace-data")
    own = deep_diff(lm, load_model(folder, dtype="bfloat16"), PROMPT)
    stream, points = _section(data, "Two runs compared")["heatmaps"]
    assert stream["values"] == [[pytest.approx(r.rel_diff, rel=1e-6)] for r in own.layers]
    assert points["columns"] == list(own.deep.points)
    r = runner.invoke(app, ["diff", PROMPT, "The dog", "-m", folder, "--html", str(out)])
    assert r.exit_code == 2 and "--html is not an option of `diff` (two prompts" in r.stderr \
        and "it belongs to `diff --deep`" in r.stderr


@pytest.mark.slow
def test_the_bundled_models_default_report_is_under_2_mb(smollm, tmp_path):
    """docs/report.md gives the measured size; the goal is 2 MB (PNGs shrunk, never data
    dropped, if it grew past it)."""
    out = tmp_path / "r.html"
    r = runner.invoke(app, ["report", "-o", str(out), "The capital of France is"])
    assert r.exit_code == 0, r.stderr
    size = out.stat().st_size
    assert size <= 2_000_000, size
    html = out.read_text(encoding="utf-8")
    trace = _block(html, "fptrace-trace")
    assert len(trace["lens_grid"]) == 31 and len(trace["lens_grid"][0]) == 5
    assert all(len(c["top_k"]) == 5 for row in trace["lens_grid"] for c in row)
    assert html.count('src="data:image/png;base64,') == 4
