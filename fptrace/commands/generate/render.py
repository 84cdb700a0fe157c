"""Rich renderables for `fptrace generate`: one line per forward pass, printed as it happens."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from fptrace.commands.generate.result import Generation, GenStep
from fptrace.models.memory import human_bytes
from fptrace.render.fit import WIDE_HINT
from fptrace.render.tables import layers as layers_table
from fptrace.render.text import shape, visible


@dataclass(frozen=True)
class StepCol:
    name: str
    width: int
    justify: str
    priority: int  # 0: always shown; larger numbers are left out first on a narrow terminal


@dataclass(frozen=True)
class StepColumns:
    """The columns of the step lines, chosen once from the terminal's width and sized from the
    largest value each can hold in this generation, so no number is ever cut."""

    cols: tuple[StepCol, ...]
    left_out: tuple[str, ...]
    width: int | None
    sampled: bool  # sampling: the chosen token's p under the model and under the sampling
    # distribution (temperature, top-k, top-p) side by side, each labelled


def step_columns(width: int | None, max_positions: int, d_model: int, n_kv_heads: int,
                 head_dim: int, sampled: bool = False) -> StepColumns:
    """width None (--wide): every column."""
    every = (
        StepCol("step", max(4, len(str(max_positions))), "right", 0),
        StepCol("phase", 7, "left", 7),
        StepCol("input", len(shape((1, max_positions))), "left", 6),
        StepCol("stream", len(shape((1, max_positions, d_model))), "left", 3),
        StepCol("KV per layer", max(12, len(shape((1, n_kv_heads, max_positions, head_dim)))),
                "left", 4),
        StepCol("KV total", 10, "right", 2),
        StepCol("token", 12, "left", 0),
        *((StepCol("p model", 7, "right", 0), StepCol("p sampled", 9, "right", 0)) if sampled
          else (StepCol("p", 4, "right", 0),)),
        StepCol("alternatives (p model)" if sampled else "alternatives (p)", 26, "left", 5),
        StepCol("ms", 7, "right", 1),
    )
    keep = list(every)
    if width is not None:
        room = width - 14  # leave the text so far two spaces and at least 12 characters
        for col in sorted(every, key=lambda c: -c.priority):
            if sum(c.width + 1 for c in keep) <= room or col.priority == 0:
                break
            keep.remove(col)
    left = tuple(c.name for c in every if c not in keep)
    return StepColumns(tuple(keep), left, width, sampled)


def _cells(cols: StepColumns, values: dict[str, str]) -> str:
    """Each value padded to its column; a value longer than its column (a long token) widens
    its line instead of being cut."""
    return " ".join(values[c.name].rjust(c.width) if c.justify == "right"
                    else values[c.name].ljust(c.width) for c in cols.cols)


def step_header(cols: StepColumns) -> Text:
    text = Text(_cells(cols, {c.name: c.name for c in cols.cols}) + "  text so far",
                style="bold")
    if cols.left_out:
        text.append(f"\nleft out at {cols.width} columns: {', '.join(cols.left_out)} "
                    f"({WIDE_HINT})", style="dim")
    return text


def step_line(step: GenStep, text_so_far: str, cols: StepColumns) -> Text:
    alts = ""
    for a in step.alternatives:  # whole entries only, as many as fit
        if a.id == step.token.id:
            continue
        item = f"{visible(a.text)} {a.prob:.2f}"
        if len(alts) + len(item) + 1 > 26:
            break
        alts = f"{alts} {item}" if alts else item
    values = {"step": str(step.index), "phase": step.phase,
              "input": shape(step.input_shape), "stream": shape(step.stream_shape),
              "KV per layer": shape(step.kv_shape), "KV total": human_bytes(step.kv_bytes),
              "token": visible(step.token.text), "p": f"{step.token.prob:.2f}",
              "p model": f"{step.token.prob:.2f}", "p sampled": f"{step.sample_prob:.2f}",
              "alternatives (p)": alts, "alternatives (p model)": alts,
              "ms": f"{step.seconds * 1000:.1f}"}
    line = Text(_cells(cols, values))
    shown = visible(text_so_far)
    tail = max(12, (cols.width or 10_000) - len(line) - 3)
    line.append("  " + ("…" + shown[-tail:] if len(shown) > tail else shown), style="green")
    if step.first_nonfinite:
        line.append(f"  NaN/Inf at {step.first_nonfinite}", style="bold red")
    return line


def step_layers(step: GenStep, width: int | None) -> RenderableType:
    return layers_table(step, width)  # GenStep has layers, final_norm and first_nonfinite


def summary(g: Generation) -> RenderableType:
    text = Text(g.prompt, style="dim")
    text.append(g.text, style="bold green")
    first = g.steps[0]
    last = g.steps[-1]
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    rate = f"{g.decode_tokens_per_s:.1f} tokens/s" if g.decode_tokens_per_s else "—"
    t.add_row("sampling", f"{g.strategy}" + (f" (seed {g.seed})" if g.temperature else ""))
    t.add_row("stopped", {"eos": "end-of-sequence token",
                          "max_new_tokens": f"after -n {g.max_new_tokens} tokens"}[g.stop_reason])
    t.add_row("prefill", f"{len(g.tokens)} tokens in {g.prefill_seconds * 1000:.1f} ms")
    t.add_row("decode", f"{len(g.steps) - 1} steps in {g.decode_seconds * 1000:.1f} ms: {rate}")
    t.add_row("KV cache", f"{'; '.join(last.kv_layout)}, keys and values "
              f"= {human_bytes(last.kv_bytes)} (after the prefill: "
              f"{human_bytes(first.kv_bytes)}; per token: "
              f"{human_bytes(last.kv_bytes // max(last.kv_shape[2], 1))})")
    parts: list[RenderableType] = [Panel(text, title="Text (prompt dim, generated bold)",
                                         title_align="left", expand=False), t]
    for n in g.notes:
        parts.append(Text("• " + n, style="bold red" if n.startswith("RANDOM") else "dim"))
    return Group(*parts)
