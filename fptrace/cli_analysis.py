"""The commands that answer "why": attribute (which heads and MLPs), diff (do two runs compute
the same), patch (where the prediction is carried). Registered on the app of cli_common."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .cli_common import app, docs_epilog, guarded, load, output
from .cli_options import JsonOpt, LoadOptions, PlotOpt, STATS, WideOpt, model_options
from .errors import BadInput

@app.command(epilog=docs_epilog("attribute"))
@guarded
@model_options()
def attribute(
    prompt: Annotated[str, typer.Argument(help="The text whose next-token logit is attributed.")],
    opts: LoadOptions,
    target: Annotated[Optional[str], typer.Option(
        "--target", help="The token whose logit is attributed (one token, e.g. ' Paris', or "
        "#ID); default: the model's top-1.", rich_help_panel=STATS)] = None,
    versus: Annotated[Optional[str], typer.Option(
        "--versus", help="Attribute the logit difference target − this token instead.",
        rich_help_panel=STATS)] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="How many of the largest "
                                     "contributions are listed.", rich_help_panel=STATS)] = 12,
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Which heads and MLPs made this answer: direct logit attribution that sums exactly to the
    model's own logit (exit 5 when it does not)."""
    from .models.tokenizers import check_prompt
    from .render.plots import check_path

    check_prompt(prompt)
    if plot is not None:
        check_path(plot)
    lm = load(opts)
    from .attribution import attribute as run_attribute

    result = run_attribute(lm, prompt, target=target, versus=versus, top=top)
    from .render.attribution import attribution_view
    from .render.plots import attribution_figure

    output(result, attribution_view, as_json=as_json, wide=wide, plot=plot,
           figure=attribution_figure)
    if not result.ok:
        from .errors import Mismatch

        raise Mismatch(f"the parts do not sum to the model's logit (difference "
                       f"{result.difference:+.2e}; {result.tolerance})")


