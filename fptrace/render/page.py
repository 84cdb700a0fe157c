"""The HTML page of a report: one self-contained file (no scripts, no network requests:
figures are inline PNG data, styles inline, the JSON trace a data: link) holding the trace's
header and the parts of each section (cli/sections.py), in their order on the page. The report
and the TUI's export build it."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from typing import Any

from fptrace.results import Trace

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


def build_html(trace: Trace, parts: Sequence[tuple[Any, Any]]) -> str:
    """The page: the trace's header, then each section's figures under one heading, then each
    section's body, in the order of `parts` (each a section of cli/sections.py
    with its result)."""
    from fptrace.render.json import to_json
    from fptrace.render.text import visible

    esc = html.escape
    top = trace.top_k[0]
    json_href = "data:application/json;base64," + base64.b64encode(
        to_json(trace).encode("utf-8")).decode("ascii")
    tokens = "".join(f'<span title="id {t.id}">{esc(visible(t.text))}</span>'
                     for t in trace.tokens)
    body = [
        f"<h1>fptrace report: {esc(trace.model.name)}</h1>",
        f"<p>Prompt: <code>{esc(trace.prompt)}</code></p>",
        f'<p class="tokens">Tokens: {tokens}</p>',
        f"<p>Top-1 next token: <b>{esc(visible(top.text))}</b> (id {top.id}, p = "
        f"{top.prob:.4f})</p>",
        f'<p><a download="trace.json" href="{json_href}">Download the trace as JSON</a> '
        f"(schema version {esc(trace.schema_version)})</p>",
        "<h2>Figures</h2>",
    ]
    for section, result in parts:
        body += section.figures(result)
    for section, result in parts:
        body += section.body(result)
    return PAGE.format(title=esc(f"fptrace: {trace.prompt[:60]}"), body="\n".join(body))
