"""fptrace tui, driven headless by Textual's Pilot: the layer table is run_trace's result, moving
the cursor shows that layer's lens top-k, switching heads changes the heatmap, errors are
messages in the app, quitting removes every hook and frees the model; a text snapshot of the
screen at 120×40 is a golden file (regenerate: pytest tests/test_tui.py --update-golden).
"""

from __future__ import annotations

import asyncio
import gc
import weakref

from conftest import tiny_gpt2

from fptrace.commands.tui.app import FptraceApp
from fptrace.core.trace import lens_top_k, run_trace
from fptrace.models.loading import load_model


def _model():
    return load_model(tiny_gpt2(), random_weights=True, seed=0, device="cpu")


def _text(app, selector):
    return str(app.query_one(selector).render())


async def _type(pilot, text):
    for ch in text:
        await pilot.press("space" if ch == " " else ch)


def test_table_equals_run_trace_and_keys_work():
    lm = _model()
    want = run_trace(lm, "The cat sat on the mat", snippet=lm.config.hidden_size)

    async def go():
        app = FptraceApp(lm=lm)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("escape", "slash")  # leave the prompt, then / comes back to it
            await _type(pilot, "The cat sat on the mat")
            await pilot.press("enter")
            await pilot.pause()
            table = app.query_one("#layers")
            assert table.row_count == len(want.layers)
            got = app.trace
            assert got.prompt == "The cat sat on the mat", got.prompt
            assert [r.resid_norm_last for r in got.layers] == \
                [r.resid_norm_last for r in want.layers]
            assert [t.id for t in got.top_k] == [t.id for t in want.top_k]
            row = [str(c) for c in table.get_row_at(2)]
            assert row[0] == "1" and row[1] == f"{want.layers[2].resid_norm_last:.2f}"
            await pilot.press("down", "down")
            await pilot.pause()
            assert app.layer == 2
            lens = lens_top_k(lm, want.layers[2].snippet, 10)
            pane = _text(app, "#pane-layer")
            assert "block 1" in pane and lens[0].text.strip() in pane
            before = _text(app, "#pane-heads")
            await pilot.press("h")
            await pilot.pause()
            assert app.head == 1 and _text(app, "#pane-heads") != before
            assert (app.qk.layer, app.qk.head, app.qk.query) == (1, 1, 5) and app.qk.ok
            await pilot.press("t")
            await pilot.pause()
            assert app.attribution.target.id == want.top_k[1].id and app.attribution.ok
    asyncio.run(go())


def test_errors_are_messages_and_the_app_stays_usable():
    lm = _model()

    async def go():
        app = FptraceApp(lm=lm)
        async with app.run_test(size=(120, 40)) as pilot:
            # the prompt box has the focus at start; the tiny GPT-2 reads 32 positions (the value
            # set, not typed: 200 key presses took 15 s, and typing is test_table_equals_...'s)
            app.query_one("#prompt").value = "word " * 40
            await pilot.press("enter")
            await pilot.pause()
            assert "reads at most 32" in _text(app, "#status") and app.trace is None
            app.query_one("#prompt").value = "The cat"
            await pilot.press("escape", "slash", "enter")
            await pilot.pause()
            assert app.trace is not None
    asyncio.run(go())


def test_a_model_that_fails_to_load_is_a_message():
    from fptrace.models.options import LoadOptions

    async def go():
        app = FptraceApp(load=LoadOptions(model="/nonexistent/model"))
        async with app.run_test(size=(120, 40)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert "cannot load the model" in _text(app, "#status")
    asyncio.run(go())


def test_quitting_removes_hooks_and_frees_the_model():
    from fptrace.models.options import LoadOptions

    async def go():
        app = FptraceApp(load=LoadOptions(model=tiny_gpt2(), random_weights=True), prompt="The cat")
        async with app.run_test(size=(120, 40)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            model = app.lm.model
            ref = weakref.ref(model)
            hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
                        for m in model.modules())
            assert hooks == 0
            del model
            await pilot.press("q")
        return ref

    ref = asyncio.run(go())
    gc.collect()
    assert ref() is None


def test_snapshot_120x40(golden):
    lm = _model()

    async def go():
        app = FptraceApp(lm=lm, prompt="The cat sat on the mat")
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            return app.export_screenshot()

    svg = asyncio.run(go())
    import re

    text = re.sub(r"<[^>]+>", "", svg)  # the characters on screen, without the SVG markup
    text = re.sub(r"&#160;|&nbsp;", " ", text)
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    got = "\n".join(lines[lines.index(next(l for l in lines if "layer" in l)):]) + "\n"
    golden(got)


def test_what_if_keys_ablate_and_steer_the_selected_block():
    lm = _model()

    async def go():
        app = FptraceApp(lm=lm, prompt="The cat sat on the mat")
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await pilot.press("down", "down", "a")
            await pilot.pause()
            assert app.what_if.kind == "ablation" and app.what_if.ok
            assert [r.parts for r in app.what_if.runs] == [("1.0",), ("mlp 1",),
                                                            ("1.0", "mlp 1")]
            assert app.what_if.target.id == app.trace.top_k[0].id
            assert "removed head 1.0" in _text(app, "#status")
            assert app.query_one("TabbedContent").active == "tab-layer"
            await pilot.press("t", "s")
            await pilot.pause()
            assert app.what_if.kind == "steering" and app.what_if.ok
            assert app.what_if.vector.layers == (1,) and app.what_if.vector.norm_matched
            assert str(app.trace.top_k[1].id) in app.what_if.vector.description
            hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
                        for m in lm.model.modules())
            assert hooks == 0
    asyncio.run(go())


def test_exports_never_replace_a_file_of_someone_else(tmp_path, monkeypatch):
    """j, r and p write in the current folder under the one output policy: a file there that
    fptrace did not write stays as it was, and the refusal is a message in the app."""
    monkeypatch.chdir(tmp_path)
    lm = _model()
    theirs = {"fptrace-trace.json": "{\"mine\": 1}\n", "fptrace-report.html": "<p>mine</p>\n",
              "fptrace-trace.png": "not a figure\n"}
    for name, text in theirs.items():
        (tmp_path / name).write_text(text)

    async def go():
        app = FptraceApp(lm=lm)
        async with app.run_test(size=(120, 40)) as pilot:
            await _type(pilot, "The cat")
            await pilot.press("enter")
            await pilot.pause()
            assert app.trace is not None
            await pilot.press("escape")
            for key, name in (("j", "fptrace-trace.json"), ("r", "fptrace-report.html"),
                              ("p", "fptrace-trace.png")):
                await pilot.press(key)
                await pilot.pause()
                status = _text(app, "#status")
                assert name in status and "not a file fptrace wrote" in status, status
                assert (tmp_path / name).read_text() == theirs[name]
            (tmp_path / "fptrace-trace.json").unlink()
            for _ in range(2):  # written, then replaced: the file is fptrace's own
                await pilot.press("j")
                await pilot.pause()
                assert _text(app, "#status") == "wrote fptrace-trace.json"
                assert '"kind": "trace"' in (tmp_path / "fptrace-trace.json").read_text()
    asyncio.run(go())