@app.command(epilog=docs_epilog("diff"))
@guarded
@model_options()
def diff(
    first: Annotated[str, typer.Argument(help="A prompt, or a trace saved by `run --json`.")],
    second: Annotated[Optional[str], typer.Argument(
        help="A second prompt (same model), or a second trace file.")] = None,
    opts: LoadOptions = LoadOptions(),
    model_b: Annotated[Optional[str], typer.Option("--model-b", help="Run the prompt on this "
                                                   "model too.", rich_help_panel="Model")] = None,
    dtype_b: Annotated[Optional[str], typer.Option("--dtype-b", help="... in this dtype.",
                                                   rich_help_panel="Model")] = None,
    device_b: Annotated[Optional[str], typer.Option("--device-b", help="... on this device.",
                                                    rich_help_panel="Model")] = None,
    random_weights_b: Annotated[bool, typer.Option(
        "--random-weights-b", help="... with seeded random weights.",
        rich_help_panel="Model")] = False,
    tolerance: Annotated[Optional[float], typer.Option(
        "--tolerance", help="Largest ‖a − b‖ / ‖a‖ of the last position's stream that counts "
        "as the same (default: chosen from the two dtypes, and stated).",
        rich_help_panel=STATS)] = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Do two runs compute the same? Two traces side by side, layer by layer: two prompts, one
    prompt under two settings (--model-b, --dtype-b, --device-b, --random-weights-b), or two
    saved traces. Exit 0 within the tolerance, 1 when not, 2 on bad input."""
    from .tracediff import diff_traces

    a, b, labels, same = _diff_inputs(first, second, opts, model_b, dtype_b, device_b,
                                      random_weights_b)
    result = diff_traces(a, b, labels=labels, tolerance=tolerance, same_input=same)
    from .render.diff import diff_view

    output(result, diff_view, as_json=as_json, wide=wide)
    if not result.within:
        raise typer.Exit(1)


def _diff_inputs(first: str, second: str | None, opts: LoadOptions, model_b: str | None,
                 dtype_b: str | None, device_b: str | None, random_b: bool
                 ) -> tuple[dict, dict, tuple[str, str], bool]:
    """The two traces to compare (as JSON dicts), their labels, and whether they ran the same
    input."""
    import dataclasses

    from .tracediff import read_trace
    from .models.tokenizers import check_prompt
    from .schema import to_dict

    settings_b = {k: v for k, v in (("model", model_b), ("dtype", dtype_b),
                                    ("device", device_b)) if v is not None}
    if random_b:
        settings_b["random_weights"] = True
    files = [p for p in (first, second) if p is not None and p.endswith((".json", ".jsonl"))]
    if files:
        if len(files) != 2 or settings_b:
            raise BadInput("diff takes two trace files, or prompts (not both; the -b options "
                           "go with one prompt)")
        return read_trace(first), read_trace(second), (first, second), False

    def traced(lm_opts: LoadOptions, prompt: str) -> dict:
        from .tracer import run_trace

        lm = load(lm_opts)
        return to_dict(run_trace(lm, prompt, snippet=int(lm.config.hidden_size)))

    check_prompt(first)
    if second is not None:
        if settings_b:
            raise BadInput("give either a second prompt or --model-b/--dtype-b/--device-b/"
                           "--random-weights-b, not both")
        check_prompt(second)
        return traced(opts, first), traced(opts, second), ("a", "b"), False
    if not settings_b:
        raise BadInput("diff needs something to compare: a second prompt, two trace files, or "
                       "a -b option (--model-b, --dtype-b, --device-b, --random-weights-b)")
    opts_b = dataclasses.replace(opts, **settings_b)
    return traced(opts, first), traced(opts_b, first), ("a", "b"), True


@app.command(epilog=docs_epilog("patch"))
@guarded
@model_options()
def patch(
    prompt: Annotated[str, typer.Argument(help="The clean prompt.")],
    opts: LoadOptions,
    noise: Annotated[Optional[str], typer.Option(
        "--noise", help="Corrupt by adding Gaussian noise to the embeddings of this subject's "
        "tokens (e.g. ' France').", rich_help_panel=STATS)] = None,
    corrupt: Annotated[Optional[str], typer.Option(
        "--corrupt", help="Corrupt with this prompt instead (same number of tokens).",
        rich_help_panel=STATS)] = None,
    what: Annotated[str, typer.Option("--what", help="Restore resid (the block's output), "
                                      "attn or mlp (what it added).",
                                      rich_help_panel=STATS)] = "resid",
    window: Annotated[int, typer.Option("--window", help="With attn/mlp: layers restored "
                                        "around each row's layer.", rich_help_panel=STATS)] = 1,
    target: Annotated[Optional[str], typer.Option(
        "--target", help="The token whose probability is measured (default: the clean top-1).",
        rich_help_panel=STATS)] = None,
    noise_scale: Annotated[float, typer.Option(
        "--noise-scale", help="Noise σ in units of the embedding's standard deviation.",
        rich_help_panel=STATS)] = 3.0,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Patched runs per "
                                            "forward pass.", rich_help_panel=STATS)] = 32,
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Where is the prediction carried? Causal tracing: corrupt the prompt, then restore one
    state (layer, position) at a time from the clean run and measure the target's probability."""
    from .models.tokenizers import check_prompt
    from .render.plots import check_path

    check_prompt(prompt)
    if plot is not None:
        check_path(plot)
    lm = load(opts)
    from .patching import patch as run_patch

    result = run_patch(lm, prompt, noise=noise, corrupt=corrupt, what=what, window=window,
                       target=target, noise_scale=noise_scale, seed=opts.seed,
                       batch_size=batch_size)
    from .render.patch import patch_view
    from .render.plots import patch_figure

    output(result, patch_view, as_json=as_json, wide=wide, plot=plot, figure=patch_figure)
