"""`fptrace diff`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fptrace.cli.io import command, load, output
from fptrace.cli.options import STATS, JsonOpt, LoadOptions, WideOpt, model_options
from fptrace.errors import BadInput


@command(order=50, docs="diff")
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
    stats: Annotated[bool, typer.Option(
        "--stats", help="FIRST and SECOND are statistics files (`fptrace stats --out`): compare "
        "them channel by channel.", rich_help_panel=STATS)] = False,
    tolerance: Annotated[Optional[float], typer.Option(
        "--tolerance", help="Largest ‖a − b‖ / ‖a‖ of the last position's stream that counts "
        "as the same (default: chosen from the two dtypes, and stated).",
        rich_help_panel=STATS)] = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Do two runs compute the same? Two traces side by side, layer by layer: two prompts, one
    prompt under two settings (--model-b, --dtype-b, --device-b, --random-weights-b), or two
    saved traces. Exit 0 within the tolerance, 1 when not, 2 on bad input. With --stats: two
    statistics files, the channels that moved most."""
    if stats:
        from fptrace.commands.diff.channels import diff_stats
        from fptrace.commands.diff.render import stats_diff_view

        if second is None:
            raise BadInput("diff --stats takes two statistics files (fptrace stats --out)")
        output(diff_stats(first, second), stats_diff_view, as_json=as_json, wide=wide)
        return
    from fptrace.commands.diff.core import diff_traces

    a, b, labels, same = _diff_inputs(first, second, opts, model_b, dtype_b, device_b,
                                      random_weights_b)
    result = diff_traces(a, b, labels=labels, tolerance=tolerance, same_input=same)
    from fptrace.commands.diff.render import diff_view

    output(result, diff_view, as_json=as_json, wide=wide)
    if not result.within:
        raise typer.Exit(1)


def _diff_inputs(first: str, second: str | None, opts: LoadOptions, model_b: str | None,
                 dtype_b: str | None, device_b: str | None, random_b: bool
                 ) -> tuple[dict, dict, tuple[str, str], bool]:
    """The two traces to compare (as JSON dicts), their labels, and whether they ran the same
    input."""
    import dataclasses

    from fptrace.commands.diff.core import read_trace
    from fptrace.models.tokenizers import check_prompt
    from fptrace.render.json import to_dict

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
        from fptrace.core.trace import run_trace

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
