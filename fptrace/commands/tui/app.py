"""`fptrace tui`: explore forward passes in the terminal with the model loaded once (Textual).

The app owns the prompt box, the layer table, the layer and top-k tabs and the export keys; the
other tabs and keys are what the command folders offer in their tui.py (cli/actions.py), merged
by their order. Every number comes from the same core functions as the commands and is drawn by
the same renderers, so the app shows what `run --json` says. Textual is imported only here, so
`fptrace --help` stays fast.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane

from fptrace.cli.actions import TuiAction, TuiPane, collect
from fptrace.errors import FptraceError
from fptrace.render.text import norm, num, visible

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

HELP = """[b]fptrace tui[/b]: one model, loaded once; any number of prompts.
[b]/[/b] edit the prompt (Enter traces it, Escape leaves it)   [b]↑ ↓[/b] choose a layer
[b]h / H[/b] next / previous attention head   [b]t[/b] attribute the next token of the top-k
[b]a[/b] what if: remove the selected block's head and MLP   [b]s[/b] what if: steer the selected
block's output toward the attributed token (its LM-head row, norm-matched, × 0, 0.25, 0.5, 1)
[b]j[/b] export the trace as JSON   [b]r[/b] export the HTML report   [b]p[/b] export a PNG figure
[b]?[/b] this help   [b]q[/b] quit"""

# where j and r export, in the current folder (p: commands/run/tui.py)
EXPORT_JSON, EXPORT_REPORT = "fptrace-trace.json", "fptrace-report.html"

# the app's own keys and tabs, merged with the folders' by order (cli/actions.py)
OWN_ACTIONS = (
    TuiAction(0, "slash", "Prompt", lambda app: app.action_focus_prompt(), computes=False),
    TuiAction(1, "escape", "Leave prompt", lambda app: app.action_leave_prompt(), show=False,
              computes=False),
    TuiAction(50, "j", "JSON", lambda app: app.action_export_json(), computes=False),
    TuiAction(60, "r", "Report", lambda app: app.action_export_report()),
    TuiAction(80, "question_mark", "Help", lambda app: app.action_help(), computes=False),
    TuiAction(90, "q", "Quit", lambda app: app.exit(), computes=False),
)
OWN_PANES = (TuiPane(0, "layer", lambda app: app.layer_text),
             TuiPane(100, "top-k", lambda app: app.top_k_view()))
ACTIONS = tuple(sorted(OWN_ACTIONS + tuple(collect("ACTIONS")), key=lambda a: a.order))
PANES = tuple(sorted(OWN_PANES + tuple(collect("PANES")), key=lambda p: p.order))
TABS = tuple(dict.fromkeys(p.tab for p in PANES))  # each tab where its first part sorts
COMPUTED = set(TABS) - {p.tab for p in OWN_PANES}  # computed when shown: a recomputation


class FptraceApp(App):
    """The model, loaded once; a prompt box; the per-layer table; tabs for the selected layer,
    those the command folders offer, and the top-k."""

    CSS = """
    #prompt { dock: top; }
    Horizontal { height: 1fr; }
    #status { height: 1; color: $warning; }
    #layers { width: 60%; }
    TabbedContent { width: 40%; }
    """
    BINDINGS = [Binding(a.key, f"key({i})", a.label, show=a.show) for i, a in enumerate(ACTIONS)]

    def __init__(self, lm: LoadedModel | None = None, prompt: str | None = None, load: Any = None,
                 chat: Any = None) -> None:
        """chat: None for plain text; else the messages before the user's (a Chat whose last
        message the prompt box supplies: `--chat`, `--system`, `--messages`)."""
        super().__init__()
        self.lm, self.load_options = lm, load
        self.first_prompt = prompt
        self.chat = chat
        self.traced: Any = None  # the Prepared prompt of the trace shown
        self.trace: Any = None
        self.layer = 0  # the selected row: 0 = embedding, k + 1 = block k
        self.head = 0
        self.target = 0  # index into the trace's top-k
        # what the folders' panes computed last (they set them; a new prompt or row clears them)
        self.explanation: Any = None  # the walkthrough of the selected block and head
        self.attribution: Any = None  # the attribution of the selected target
        self.qk: Any = None  # the selected head's score split
        self.what_if: Any = None  # the last what-if's result
        self.layer_text: Any = None  # the layer pane's own text (a what-if is shown under it)
        # what a worker thread computes with the model now, or None: its hooks are on the
        # model, so nothing else computes with it until it is done (in_background)
        self.busy: str | None = None

    def compose(self) -> ComposeResult:
        yield Input(placeholder="a prompt; Enter traces it", id="prompt")
        with Horizontal():
            yield DataTable(id="layers", cursor_type="row", zebra_stripes=True)
            with TabbedContent():
                for name in TABS:
                    with TabPane(name, id=f"tab-{name}"):
                        yield VerticalScroll(Static(id=f"pane-{name}"))
        yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#layers", DataTable)
        table.add_columns("layer", "‖resid‖", "‖attn‖", "‖mlp‖", "‖Δ‖", "lens top-1", "p")
        if self.lm is None:
            self.status("loading the model…")
            self.load_model()
        elif self.first_prompt:
            self.query_one("#prompt", Input).value = self.first_prompt
            self.trace_prompt(self.first_prompt)
            self.query_one("#layers", DataTable).focus()
        else:
            self.action_focus_prompt()

    @work(thread=True, exclusive=True)
    def load_model(self) -> None:
        try:
            lm = self.load_options.load()
        except FptraceError as e:
            self.call_from_thread(self.status, f"cannot load the model: {e}")
            return
        except Exception as e:  # noqa: BLE001  (a bug or a broken file: said, not a crash)
            self.call_from_thread(self.status, f"cannot load the model: {type(e).__name__}: {e}")
            return
        self.call_from_thread(self.loaded, lm)

    def loaded(self, lm: LoadedModel) -> None:
        self.lm = lm
        self.status(f"loaded {lm.name}")
        if self.first_prompt:
            self.query_one("#prompt", Input).value = self.first_prompt
            self.trace_prompt(self.first_prompt)
            self.query_one("#layers", DataTable).focus()
        else:
            self.action_focus_prompt()

    # ----------------------------------------------------------------- tracing
    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.trace_prompt(event.value)
        self.query_one("#layers", DataTable).focus()

    def trace_prompt(self, prompt: str) -> None:
        from fptrace.core.trace import run_trace
        from fptrace.models.prompts import Chat, Message

        if self.lm is None:
            self.status("the model is not loaded")
            return
        if not self.free():
            return
        try:
            if not prompt.strip():
                raise FptraceError("the prompt is empty: give some text to trace")
            value = prompt if self.chat is None else \
                Chat(self.chat.messages + (Message("user", prompt),))
            self.traced = self.lm.prepare(value)
            self.trace = run_trace(self.lm, self.traced, snippet=self.lm.config.hidden_size)
        except FptraceError as e:
            self.status(str(e))
            return
        self.explanation = self.attribution = None
        self.target = 0
        self.fill_table()
        self.status(f"traced {len(self.trace.tokens)} tokens")
        self.show_layer()

    def fill_table(self) -> None:
        table = self.query_one("#layers", DataTable)
        table.clear()
        for row in self.trace.layers:
            table.add_row("embed" if row.layer is None else str(row.layer),
                          norm(row.resid_norm_last), norm(row.attn_norm_last),
                          norm(row.mlp_norm_last), norm(row.added_norm_last),
                          visible(row.lens_text or "—"), num(row.lens_prob, 3))
        table.move_cursor(row=min(self.layer, len(self.trace.layers) - 1))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.layer = event.cursor_row
        self.explanation = None
        self.show_layer()

    # ----------------------------------------------------------------- panes
    def show_layer(self) -> None:
        if self.trace is None or self.lm is None or not self.free():  # a trace has its model
            return
        from fptrace.core.trace import lens_top_k

        row = self.trace.layers[self.layer]
        top = lens_top_k(self.lm, row.snippet, 10)
        text = Text(f"{'embedding' if row.layer is None else f'block {row.layer}'}\n",
                    style="bold")
        text.append(f"‖resid‖ {norm(row.resid_norm_last)}   ‖attn‖ {norm(row.attn_norm_last)}"
                    f"   ‖mlp‖ {norm(row.mlp_norm_last)}   ‖Δ‖ {norm(row.added_norm_last)}\n")
        text.append("first values " + " ".join(f"{v:+.3f}" for v in row.snippet[:8]) + "\n\n")
        text.append("logit lens top-10\n", style="bold")
        for t in top:
            text.append(f"{t.rank:>3} {visible(t.text):<16} {t.prob:.4f}\n")
        hints = [a.hint for a in ACTIONS if a.hint]
        if hints:
            text.append("   ".join(hints) + "\n", style="dim")
        self.layer_text = text
        self.query_one("#pane-layer", Static).update(text)
        self.show("top-k")
        self.refresh_active()

    def active(self) -> str:
        return self.query_one(TabbedContent).active.removeprefix("tab-")

    def refresh_active(self) -> None:
        """The folders' tabs cost a recomputation: only the one on screen is computed, when it
        is shown."""
        if self.active() in COMPUTED:
            self.show(self.active())

    def show(self, tab: str) -> None:
        """Fill a tab with its parts, in their order."""
        if not self.free():
            self.query_one(f"#pane-{tab}", Static).update(Text(
                f"\n{self.busy}: this tab is filled when that is done", style="dim"))
            return
        parts = [p.show(self) for p in PANES if p.tab == tab]
        self.query_one(f"#pane-{tab}", Static).update(parts[0] if len(parts) == 1 else
                                                      Group(*parts))

    def show_tab(self, tab: str) -> None:
        """Bring a tab on screen and fill it."""
        self.query_one(TabbedContent).active = f"tab-{tab}"
        self.show(tab)

    def top_k_view(self) -> Any:
        from fptrace.render.tables import top_k

        return top_k(self.trace, 60)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if self.trace is not None:
            self.refresh_active()

    # ----------------------------------------------------------------- workers
    def free(self) -> bool:
        """Whether the model is free to compute with; when a worker holds it, the status line
        says so."""
        if self.busy is None:
            return True
        self.status(f"{self.busy}: the model is busy until that is done")
        return False

    def in_background(self, what: str, compute: Any, done: Any) -> None:
        """Run compute() on a worker thread, the model held for it (what: said meanwhile), then
        done(result) on the interface thread, result an FptraceError where compute raised one,
        and the layer and the tab on screen filled again."""
        self.busy = what
        self.status(f"{what}…")
        self.work_on_model(compute, done)

    @work(thread=True)
    def work_on_model(self, compute: Any, done: Any) -> None:
        try:
            result = compute()
        except FptraceError as e:
            result = e
        except Exception as e:  # noqa: BLE001  (a bug: said in the app, not a crash)
            result = FptraceError(f"{type(e).__name__}: {e}")
        with contextlib.suppress(RuntimeError):  # the app has closed meanwhile: nothing to show
            self.call_from_thread(self.finished, done, result)

    def finished(self, done: Any, result: Any) -> None:
        self.busy = None
        self.status("")
        done(result)
        self.show_layer()

    # ----------------------------------------------------------------- actions
    def status(self, message: str) -> None:
        self.query_one("#status", Static).update(message)

    def action_focus_prompt(self) -> None:
        self.query_one("#prompt", Input).focus()

    def action_leave_prompt(self) -> None:
        self.query_one("#layers", DataTable).focus()

    def action_key(self, index: int) -> None:
        if ACTIONS[index].computes and not self.free():
            return
        try:  # a key's error (an export path refused, a computation) is a message in the app
            ACTIONS[index].run(self)
        except FptraceError as e:
            self.status(str(e))

    def whatif(self, compute: Any, view: Any, done: str) -> None:
        """Run a what-if (ablate or steer) and show its view in the layer pane, under the
        selected layer (until another layer is selected)."""
        from rich.console import Group

        pane = self.query_one("#pane-layer", Static)
        self.query_one(TabbedContent).active = "tab-layer"
        try:
            self.what_if = compute()
        except FptraceError as e:
            pane.update(Group(self.layer_text, Text(str(e), style="yellow")))
            return
        pane.update(Group(self.layer_text, view(self.what_if, 80)))
        self.status(done)

    def action_help(self) -> None:
        self.notify(HELP, timeout=15)
        self.status("keys: / prompt · ↑↓ layer · h/H head · t target · a/s what if · j/r/p "
                    "export · q quit")

    def action_export_json(self) -> None:
        from fptrace.atomic import check_target, write_text_atomic
        from fptrace.render.json import to_json

        if self.trace is None:
            return
        check_target(EXPORT_JSON, "export", EXPORT_JSON)  # someone else's file stays
        write_text_atomic(EXPORT_JSON, to_json(self.trace) + "\n", ".json")
        self.status(f"wrote {EXPORT_JSON}")

    def action_export_report(self) -> None:
        """The report `fptrace report` writes for this prompt, at the selected block and head."""
        from fptrace.atomic import write_text_atomic
        from fptrace.cli.page import check_page
        from fptrace.cli.sections import Page, compute, defaults
        from fptrace.core.trace import run_trace
        from fptrace.render.page import build_html

        if self.trace is None or self.lm is None:  # a trace has its model
            return
        values = defaults()
        values.update({k: v for k, v in (("layer", max(self.layer - 1, 0)), ("head", self.head))
                       if k in values})
        check_page(EXPORT_REPORT, "export")  # before the work, as report's --out
        page = Page(self.lm, self.traced, self.load_options,
                    run_trace(self.lm, self.traced, lens_grid=True))
        write_text_atomic(EXPORT_REPORT, build_html(page.trace, compute(page, values)), ".html")
        self.status(f"wrote {EXPORT_REPORT}")

    def on_unmount(self) -> None:
        self.lm = self.trace = self.explanation = self.attribution = None  # free the model
        self.qk = self.what_if = None


__all__ = ["FptraceApp"]
