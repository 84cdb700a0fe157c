"""Rich renderables and the figure of `fptrace features`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.text import Text

from fptrace.commands.features.result import DictionaryReadout, FeatureAttribution, Features
from fptrace.render.figures import pyplot
from fptrace.render.fit import Col, fit_table
from fptrace.render.tables import check_lines, header
from fptrace.render.text import bar, bullets, visible

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from fptrace.commands.features.result import TrainResult, TranscodersResult


def _name(r: DictionaryReadout) -> str:
    return os.path.basename(os.path.normpath(r.path)) or r.path


def summary(f: Features, r: DictionaryReadout) -> Text:
    t = Text(f"{'SKIP ' if r.skip else ''}{r.role.upper()} {_name(r)} ({r.format}, "
             f"{r.activation}"
             + (f", k = {r.k}" if r.k is not None else "") + f", {r.d_sae} latents)", style="bold")
    where = r.site if r.site == r.out_site else f"{r.site} → {r.out_site}"
    t.append(f" reads {where}")
    fvu = "—" if r.fvu is None else f"{r.fvu:.4f}"
    t.append(f"\nFVU {fvu} (massive positions left out)   mean L0 {r.l0:.1f}   "
             f"x = Σ aᵢ·dᵢ + {'x_in·W_skip + ' if r.skip else ''}b_dec + error to "
             f"{r.decomposition_gap:.2e} relative")
    return t


POSITION_COLS = (Col("pos", 0, "right"), Col("token", 0), Col("‖x‖", 0, "right"),
                 Col("‖error‖", 0, "right"), Col("err²/x²", 1, "right"), Col("L0", 0, "right"),
                 Col("top latents (activation)", 0, wrap=True, min_width=20))


def positions_table(f: Features, r: DictionaryReadout, width: int | None) -> RenderableType:
    rows = []
    for p in r.positions:
        skip = [f"{p.skip_norm:.4g}"] if r.skip and p.skip_norm is not None else \
            ["—"] if r.skip else []
        rows.append([str(p.position) + ("*" if p.massive else ""),
                     Text(visible(f.tokens[p.position].text)), f"{p.norm:.4g}", *skip,
                     f"{p.error_norm:.4g}", f"{p.relative_error:.3f}", str(p.l0),
                     Text("  ".join(f"{v.latent}:{v.activation:.3g}" for v in p.top))])
    cols = (*POSITION_COLS[:3], Col("‖x·W_skip‖", 0, "right"), *POSITION_COLS[3:]) if r.skip \
        else POSITION_COLS
    return fit_table(cols, rows, width, title="Per position (* a massive activation: "
                     "decomposed, left out of the FVU)", title_justify="left")


TERM_COLS = (Col("term", 0), Col("activation", 0, "right"), Col("logits", 0, "right"),
             Col("", 1))


def attribution_table(a: FeatureAttribution, width: int | None) -> RenderableType:
    top = max([abs(x.logits) for x in a.latents] + [abs(a.error), abs(a.rest), abs(a.b_dec),
                                                    abs(a.skip or 0.0)])
    rows: list[list[Any]] = []

    def row(name: str, act: str, value: float) -> None:
        rows.append([name, act, f"{value:+.4f}",
                     Text(bar(abs(value), top, 10), style="green" if value >= 0 else "red")])

    for x in a.latents:
        row(f"latent {x.latent}", f"{x.activation:.4g}", x.logits)
    row("other active latents", "", a.other_latents)
    if a.skip is not None:
        row("skip (x·W_skip: the transcoder's affine term)", "", a.skip)
    row("b_dec", "", a.b_dec)
    row("error (what the dictionary misses)", "", a.error)
    row("rest of the stream", "", a.rest)
    if a.biases:
        row("final norm and LM head biases", "", a.biases)
    title = (f"The logit of {visible(a.target.text)} (id {a.target.id}, p = {a.target.prob:.4f}) "
             f"split through the dictionary: total {a.total:.4f}, model {a.model_logit:.4f}, "
             f"difference {a.difference:+.2e} ({a.tolerance})")
    return fit_table(TERM_COLS, rows, width, title=title, title_justify="left")


def latent_table(f: Features, width: int | None) -> RenderableType | None:
    traced = [(r, r.latent) for r in f.dictionaries if r.latent is not None]
    if not traced:
        return None
    cols = [Col("pos", 0, "right"), Col("token", 0)] + [
        Col(f"{r.out_site}", 0 if i < 3 else 1, "right") for i, (r, _) in enumerate(traced)]
    rows = [[str(p), Text(visible(tok.text))] + [f"{latent.activations[p]:.4g}"
                                                 for _, latent in traced]
            for p, tok in enumerate(f.tokens)]
    return fit_table(cols, rows, width, title=f"Latent {traced[0][1].latent} over the "
                     "positions (its activation in each dictionary)", title_justify="left")


def top_prompts_table(f: Features, width: int | None) -> RenderableType | None:
    if not f.top_prompts:
        return None
    cols = (Col("#", 0, "right"), Col("prompt", 0), Col("pos", 0, "right"), Col("token", 0),
            Col("activation", 0, "right"), Col("context", 1, wrap=True, min_width=20))
    rows = [[str(i + 1), x.prompt_id, str(x.position), Text(visible(x.token)),
             f"{x.activation:.4g}", Text(visible(x.context))]
            for i, x in enumerate(f.top_prompts)]
    return fit_table(cols, rows, width, title=f"Where the latent is largest over "
                     f"{f.prompts_read} prompts", title_justify="left")


def features_view(f: Features, width: int | None = 120) -> RenderableType:
    parts: list[Any] = [header(f.model)]
    for r in f.dictionaries:
        parts += [summary(f, r), positions_table(f, r, width)]
        if r.attribution is not None:
            parts.append(attribution_table(r.attribution, width))
    for extra in (latent_table(f, width), top_prompts_table(f, width)):
        if extra is not None:
            parts.append(extra)
    parts += [bullets(f.notes), check_lines(f.checks, "THE DECOMPOSITION DOES NOT CHECK OUT: do "
                                            "not trust the numbers above.")]
    return Group(*parts)


def features_figure(f: Features) -> tuple[Figure, dict]:
    """Per dictionary: ‖x‖ and ‖error‖ over the positions, and the logit split's terms."""
    plt = pyplot()
    n = len(f.dictionaries)
    fig, axes = plt.subplots(n, 2, figsize=(13, 4 * n), constrained_layout=True, squeeze=False)
    series: dict = {"dictionaries": []}
    for (ax, bx), r in zip(axes, f.dictionaries):
        xs = [p.position for p in r.positions]
        s: dict[str, Any] = {"site": r.out_site, "norm": [p.norm for p in r.positions],
             "error_norm": [p.error_norm for p in r.positions],
             "l0": [p.l0 for p in r.positions]}
        ax.semilogy(xs, s["norm"], "o-", label="‖x‖")
        ax.semilogy(xs, [max(e, 1e-12) for e in s["error_norm"]], "s--", label="‖error‖")
        ax.set_xlabel("position")
        ax.set_title(f"{r.out_site}: what it reads and what it misses")
        ax.legend()
        if r.attribution is not None:
            a = r.attribution
            names = [f"latent {x.latent}" for x in a.latents] + ["other latents", "b_dec",
                                                                  "error", "rest"]
            values = [x.logits for x in a.latents] + [a.other_latents, a.b_dec, a.error, a.rest]
            if a.skip is not None:
                names.append("skip")
                values.append(a.skip)
            s["terms"] = dict(zip(names, values))
            bx.barh(names[::-1], values[::-1],
                    color=["tab:green" if v >= 0 else "tab:red" for v in values[::-1]])
            bx.set_xlabel(f"logits of {visible(a.target.text)}")
            bx.set_title("The target's logit, term by term")
        else:
            bx.axis("off")
        series["dictionaries"].append(s)
    fig.suptitle(f"{f.model.name}: {visible(f.prompt)[:60]}"
                 + ("  (RANDOM WEIGHTS)" if f.model.random_weights else ""))
    return fig, series


