"""The HTML page of a report: one self-contained file (its style and script inline, figures as
inline PNG data, no request of any kind) holding the trace's header, the explorer (page.js
drawing the trace and what each section offers, render/pagedata.py, from the JSON block embedded
here), and the figures and terminal views of each section (cli/sections.py), in their order on
the page. The style and the scripts are files of this package, page.css, page.js and
pagegraph.js (the node-link drawings), inlined when a page is written. The report, `--html` on
the analysis commands and the TUI's export build it."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from fptrace.results import Trace

HEAD = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="fptrace">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; \
style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>{title}</title>
"""


SCRIPTS = ("page.js", "pagegraph.js")  # the page's scripts, each in its <script>, in order


@dataclass(frozen=True)
class PageData:
    """What the page's script reads besides the trace: each section's heatmaps and block
    details (render/pagedata.py), in page order."""

    sections: tuple[Any, ...]


def inlined(name: str) -> str:
    """The text of one of the page's own files (page.css, SCRIPTS), to go inside the page's
    <style> or <script> element: a file holding `</` followed by that element's name would end it
    early, and is refused."""
    text = files(__package__).joinpath(name).read_text(encoding="utf-8")
    element = "style" if name.endswith(".css") else "script"
    if f"</{element}" in text.lower():
        raise ValueError(f"{name} holds </{element}, which would end its <{element}> element")
    return text


def embedded(text: str) -> str:
    """JSON text safe inside a <script> block: `<` written as its escape, so that no text of
    a prompt can end the block (the JSON's value is unchanged)."""
    return text.replace("<", "\\u003c")


def page_data(parts: Sequence[tuple[Any, Any]]) -> str:
    """The sections' JSON block: what each offers (its `data`: one SectionData, a tuple of
    them for a section that is several on the page, or None), through render/json.py."""
    from fptrace.render.json import to_json

    offered = tuple(x for section, result in parts
                    if (d := section.data(result)) is not None
                    for x in (d if isinstance(d, tuple) else (d,)))
    return embedded(to_json(PageData(offered), indent=None))


def build_html(trace: Trace, parts: Sequence[tuple[Any, Any]]) -> str:
    """The page: the trace's header, the explorer, then each section's figures under one
    heading, then each section's body, in the order of `parts` (each a section of
    cli/sections.py with its result)."""
    from fptrace.render.json import to_json
    from fptrace.render.text import inert, visible

    esc = html.escape
    top = trace.top_k[0]
    tokens = "".join(f'<span title="id {t.id}">{esc(visible(t.text))}</span>'
                     for t in trace.tokens)
    body = [
        f"<h1>fptrace report: {esc(trace.model.name)}</h1>",
        f"<p>Prompt: <code>{esc(inert(trace.prompt))}</code></p>",
        f'<p class="tokens">Tokens: {tokens}</p>',
        f"<p>Top-1 next token: <b>{esc(visible(top.text))}</b> (id {top.id}, p = "
        f"{top.prob:.4f})</p>",
        '<p><a id="download" download="trace.json" href="#fptrace-trace">Download the trace as '
        f"JSON</a> (schema version {esc(trace.schema_version)}; it is also in this file's "
        "source, the block <code>fptrace-trace</code>)</p>",
        '<h2>Explore</h2>',
        '<section id="explore" aria-label="explore the trace">'
        + ("<noscript>The explorer needs JavaScript; the figures and tables below do not."
           "</noscript>" if trace.lens_grid else
           "<p>No logit-lens grid in this trace: nothing to explore.</p>") + "</section>",
        "<h2>Figures</h2>",
    ]
    for section, result in parts:
        body += section.figures(result)
    for section, result in parts:
        body += section.body(result)
    return "".join([
        HEAD.format(title=esc(f"fptrace: {inert(trace.prompt[:60])}")),
        f"<style>\n{inlined('page.css')}</style>\n</head>\n<body>\n", "\n".join(body), "\n",
        '<script type="application/json" id="fptrace-trace">',
        embedded(to_json(trace, indent=None)), "</script>\n",
        f'<script type="application/json" id="fptrace-data">{page_data(parts)}</script>\n',
        *(f"<script>\n{inlined(name)}</script>\n" for name in SCRIPTS), "</body>\n</html>\n"])
