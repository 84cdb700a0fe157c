"""Figures and the HTML report: real images of the traced numbers, a report that a real
browser opens offline, and clean failures for bad output paths."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import make_gpt2_folder
from typer.testing import CliRunner

from fptrace.cli.main import app

runner = CliRunner()
PROMPT = "The capital of France is"


def image_ok(path, min_w=400, min_h=300):
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    h, w = img.shape[:2]
    assert w >= min_w and h >= min_h
    assert float(img[..., :3].std()) > 0.02  # not a blank page
    return img


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_gpt2_folder(tmp_path_factory.mktemp("pic-model"))[0])


@pytest.mark.slow
def test_trace_figure_plots_the_trace(smollm, tmp_path):
    from fptrace.commands.run.render import trace_figure
    from fptrace.core.trace import run_trace
    from fptrace.render.figures import save

    t = run_trace(smollm, PROMPT, lens_grid=True)
    fig, series = trace_figure(t)
    assert series["resid_norm_last"] == [l.resid_norm_last for l in t.layers]
    assert series["resid_norm_mean"] == [l.resid_norm_mean for l in t.layers]
    assert series["mlp_norm_last"] == [l.mlp_norm_last for l in t.layers[1:]]
    assert series["top_k"][0] == (" Paris", t.top_k[0].prob)
    # the heatmap's last column is the per-layer logit lens of the table
    assert [row[-1] for row in series["lens_text"]] == [l.lens_text for l in t.layers]
    assert len(series["lens_prob"]) == 31 and len(series["lens_prob"][0]) == 5
    out = tmp_path / "trace.png"
    save(fig, str(out))
    image_ok(out, 1000, 600)


def test_cli_plots(folder, tmp_path):
    png = tmp_path / "trace.png"
    r = runner.invoke(app, ["run", "The cat sat", "-m", folder, "--plot", str(png)])
    assert r.exit_code == 0, r.stderr
    image_ok(png)
    svg = tmp_path / "attn.svg"
    r = runner.invoke(app, ["explain", "The cat sat", "-m", folder, "--plot", str(svg)])
    assert r.exit_code == 0, r.stderr
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()


def test_attention_figure_plots_every_head(folder):
    from fptrace.commands.explain.core import explain
    from fptrace.commands.explain.render import attention_figure
    from fptrace.models.loading import load_model

    e = explain(load_model(folder), "The cat sat", layer=1, head=1, all_heads=True)
    fig, series = attention_figure(e)
    assert series["heads"] == [0, 1]
    assert series["weights"][1] == [list(r) for r in e.matrices[1].rows]  # the shown head
    for w in series["weights"]:
        for i, row in enumerate(w):
            assert abs(sum(row) - 1) < 1e-5 and all(v == 0 for v in row[i + 1:])


@pytest.mark.parametrize("name,needle", [
    ("missing/trace.png", "does not exist"),
    ("trace.xyz", "extension"),
    ("trace", "extension"),
])
def test_bad_plot_paths(folder, tmp_path, name, needle):
    target = tmp_path / name
    r = runner.invoke(app, ["run", "The cat sat", "-m", folder, "--plot", str(target)])
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("fptrace: error:") and needle in line
    assert "loaded" not in r.stderr  # refused before loading
    assert sorted(os.listdir(tmp_path)) == []  # nothing half-written


def test_unwritable_output(folder, tmp_path):
    if os.geteuid() == 0:  # root writes anywhere a mode allows; /proc refuses everyone
        target = "/proc/fptrace-report.html"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = str(ro / "report.html")
    r = runner.invoke(app, ["report", "The cat sat", "-m", folder, "--out", target])
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("fptrace: error:") and target in line
    assert "Traceback" not in r.output


def _chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.system
@pytest.mark.skipif(_chromium() is None, reason="Debian's chromium is not installed "
                                                 "(.ci/run installs it)")
def test_report_opens_offline_in_chromium(folder, tmp_path):
    pytest.importorskip("playwright")
    from playwright.sync_api import sync_playwright

    out = tmp_path / "report.html"
    r = runner.invoke(app, ["report", "The cat sat", "-m", folder, "--out", str(out),
                            "--layer", "1", "--noise", " cat"])
    assert r.exit_code == 0, r.stderr
    html = out.read_text(encoding="utf-8")
    assert "causal tracing" in html and "direct logit attribution" in html
    # its script and style are inline (tests/test_page.py drives them): nothing is fetched
    assert "<script src" not in html and "<link" not in html and "http://" not in html.replace(
        "http://www.w3.org", "") and "https://" not in html
    requests, failed, console, errors = [], [], [], []
    profile = tmp_path / "profile"
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(profile), executable_path=_chromium(), headless=True, chromium_sandbox=False,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"],
            viewport={"width": 1280, "height": 900})
        page = browser.new_page()
        page.on("request", lambda req: requests.append(req.url))
        page.on("requestfailed", lambda req: failed.append(req.url))
        page.on("console", lambda m: console.append((m.type, m.text)))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(out.as_uri(), wait_until="load")
        text = page.inner_text("body")
        shot = tmp_path / "shot.png"
        page.screenshot(path=str(shot), full_page=False)
        n_images = page.evaluate("Array.from(document.images).filter(i => i.complete && "
                                 "i.naturalWidth > 0).length")
        browser.close()
    assert not failed and not errors
    assert [c for c in console if c[0] == "error"] == []
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    assert n_images == 5  # trace, attention, attribution, QK split, causal tracing decoded
    image_ok(shot, 1000, 600)
    from fptrace.core.trace import run_trace
    from fptrace.models.loading import load_model

    t = run_trace(load_model(folder), "The cat sat")
    for tok in ("The", "␣cat", "␣sat"):
        assert tok in text
    top1 = t.top_k[0].text.replace(" ", "␣")
    assert f"Top-1 next token: {top1}" in text