def train_view(r: TrainResult, width: int | None = 120) -> RenderableType:
    """What `features train` made and how well it rebuilds held-out text."""
    t = Text(f"TopK SAE written to {r.out} (SAELens layout: cfg.json + sae_weights.safetensors)",
             style="bold")
    t.append(f"\n{r.latents} latents, k = {r.k}, reading {r.site} of {r.model.name}")
    t.append(f"\ntrained on {r.train_tokens:,} positions of {r.prompts} prompts (each prompt's "
             f"first position left out: the massive activation), {r.steps} steps, "
             f"{r.tokens_seen:,} tokens seen"
             + (f", resumed from step {r.resumed_from}" if r.resumed_from else ""))
    t.append(f"\nloss {r.first_loss:.4f} at the first step, {r.last_loss:.4f} over the last ten")
    t.append(f"\nheld out ({r.held_out_prompts} prompts, {r.held_out_tokens:,} positions): "
             f"FVU {r.fvu:.4f}   L0 {r.l0:.1f}   dead latents {r.dead_latents} of {r.latents}",
             style="bold")
    return Group(header(r.model), t)


LAYER_COLS = (Col("block", 0, "right"), Col("FVU", 0, "right"), Col("L0", 0, "right"),
              Col("dead", 0, "right"), Col("loss first → last", 2, "right"),
              Col("steps", 3, "right"), Col("export FVU", 1, "right"),
              Col("export L0", 1, "right"), Col("", 2))


