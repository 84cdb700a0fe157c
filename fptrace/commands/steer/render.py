"""Rich renderables and the figure of `fptrace steer`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.text import Text

from fptrace.commands.steer.result import Steering, SteerRow
from fptrace.render.figures import pyplot
from fptrace.render.fit import Col, fit_table
from fptrace.render.tables import check_lines, header
from fptrace.render.text import bullets, norm, visible

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _scale(r: SteerRow) -> str:
    return f"{r.scale:g}" + (" (clean)" if r.clean else "")


def _blocks(layers: tuple[int, ...]) -> str:
    if len(layers) == 1:
        return f"block {layers[0]}"
    return "blocks " + ", ".join(str(k) for k in layers)


def _positions(s: Steering) -> str:
    if s.positions is None:
        return "at every position (generated tokens included)"
    return "at position" + ("s " if len(s.positions) > 1 else " ") + ", ".join(
        f"{p} {visible(s.tokens[p].text)}" for p in s.positions)


def summary(s: Steering) -> Text:
    v = s.vector
    sizes = ", ".join(f"‖v‖ = {norm(n)} against ‖x‖ = {norm(x)}"
                      for n, x in zip(v.norms, v.stream_norms))
    t = Text("Steering vector: ", style="bold")
    t.append(v.description)
    t.append(f"\n{sizes} (the clean stream after {_blocks(v.layers)}, last position)"
             + ("; --norm-match scaled it to that norm" if v.norm_matched else ""))
    strengths = ", ".join(f"{r.scale:g}" for r in s.rows if not r.clean)
    t.append(f"\nadded to the output of {_blocks(v.layers)} {_positions(s)}, × {strengths}: "
             f"one forward pass, a row per strength with the clean run among them "
             f"({s.forward_passes} forward passes in all)")
    t.append(f"\nTarget {visible(s.target.text)} (id {s.target.id}): p = {s.target.prob:.4f}, "
             f"logit {s.target.logit:.3f} in the clean run", style="bold")
    return t


SWEEP_COLS = (Col("scale", 0, "right"), Col("top-1", 0), Col("p", 0, "right"),
              Col("target p", 0, "right"), Col("Δp", 1, "right"), Col("Δ logit", 0, "right"),
              Col("KL final", 0, "right"), Col("lens changed", 1, "right"),
              Col("top-k", 2, wrap=True, min_width=20))


def sweep_table(s: Steering, width: int | None) -> RenderableType:
    rows = []
    for r in s.rows:
        top = r.top[0]
        rows.append([
            _scale(r), Text(visible(top.text)), f"{top.prob:.4f}", f"{r.target.prob:.4f}",
            f"{r.prob_change:+.4f}", f"{r.logit_change:+.3f}", f"{r.kl[-1]:.4f}",
            "—" if r.first_changed is None else f"block {r.first_changed}",
            Text("  ".join(f"{visible(x.text)} {x.prob:.3f}" for x in r.top))])
    return fit_table(SWEEP_COLS, rows, width, title="Each strength against the clean run (KL "
                     "final: KL(steered ‖ clean) of the output, nats; lens changed: the first "
                     "block whose logit-lens top-1 is not the clean one's)",
                     title_justify="left")


def kl_table(s: Steering, width: int | None) -> RenderableType:
    steered = [r for r in s.rows if not r.clean]
    cols = [Col("block", 0, "right")] + [Col(f"× {r.scale:g}", 0 if i < 4 else 1, "right")
                                         for i, r in enumerate(steered)]
    rows = []
    for j, k in enumerate(s.kl_layers):
        cells: list[str | Text] = [str(k)]
        for r in steered:
            first = r.first_changed == k
            cells.append(Text(f"{r.kl[j]:.4f}" + ("★" if first else " "),
                              style="bold" if first else ""))
        rows.append(cells)
    return Group(Text("KL(steered ‖ clean) of the logit lens at the last position after each "
                      "block, nats (★: where its top-1 first differs from the clean run's)"),
                 fit_table(cols, rows, width))


def continuation_table(s: Steering, width: int | None) -> RenderableType:
    cols = (Col("scale", 0, "right"), Col(f"greedy continuation, {s.new_tokens} tokens", 0,
                                          wrap=True, min_width=20))
    rows = [[_scale(r), Text((r.continuation_text or "").replace("\n", "↵"))] for r in s.rows]
    return fit_table(cols, rows, width, title="Side by side", title_justify="left")


def steer_view(s: Steering, width: int | None = 120) -> RenderableType:
    parts: list[Any] = [header(s.model), summary(s), sweep_table(s, width), kl_table(s, width)]
    if s.new_tokens:
        parts.append(continuation_table(s, width))
    parts += [bullets(s.notes), check_lines(s.checks, "THE STEERED RUN DOES NOT CHECK OUT: do "
                                            "not trust the numbers above.")]
    return Group(*parts)


def steer_figure(s: Steering) -> tuple[Figure, dict]:
    """The sweep's curves: the target's probability and the output's KL against the strength,
    and KL(steered ‖ clean) after each block, a curve per strength."""
    plt = pyplot()
    series: dict[str, Any] = {"scales": [r.scale for r in s.rows],
                              "target_prob": [r.target.prob for r in s.rows],
                              "kl_final": [r.kl[-1] for r in s.rows],
                              "kl_layers": list(s.kl_layers),
                              "kl": {f"{r.scale:g}": list(r.kl) for r in s.rows if not r.clean}}
    order = sorted(range(len(s.rows)), key=lambda i: s.rows[i].scale)
    fig, (ax, kx) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    xs = [series["scales"][i] for i in order]
    ax.plot(xs, [series["target_prob"][i] for i in order], "o-", color="tab:blue")
    ax.set_xlabel("strength (× the vector)")
    ax.set_ylabel(f"p({visible(s.target.text)})", color="tab:blue")
    twin = ax.twinx()
    twin.plot(xs, [series["kl_final"][i] for i in order], "s--", color="tab:red")
    twin.set_ylabel("KL(steered ‖ clean) of the output, nats", color="tab:red")
    ax.set_title("The target and the output against the strength")
    for name, values in series["kl"].items():
        kx.plot(series["kl_layers"], values, marker=".", label=f"× {name}")
    kx.set_xlabel("block")
    kx.set_ylabel("KL(steered ‖ clean) of the logit lens, nats")
    kx.set_title("Where the change builds up")
    kx.legend()
    fig.suptitle(f"{s.model.name}: steering with {s.vector.description}"[:120]
                 + ("  (RANDOM WEIGHTS)" if s.model.random_weights else ""))
    return fig, series
