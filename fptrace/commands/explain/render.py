"""Rich renderables for `fptrace explain`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.text import Text

from fptrace.commands.explain.result import AttentionMatrix, Explanation
from fptrace.errors import BadInput
from fptrace.render.figures import pyplot
from fptrace.render.fit import Col, fit_table
from fptrace.render.tables import header, token_table
from fptrace.render.text import bar, bullets, shape, visible
from fptrace.results import Check, ExplainStep

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SECTION_TITLES = {"attention": "attention", "mlp": "MLP", "end": "end of the pass",
                  "embedding": "embedding"}


def value(v: float, digits: int = 3) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "−∞" if v < 0 else "+∞"
    if v != 0 and (abs(v) >= 1000 or abs(v) < 10 ** -digits):
        return f"{v:+.{digits - 1}e}"
    return f"{v:+.{digits}f}"


# the formula wraps; the others are shown whole or left out (values first, when narrow)
STEP_COLS = (Col("#", 0, "right"), Col("step", 0), Col("formula", 0, wrap=True, min_width=24),
             Col("shape", 0, style="cyan"), Col("values", 1))


def steps_table(steps: tuple[ExplainStep, ...], title: str, width: int | None = None
                ) -> RenderableType:
    rows = []
    section = None
    several = len({st.section for st in steps}) > 1
    for st in steps:
        if several and st.section != section:
            section = st.section
            rows.append(["", Text(SECTION_TITLES.get(section, section),
                                  style="bold underline"), "", "", ""])
        formula = Text(st.formula)
        if st.note:
            formula.append(f"\n{st.note}", style="dim")
        vals = Text(" ".join(value(v) for v in st.preview))
        vals.append(f"\n{st.where}", style="dim")
        rows.append([str(st.index), st.name, formula, shape(st.shape), vals])
    return fit_table(STEP_COLS, rows, width, padding=(0, 1), title=title, title_justify="left")


def matrix_table(m: AttentionMatrix, width: int | None = None) -> RenderableType:
    """Rows: query positions; columns: key positions (the last keys are left out first when
    the terminal is narrow, and named)."""
    weights = m.name == "weights"
    labels = [visible(lab) for lab in m.labels]
    cols = [Col("", 0, style="bold")] + [Col(Text("K " + lab), 1 + j, "right")
                                         for j, lab in enumerate(labels)]
    if weights:
        cols.append(Col("Σ row", 1, "right", style="dim"))
    rows = []
    for lab, row in zip(labels, m.rows):
        cells = [Text("−∞" if v == -math.inf else f"{v:.2f}",
                      style="dim" if v == 0 or math.isinf(v) else
                      ("bold" if weights and v >= 0.5 else "")) for v in row]
        extra = [f"{sum(row):.4f}"] if weights else []
        rows.append([Text("Q " + lab), *cells, *extra])
    return fit_table(cols, rows, width, padding=(0, 1), title=f"Head {m.head}, {m.name}",
                     title_justify="left", caption="row: the query's position; column: the key's",
                     caption_justify="left")


CHECK_COLS = (Col("", 0), Col("check", 0, wrap=True, min_width=20),
              Col("measured", 0, "right"), Col("must be", 0, wrap=True, min_width=12))


def checks_table(checks: tuple[Check, ...], width: int | None = None) -> RenderableType:
    rows = []
    for c in checks:
        mark = Text("✓", style="bold green") if c.ok else Text("✗", style="bold red")
        measured = f"{c.value:.0f}" if c.unit == "count" else f"{c.value:.2e}"
        rows.append([mark, Text(c.name, style="" if c.ok else "bold red"), measured,
                     c.tolerance])
    return fit_table(CHECK_COLS, rows, width, padding=(0, 1), title="Checks against the model",
                     title_justify="left")


def sampling_table(e: Explanation, width: int | None = None) -> RenderableType:
    s = e.sampling
    cols = [Col("token", 0), Col("id", 2, "right"), Col("logit", 1, "right")]
    cols += [Col(name, 0, "right", wrap=True) for name in s.strategies]
    rows: list = []
    picked = [p.id for p in s.picks]
    for r in s.rows:
        cells = []
        for k, p in enumerate(r.probs):
            cell = Text(f"{p:.4f} ")
            cell.append(bar(p, 1.0, 6), style="magenta")
            if picked[k] == r.id:
                cell.append(" ◀", style="bold green")
            cells.append(cell)
        rows.append([Text(visible(r.text)), str(r.id), f"{r.logit:.3f}", *cells])
    rows.append(["tokens kept", "", "", *[f"{n:,}" for n in s.kept]])
    rows.append([Text("picks", style="bold"), "", "",
                 *[Text(visible(p.text), style="bold green") for p in s.picks]])
    return fit_table(cols, rows, width, sections=[len(rows) - 2], padding=(0, 1),
                     title=f"Choosing the next token (seed {s.seed}): probability under each "
                     "strategy", title_justify="left")


def verdict(e: Explanation) -> Text:
    block = next(c for c in e.checks if c.target == "block")
    if e.match:
        return Text(f"✓ recomputed block {e.layer} output matches the model: max |Δ| = "
                    f"{block.value:.2e} (|Δ| ≤ {block.tolerance}); all "
                    f"{len(e.checks)} checks pass", style="bold green")
    failed = [c.name for c in e.checks if not c.ok]
    return Text(f"✗ THE RECOMPUTATION DOES NOT MATCH THE MODEL: {len(failed)} check(s) failed "
                f"({'; '.join(failed)}); block output max |Δ| = {block.value:.2e}. "
                "Do not trust the numbers above.", style="bold white on red")


def _values(v: tuple[float, ...] | None) -> str:
    return "" if v is None else " ".join(value(x) for x in v)


def embedding_table(e: Explanation, width: int | None) -> RenderableType:
    """Token by token: row `id` of W_E (+ row `pos` of W_P) (× √d) = the stream entering block
    0, first values of each."""
    rows_ = e.embedding
    has_pos = any(r.position_row is not None for r in rows_)
    scale = next((r.scale for r in rows_ if r.scale is not None), None)
    cols = [Col("pos", 0, "right"), Col("id", 0, "right"), Col("token", 0),
            Col("W_E[id]", 1)]
    if has_pos:
        cols.append(Col("+ W_P[pos]", 1))
    cols.append(Col("= x" if scale is None else f"× {scale:.4g} = x", 0))
    body = []
    for r in rows_:
        row = [str(r.position), str(r.id), Text(visible(r.text)), _values(r.token_row)]
        if has_pos:
            row.append(_values(r.position_row))
        row.append(_values(r.stream))
        body.append(row)
    return fit_table(cols, body, width, padding=(0, 1), title="The embedding lookup, token by "
                     "token (first values)", title_justify="left")


def explain_view(e: Explanation, width: int | None = 120) -> RenderableType:
    info = e.model
    kv = f" (reads key/value head {e.kv_head})" if info.n_kv_heads != info.n_heads else ""
    parts: list[RenderableType] = [
        header(info), token_table(e.tokens, width=width),
    ]
    if e.embedding:
        parts += [steps_table(tuple(s for s in e.steps if s.section == "embedding"),
                              "From token ids to the stream entering block 0", width),
                  embedding_table(e, width)]
    parts += [
        Rule(f"block {e.layer} of {info.n_layers}, step by step: head {e.head}{kv}",
             align="left"),
        steps_table(tuple(s for s in e.steps if s.section not in ("end", "embedding")),
                    f"Block {e.layer}: every step from the stream entering it to the stream "
                    "leaving it", width),
    ]
    parts += [matrix_table(m, width) for m in e.matrices]
    parts += [steps_table(tuple(s for s in e.steps if s.section == "end"),
                          "The end of the pass: from the last block's output to a token", width),
              sampling_table(e, width), checks_table(e.checks, width)]
    notes = bullets(e.notes)
    parts += [notes, verdict(e)]
    return Group(*parts)


def attention_figure(e: Explanation) -> tuple[Figure, dict]:
    """Every head's attention weights at the explained layer, one heatmap each."""
    plt = pyplot()
    heads = [m for m in e.head_weights]
    if not heads:
        raise BadInput("no attention weights to plot (explain was run without all heads)")
    n = len(heads)
    cols = min(n, 4 if n <= 8 else 6)
    rows = (n + cols - 1) // cols
    T = len(heads[0].labels)
    size = 2.2 if T <= 12 else 3.0
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size + 1, rows * size + 1),
                             squeeze=False, constrained_layout=True)
    series: dict[str, list] = {"heads": [m.head for m in heads],
                               "weights": [[list(r) for r in m.rows] for m in heads]}
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.axis("off")
            continue
        m = heads[k]
        ax.imshow(series["weights"][k], cmap="magma", vmin=0, vmax=1)
        ax.set_title(f"head {m.head}", fontsize=9)
        if T <= 24:
            ax.set_xticks(range(T), [visible(x) for x in m.labels], rotation=90, fontsize=6)
            ax.set_yticks(range(T), [visible(x) for x in m.labels], fontsize=6)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(f"{e.model.name}, block {e.layer}: attention weights (row: query, column: key)")
    return fig, series