def transcoders_view(r: TranscodersResult, width: int | None = 120) -> RenderableType:
    """What `features train --transcoder` made: per block, how well its transcoder rebuilds the
    MLP's output on held-out text."""
    t = Text(f"{len(r.layers)} TopK {'skip ' if r.skip else ''}transcoders written to {r.out} "
             "(SAELens layout: layer_L/cfg.json + sae_weights.safetensors)", style="bold")
    if r.skip:
        t.append("\neach with a skip: ŷ = a·W_dec + b_dec + x·W_skip (W_skip started as the "
                 "least-squares map), the FVU counting the skip term", style="")
    t.append(f"\n{r.latents} latents, k = {r.k}, each reading blocks.L.hook_mlp_in (the MLP's "
             f"input) and rebuilding blocks.L.hook_mlp_out of {r.model.name}; FVU: of the "
             "MLP's output")
    how = (f"collected in one pass ({r.collect_seconds:.0f} s)" if r.collected else
           "collected by the interrupted run" if any(not x.kept for x in r.layers) else
           "every block already trained")
    t.append(f"\ntrained on {r.train_tokens:,} positions of {r.prompts} prompts (each prompt's "
             f"first position left out: the massive activation), {how}; "
             f"{r.tokens_seen:,} tokens seen per block")
    exported = r.export is not None
    rows = []
    for x in r.layers:
        state = "kept" if x.kept else (f"resumed at step {x.resumed_from}" if x.resumed_from
                                       else "")
        rows.append([str(x.layer), f"{x.fvu:.4f}", f"{x.l0:.1f}", str(x.dead_latents),
                     f"{x.first_loss:.3f} → {x.last_loss:.3f}", str(x.steps),
                     "—" if x.export_fvu is None else f"{x.export_fvu:.4f}",
                     "—" if x.export_l0 is None else f"{x.export_l0:.1f}", state])
    cols = LAYER_COLS if exported else LAYER_COLS[:6] + LAYER_COLS[8:]
    if not exported:
        rows = [row[:6] + row[8:] for row in rows]
    table = fit_table(cols, rows, width, title=f"Held out: {r.held_out_prompts} prompts, "
                      f"{r.held_out_tokens:,} positions", title_justify="left")
    s = Text(f"median FVU {r.fvu_median:.4f} over {len(r.layers)} blocks; "
             f"training {r.seconds:.0f} s", style="bold")
    if exported:
        s.append(f"\n{r.export} export in {r.export_folder}: JumpReLU with one threshold per "
                 "block (it has no TopK loader), the same weights; its FVU and L0 are the "
                 "export's own", style="")
    return Group(header(r.model), t, table, s)
