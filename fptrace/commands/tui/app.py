"""`fptrace tui`: explore forward passes in the terminal with the model loaded once (Textual).

Every number comes from the same core functions as the commands (run_trace, explain, attribute,
the logit lens of tracer) and is drawn by the same renderers, so the app shows what `run --json`
says. Textual is imported only here, so `fptrace --help` stays fast.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane

from fptrace.errors import FptraceError
from fptrace.render.text import norm, num, visible

HELP = """[b]fptrace tui[/b]: one model, loaded once; any number of prompts.
[b]/[/b] edit the prompt (Enter traces it, Escape leaves it)   [b]↑ ↓[/b] choose a layer
[b]h / H[/b] next / previous attention head   [b]t[/b] attribute the next token of the top-k
[b]a[/b] what if: remove the selected block's head and MLP   [b]s[/b] what if: steer the selected
block's output toward the attributed token (its LM-head row, norm-matched, × 0, 0.25, 0.5, 1)
[b]j[/b] export the trace as JSON   [b]r[/b] export the HTML report   [b]p[/b] export a PNG figure
[b]?[/b] this help   [b]q[/b] quit"""

BLOCKS = " ░▒▓█"


def heatmap(m: Any) -> Table:
    """One head's attention weights as unicode blocks (rows: queries, columns: keys)."""
    t = Table(title=f"head {m.head}: attention weights (row: query, column: key)",
              title_justify="left", box=None, padding=(0, 0), show_header=True)
    labels = [visible(x)[:6] for x in m.labels]
    t.add_column("", no_wrap=True, style="bold")
    for lab in labels:
        t.add_column(lab, no_wrap=True, justify="center")
    for lab, row in zip(labels, m.rows):
        cells = []
        for v in row:
            level = min(len(BLOCKS) - 1, int(round(max(v, 0.0) * (len(BLOCKS) - 1))))
            cells.append(Text(BLOCKS[level] * 3, style=f"rgb({int(60 + 195 * v)},90,200)"))
        t.add_row(lab, *cells)
    return t


