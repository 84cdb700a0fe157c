"""Rich renderables for `fptrace generate`: one line per forward pass, printed as it happens."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..memory import human_bytes
from ..results import Generation, GenStep
from .tables import layers as layers_table
from .text import shape, visible

# column widths of the step lines
_COLS = (("step", 4, "right"), ("phase", 7, "left"), ("input", 7, "left"),
         ("stream", 12, "left"), ("KV per layer", 15, "left"), ("KV total", 9, "right"),
         ("token", 12, "left"), ("p", 5, "right"), ("alternatives (p)", 26, "left"),
         ("ms", 7, "right"))


def _cells(values: list[str]) -> str:
    out = []
    for (name, width, justify), v in zip(_COLS, values):
        v = v if len(v) <= width else v[:width - 1] + "…"
        out.append(v.rjust(width) if justify == "right" else v.ljust(width))
    return " ".join(out)


def step_header() -> Text:
    return Text(_cells([name for name, _, _ in _COLS]) + "  text so far", style="bold")


def step_line(step: GenStep, text_so_far: str, width: int = 130) -> Text:
    alts = ""
    for a in step.alternatives:  # whole entries only, as many as fit
        if a.id == step.token.id:
            continue
        item = f"{visible(a.text)} {a.prob:.2f}"
        if len(alts) + len(item) + 1 > 26:
            break
        alts = f"{alts} {item}" if alts else item
    line = Text(_cells([
        str(step.index), step.phase, shape(step.input_shape), shape(step.stream_shape),
        shape(step.kv_shape), human_bytes(step.kv_bytes), visible(step.token.text),
        f"{step.token.prob:.2f}", alts, f"{step.seconds * 1000:.1f}"]))
    shown = visible(text_so_far)
    tail = max(12, width - len(line) - 3)
    line.append("  " + ("…" + shown[-tail:] if len(shown) > tail else shown), style="green")
    if step.first_nonfinite:
        line.append(f"  NaN/Inf at {step.first_nonfinite}", style="bold red")
    return line


def step_layers(step: GenStep, width: int) -> RenderableType:
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
