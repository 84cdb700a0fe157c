"""Rich renderables for `fptrace explain`."""

from __future__ import annotations

import math

from rich import box
from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from ..results import AttentionMatrix, Check, ExplainStep, Explanation
from .tables import header, token_table
from .text import bar, shape, visible

SECTION_TITLES = {"attention": "attention", "mlp": "MLP", "end": "end of the pass"}


def value(v: float, digits: int = 3) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "−∞" if v < 0 else "+∞"
    if v != 0 and (abs(v) >= 1000 or abs(v) < 10 ** -digits):
        return f"{v:+.{digits - 1}e}"
    return f"{v:+.{digits}f}"


def steps_table(steps: tuple[ExplainStep, ...], title: str) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("step", no_wrap=True)
    t.add_column("formula")
    t.add_column("shape", no_wrap=True, style="cyan")
    t.add_column("values", no_wrap=True)
    section = None
    several = len({st.section for st in steps}) > 1
    for st in steps:
        if several and st.section != section:
            section = st.section
            t.add_row("", Text(SECTION_TITLES.get(section, section), style="bold underline"),
                      "", "", "")
        formula = Text(st.formula)
        if st.note:
            formula.append(f"\n{st.note}", style="dim")
        vals = Text(" ".join(value(v) for v in st.preview))
        vals.append(f"\n{st.where}", style="dim")
        t.add_row(str(st.index), st.name, formula, shape(st.shape), vals)
    return t


def matrix_table(m: AttentionMatrix) -> Table:
    t = Table(title=f"Head {m.head}, {m.name}", title_justify="left", box=box.SIMPLE_HEAD,
              padding=(0, 1), caption="row: the query's position; column: the key's",
              caption_justify="left")
    t.add_column("", no_wrap=True, style="bold")
    for lab in m.labels:
        t.add_column(Text("K " + lab), justify="right", no_wrap=True)
    weights = m.name == "weights"
    if weights:
        t.add_column("Σ row", justify="right", no_wrap=True, style="dim")
    for lab, row in zip(m.labels, m.rows):
        cells = [Text("−∞" if v == -math.inf else f"{v:.2f}", style="dim" if v == 0 or math.isinf(v) else
                      ("bold" if weights and v >= 0.5 else "")) for v in row]
        extra = [f"{sum(row):.4f}"] if weights else []
        t.add_row(Text("Q " + lab), *cells, *extra)
    return t


def checks_table(checks: tuple[Check, ...]) -> Table:
    t = Table(title="Checks against the model", title_justify="left", box=box.SIMPLE_HEAD,
              padding=(0, 1))
    t.add_column("", no_wrap=True)
    t.add_column("check")
    t.add_column("measured", justify="right", no_wrap=True)
    t.add_column("must be", no_wrap=True)
    for c in checks:
        mark = Text("✓", style="bold green") if c.ok else Text("✗", style="bold red")
        measured = f"{c.value:.0f}" if "count" in c.name else f"{c.value:.2e}"
        t.add_row(mark, Text(c.name, style=None if c.ok else "bold red"), measured,
                  c.tolerance)
    return t


def sampling_table(e: Explanation) -> Table:
    s = e.sampling
    t = Table(title=f"Choosing the next token (seed {s.seed}): probability under each strategy",
              title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    t.add_column("token", no_wrap=True)
    t.add_column("id", justify="right", no_wrap=True)
    t.add_column("logit", justify="right", no_wrap=True)
    for name in s.strategies:
        t.add_column(name, justify="right", no_wrap=True)
    picked = [p.id for p in s.picks]
    for r in s.rows:
        cells = []
        for k, p in enumerate(r.probs):
            cell = Text(f"{p:.4f} ")
            cell.append(bar(p, 1.0, 6), style="magenta")
            if picked[k] == r.id:
                cell.append(" ◀", style="bold green")
            cells.append(cell)
        t.add_row(Text(visible(r.text)), str(r.id), f"{r.logit:.3f}", *cells)
    t.add_section()
    t.add_row("tokens kept", "", "", *[f"{n:,}" for n in s.kept])
    t.add_row(Text("picks", style="bold"), "", "",
              *[Text(visible(p.text), style="bold green") for p in s.picks])
    return t


def verdict(e: Explanation) -> Text:
    block = next(c for c in e.checks if c.name.startswith(f"block {e.layer} output"))
    if e.match:
        return Text(f"✓ recomputed block {e.layer} output matches the model: max |Δ| = "
                    f"{block.value:.2e} (|Δ| ≤ {block.tolerance}); all "
                    f"{len(e.checks)} checks pass", style="bold green")
    failed = [c.name for c in e.checks if not c.ok]
    return Text(f"✗ THE RECOMPUTATION DOES NOT MATCH THE MODEL: {len(failed)} check(s) failed "
                f"({'; '.join(failed)}); block output max |Δ| = {block.value:.2e}. "
                "Do not trust the numbers above.", style="bold white on red")


def explain_view(e: Explanation) -> RenderableType:
    info = e.model
    kv = f" (reads key/value head {e.kv_head})" if info.n_kv_heads != info.n_heads else ""
    parts: list[RenderableType] = [
        header(info), token_table(e.tokens),
        Rule(f"block {e.layer} of {info.n_layers}, step by step: head {e.head}{kv}",
             align="left"),
        steps_table(tuple(s for s in e.steps if s.section != "end"),
                    f"Block {e.layer}: every step from the stream entering it to the stream "
                    "leaving it"),
    ]
    parts += [matrix_table(m) for m in e.matrices]
    parts += [steps_table(tuple(s for s in e.steps if s.section == "end"),
                          "The end of the pass: from the last block's output to a token"),
              sampling_table(e), checks_table(e.checks)]
    notes = Text()
    for n in e.notes:
        notes.append("• " + n + "\n", style="bold red" if n.startswith("RANDOM") else "dim")
    parts += [notes, verdict(e)]
    return Group(*parts)