class FptraceApp(App):
    """The model, loaded once; a prompt box; the per-layer table; panes for the selected layer,
    its attention heads, explain, the attribution and the top-k."""

    CSS = """
    #prompt { dock: top; }
    Horizontal { height: 1fr; }
    #status { height: 1; color: $warning; }
    #layers { width: 60%; }
    TabbedContent { width: 40%; }
    """
    BINDINGS = [
        Binding("slash", "focus_prompt", "Prompt"),
        Binding("escape", "leave_prompt", "Leave prompt", show=False),
        Binding("h", "head(1)", "Next head"),
        Binding("H", "head(-1)", "Prev head", show=False),
        Binding("t", "next_target", "Target"),
        Binding("a", "ablate", "Ablate", show=False),
        Binding("s", "steer", "Steer", show=False),
        Binding("j", "export_json", "JSON"),
        Binding("r", "export_report", "Report"),
        Binding("p", "export_png", "PNG"),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, lm: Any = None, prompt: str | None = None, load: Any = None,
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
        self.explanation: Any = None
        self.attribution: Any = None
        self.what_if: Any = None  # the last ablation or steering result
        self.layer_text: Any = None  # the layer pane's own text (a what-if is shown under it)
        self.qk: Any = None  # the selected head's score split (attribute --qk)

    def compose(self) -> ComposeResult:
        yield Input(placeholder="a prompt; Enter traces it", id="prompt")
        with Horizontal():
            yield DataTable(id="layers", cursor_type="row", zebra_stripes=True)
            with TabbedContent():
                for name in ("layer", "heads", "explain", "attribution", "top-k"):
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

    def loaded(self, lm: Any) -> None:
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
        if self.trace is None:
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
        text.append("a: remove this block's head and MLP   s: steer its output toward the "
                    "attributed token\n", style="dim")
        self.layer_text = text
        self.query_one("#pane-layer", Static).update(text)
        self.show_top_k()
        self.refresh_active()

    def active(self) -> str:
        return self.query_one(TabbedContent).active.removeprefix("tab-")

    def refresh_active(self) -> None:
        """The heads, explain and attribution panes cost a recomputation: only the one on
        screen is computed, when it is shown."""
        name = self.active()
        if name in ("heads", "explain"):
            self.show_heads()
        elif name == "attribution":
            self.show_attribution()

    def _explained(self) -> Any:
        from fptrace.commands.explain.core import explain

        block = max(self.layer - 1, 0)
        if self.explanation is None or self.explanation.layer != block or \
                self.explanation.head != self.head:
            self.explanation = explain(self.lm, self.traced, layer=block, head=self.head,
                                       all_heads=True, max_matrix=24)
        return self.explanation

    def show_heads(self) -> None:
        from fptrace.commands.explain.render import explain_view

        heads = self.query_one("#pane-heads", Static)
        pane = self.query_one("#pane-explain", Static)
        try:
            e = self._explained()
        except FptraceError as err:
            heads.update(Text(str(err), style="yellow"))
            pane.update(Text(str(err), style="yellow"))
            return
        m = next(m for m in e.head_weights if m.head == self.head)
        note = "" if self.layer else " (the embedding row: block 0's heads)"
        heads.update(Group(Text(f"block {e.layer}{note}; h / H: another head", style="bold"),
                           heatmap(m), self._qk_split(e.layer)))
        pane.update(explain_view(e, 80))

    def _qk_split(self, block: int) -> Any:
        """Why the selected head attends where it does (attribute --qk): the last position on
        its most attended key."""
        from fptrace.addresses import Head
        from fptrace.commands.attribute.qk import attribute_qk
        from fptrace.commands.attribute.render import qk_pane

        try:
            self.qk = attribute_qk(self.lm, self.traced, Head(block, self.head), top=6)
        except FptraceError as err:
            self.qk = None
            return Text(str(err), style="yellow")
        return Group(Text("\nWhy it attends there: its score, part by part", style="bold"),
                     qk_pane(self.qk, 60))

    def show_top_k(self) -> None:
        from fptrace.render.tables import top_k

        self.query_one("#pane-top-k", Static).update(top_k(self.trace, 60))

    def show_attribution(self) -> None:
        from fptrace.commands.attribute.core import attribute
        from fptrace.commands.attribute.render import attribution_view

        target = self.trace.top_k[self.target]
        try:
            self.attribution = attribute(self.lm, self.traced, target=f"#{target.id}",
                                         top=10)
        except FptraceError as e:
            self.query_one("#pane-attribution", Static).update(Text(str(e), style="yellow"))
            return
        self.query_one("#pane-attribution", Static).update(
            attribution_view(self.attribution, 80))

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if self.trace is not None:
            self.refresh_active()

    # ----------------------------------------------------------------- actions
    def status(self, message: str) -> None:
        self.query_one("#status", Static).update(message)

    def action_focus_prompt(self) -> None:
        self.query_one("#prompt", Input).focus()

    def action_leave_prompt(self) -> None:
        self.query_one("#layers", DataTable).focus()

    def action_head(self, step: int) -> None:
        if self.trace is None:
            return
        self.head = (self.head + step) % self.trace.model.n_heads
        self.query_one(TabbedContent).active = "tab-heads"
        self.show_heads()

    def action_next_target(self) -> None:
        if self.trace is None:
            return
        self.target = (self.target + 1) % len(self.trace.top_k)
        self.query_one(TabbedContent).active = "tab-attribution"
        self.show_attribution()
        self.status(f"attributing {visible(self.trace.top_k[self.target].text)!r}")

    def action_ablate(self) -> None:
        """What if the selected block's current head and its MLP were gone (zero ablation)."""
        from fptrace.addresses import Head
        from fptrace.commands.ablate.core import ablate
        from fptrace.commands.ablate.render import ablate_view

        if self.trace is None:
            return
        block = max(self.layer - 1, 0)
        head = Head(block, self.head)
        self.whatif(lambda: ablate(self.lm, self.traced, heads=[head], mlps=[block],
                                   target=f"#{self.trace.top_k[self.target].id}"),
                    ablate_view, f"removed head {head} and the MLP of block {block}")

    def action_steer(self) -> None:
        """What if the selected block's output were pushed toward the attributed token."""
        from fptrace.commands.steer.core import steer
        from fptrace.commands.steer.render import steer_view

        if self.trace is None:
            return
        block = max(self.layer - 1, 0)
        token = self.trace.top_k[self.target]
        self.whatif(lambda: steer(self.lm, self.traced, token=f"#{token.id}", layer=block,
                                  norm_match=True, scales="0,0.25,0.5,1", new_tokens=4),
                    steer_view, f"steered block {block} toward {visible(token.text)!r}")

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
        from fptrace.atomic import write_text_atomic
        from fptrace.render.json import to_json

        if self.trace is not None:
            write_text_atomic("fptrace-trace.json", to_json(self.trace) + "\n", ".json")
            self.status("wrote fptrace-trace.json")

    def action_export_report(self) -> None:
        from fptrace.commands.attribute.core import attribute
        from fptrace.commands.report.core import build_html, write_report
        from fptrace.core.trace import run_trace

        if self.trace is None:
            return
        try:
            trace = run_trace(self.lm, self.traced, lens_grid=True)
            write_report("fptrace-report.html", build_html(
                trace, self._explained(), self.attribution or attribute(self.lm, self.traced)))
        except FptraceError as e:
            self.status(str(e))
            return
        self.status("wrote fptrace-report.html")

    def action_export_png(self) -> None:
        from fptrace.commands.run.render import trace_figure
        from fptrace.core.trace import run_trace
        from fptrace.render.figures import save

        if self.trace is not None:
            save(trace_figure(run_trace(self.lm, self.traced, lens_grid=True))[0],
                 "fptrace-trace.png")
            self.status("wrote fptrace-trace.png")

    def on_unmount(self) -> None:
        self.lm = self.trace = self.explanation = self.attribution = None  # free the model
        self.qk = self.what_if = None


__all__ = ["FptraceApp", "heatmap"]
