"""Rich renderables for `fptrace diff`."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from fptrace.commands.diff.result import DiffSide, StatsDiff, TraceDiff
from fptrace.render.fit import Col, RowStyle, fit_table
from fptrace.render.text import bullets, compact, norm, num, visible


def _side(s: DiffSide) -> Text:
    text = Text(f"{s.label}: ", style="bold")
    text.append(f"{s.model} ({s.dtype} on {s.device})" + ("  RANDOM WEIGHTS"
                                                           if s.random_weights else ""))
    text.append(f"  {s.prompt!r}  [{len(s.tokens)} tokens: "
                + " ".join(visible(t) for _, t in s.tokens) + "]", style="dim")
    return text


LAYER_COLS = (Col("layer", 0, "right"), Col("‖a‖", 0, "right"), Col("‖b‖", 0, "right"),
              Col("‖a − b‖ / ‖a‖", 0, "right"), Col("cos", 1, "right"),
              Col("lens top-1 a", 2), Col("lens top-1 b", 2), Col("", 2))


def layers_table(d: TraceDiff, width: int | None) -> RenderableType:
    rows = []
    for r in d.layers:
        over = r.rel_diff is not None and not r.rel_diff <= d.tolerance
        rel = "—" if r.rel_diff is None else f"{r.rel_diff:.2e}"
        rows.append(RowStyle([
            "embed" if r.layer is None else str(r.layer), norm(r.norm_a), norm(r.norm_b),
            Text(rel, style="bold red" if over else None), num(r.cos, 6),
            Text(visible(r.lens_a or "—")), Text(visible(r.lens_b or "—")),
            "" if r.lens_same else "≠"], None))
    return fit_table(LAYER_COLS, rows, width, title="The last position's stream, layer by layer "
                     f"(tolerance on ‖a − b‖ / ‖a‖: {d.tolerance_reason})", title_justify="left")


TOP_COLS = (Col("token", 0), Col("id", 2, "right"), Col("rank a", 0, "right"),
            Col("rank b", 0, "right"), Col("", 1), Col("p a", 0, "right"),
            Col("p b", 0, "right"))


def top_table(d: TraceDiff, width: int | None) -> RenderableType:
    rows = []
    for t in d.top_k:
        move = "" if t.rank_a == t.rank_b else ("new in b" if t.rank_a is None else
                                                "gone in b" if t.rank_b is None else
                                                "↑" if t.rank_b < t.rank_a else "↓")
        rows.append([Text(visible(t.text)), str(t.id), "—" if t.rank_a is None else str(t.rank_a),
                     "—" if t.rank_b is None else str(t.rank_b), move, num(t.prob_a, 4),
                     num(t.prob_b, 4)])
    return fit_table(TOP_COLS, rows, width, title="Top-k of both, with rank changes",
                     title_justify="left")


def verdict(d: TraceDiff) -> Text:
    if d.within:
        return Text(f"✓ a and b agree within {d.tolerance:g} at every layer", style="bold green")
    if not d.comparable:
        return Text("✗ the streams could not be compared at every layer (see the notes)",
                    style="bold yellow")
    worst = max((r.rel_diff for r in d.layers if r.rel_diff is not None), default=0.0)
    return Text(f"✗ a and b differ: first over {d.tolerance:g} at {d.first_over}; largest "
                f"relative difference {worst:.2e}", style="bold red")


def diff_view(d: TraceDiff, width: int | None = 120) -> RenderableType:
    notes = bullets(d.notes)
    return Group(_side(d.a), _side(d.b), layers_table(d, width), top_table(d, width), notes,
                 verdict(d))


def stats_diff_view(d: StatsDiff, width: int | None = 120) -> RenderableType:
    """`diff --stats`: the channels that moved most, then each site's median and largest move."""
    head = Text(f"a: {d.a}  ({d.model_a}, {d.prompts_a} prompts)\nb: {d.b}  ({d.model_b}, "
                f"{d.prompts_b} prompts)", style="bold")
    cols = (Col("layer", 0, "right"), Col("site", 0), Col("channel", 0, "right"),
            Col("|x| max a", 0, "right"), Col("|x| max b", 0, "right"),
            Col("change", 0, "right"), Col("mean a → b", 1, "right"),
            Col("std a → b", 2, "right"))
    rows = [["final" if m.layer is None else str(m.layer), m.site, str(m.channel),
             compact(m.absmax_a), compact(m.absmax_b), f"{m.change:.1%}",
             f"{compact(m.mean_a)} → {compact(m.mean_b)}",
             f"{compact(m.std_a)} → {compact(m.std_b)}"] for m in d.channels]
    moved = fit_table(cols, rows, width, title="The channels whose |x| max moved most: |b − a| "
                      "/ max(a, 1% of the site's largest)", title_justify="left")
    site_cols = (Col("layer", 0, "right"), Col("site", 0), Col("median change", 0, "right"),
                 Col("largest", 0, "right"), Col("channel", 0, "right"))
    site_rows = [["final" if s.layer is None else str(s.layer), s.site, f"{s.median_change:.1%}",
                  f"{s.max_change:.1%}", str(s.channel)] for s in d.sites]
    sites = fit_table(site_cols, site_rows, width, title="Per site", title_justify="left")
    return Group(head, moved, sites, bullets(d.notes))
