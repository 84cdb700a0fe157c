"""`fptrace report`: one self-contained HTML file (no scripts, no network requests: figures are
inline PNG data, styles inline, the JSON trace a data: link) holding the run tables, the
figures, the explain walkthrough of one layer and the trace as JSON."""

from __future__ import annotations

import base64
import html
import io
import os
from typing import Any

from fptrace.commands.explain.result import Explanation
from fptrace.results import Trace
from fptrace.errors import BadInput

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="fptrace">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222;
       background: #fff; line-height: 1.45; }}
h1 {{ font-size: 1.5em; }} h2 {{ font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }}
pre.term {{ font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
           font-size: 12px; line-height: 1.25; padding: 1em; overflow-x: auto; border-radius: 6px; }}
img {{ max-width: 100%; border: 1px solid #eee; }}
.verdict-ok {{ color: #0a7a2f; font-weight: bold; }} .verdict-bad {{ color: #b00020; font-weight: bold; }}
.tokens span {{ display: inline-block; border: 1px solid #bbb; border-radius: 4px; padding: 0 .3em;
               margin: .1em; font-family: ui-monospace, monospace; background: #f6f6f6; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""


def _terminal(renderable: Any, width: int = 130) -> str:
    """A rich renderable as an HTML <pre> with inline styles (what the terminal shows)."""
    from rich.console import Console

    console = Console(record=True, file=io.StringIO(), width=width, color_system="truecolor",
                      force_terminal=True)
    console.print(renderable)
    return console.export_html(inline_styles=True, code_format=(
        '<pre class="term" style="color:{foreground};background:{background}">{code}</pre>'))


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _section(title: str, alt: str, fig: Any, view: Any) -> list[str]:
    """One section of the page: its heading, its figure (none: no image) and its terminal view."""
    return [f"<h2>{title}</h2>",
            *([f'<img alt="{alt}" src="{_png(fig)}">'] if fig is not None else []),
            _terminal(view)]


def build_html(trace: Trace, explanation: Explanation, attribution: Any = None,
               patching: Any = None, against: Any = None, qk: Any = None,
               steering: Any = None, ablation: Any = None) -> str:
    from fptrace.commands.attribute.render import attribution_figure, attribution_view
    from fptrace.commands.explain.render import attention_figure, explain_view
    from fptrace.commands.run.render import trace_figure, trace_view
    from fptrace.render.json import to_json
    from fptrace.render.text import visible

    esc = html.escape
    top = trace.top_k[0]
    json_href = "data:application/json;base64," + base64.b64encode(
        to_json(trace).encode("utf-8")).decode("ascii")
    tokens = "".join(f'<span title="id {t.id}">{esc(visible(t.text))}</span>'
                     for t in trace.tokens)
    verdict = ('<p class="verdict-ok">The recomputed block matches the model.</p>'
               if explanation.match else
               '<p class="verdict-bad">THE RECOMPUTATION DOES NOT MATCH THE MODEL.</p>')
    body = [
        f"<h1>fptrace report: {esc(trace.model.name)}</h1>",
        f"<p>Prompt: <code>{esc(trace.prompt)}</code></p>",
        f'<p class="tokens">Tokens: {tokens}</p>',
        f"<p>Top-1 next token: <b>{esc(visible(top.text))}</b> (id {top.id}, p = "
        f"{top.prob:.4f})</p>",
        f'<p><a download="trace.json" href="{json_href}">Download the trace as JSON</a> '
        f"(schema version {esc(trace.schema_version)})</p>",
        "<h2>Figures</h2>",
        f'<img alt="residual stream, logit lens and top-k" src="{_png(trace_figure(trace)[0])}">',
        f'<img alt="attention of every head at block {explanation.layer}" '
        f'src="{_png(attention_figure(explanation)[0])}">',
        "<h2>The forward pass, block by block</h2>",
        _terminal(trace_view(trace, 130)),
        f"<h2>Block {explanation.layer}, step by step</h2>",
        verdict,
        _terminal(explain_view(explanation)),
    ]
    if attribution is not None:
        body += _section("Where the answer comes from: direct logit attribution",
                         "attribution per block and per head",
                         attribution_figure(attribution)[0], attribution_view(attribution, 130))
    if qk is not None:
        from fptrace.commands.attribute.render import qk_figure, qk_view

        body += _section(f"Why head {qk.layer}.{qk.head} attends where it does: its score, part "
                         "by part", "query parts × key parts of the score", qk_figure(qk)[0],
                         qk_view(qk, 130))
    if patching is not None:
        from fptrace.commands.patch.render import patch_figure, patch_view

        body += _section("Where the prediction is carried: causal tracing",
                         "causal tracing heatmap", patch_figure(patching)[0],
                         patch_view(patching, 130))
    if against is not None:
        from fptrace.commands.diff.render import deep_figure, diff_view

        side = (f"{against.b.model} ({against.b.dtype}" + (f", {against.b.quantization} "
                "weight-only" if against.b.quantization else "") + ")")
        body += _section(f"Where two runs part: against {esc(side)}, point by point",
                         "relative difference at every point of every block",
                         deep_figure(against)[0] if against.deep.blocks else None,
                         diff_view(against, 130))
    if steering is not None:
        from fptrace.commands.steer.render import steer_figure, steer_view

        body += _section("What if: a steering vector added to the stream", "steering sweep",
                         steer_figure(steering)[0], steer_view(steering, 130))
    if ablation is not None:
        from fptrace.commands.ablate.render import ablate_figure, ablate_view

        body += _section("What if: one head or MLP removed", "ablation grid",
                         ablate_figure(ablation)[0], ablate_view(ablation, 130))
    return PAGE.format(title=esc(f"fptrace: {trace.prompt[:60]}"), body="\n".join(body))


def check_out(path: str, force: bool = False) -> None:
    from fptrace.atomic import check_target

    check_target(path, "--out", "report.html", force)
    if os.path.splitext(path)[1].lower() not in (".html", ".htm"):
        raise BadInput(f"--out {path}: a report is an .html file")


def write_report(path: str, text: str) -> None:
    from fptrace.atomic import write_text_atomic

    write_text_atomic(path, text, ".html")
