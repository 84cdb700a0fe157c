"""`fptrace diff`."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, load, output, prompt_command
from fptrace.cli.options import STATS, ChatOptions, LoadOptions, Outputs, engine_options
from fptrace.cli.page import write_page
from fptrace.commands.diff.modes import MODES
from fptrace.engines import EngineChoice, engines
from fptrace.errors import BadInput


@prompt_command(order=50, group=Group.compare, docs="diff",
                examples=('fptrace diff "The capital of France is" --dtype-b float16',
                          'fptrace diff "The capital of France is" --quantize-b int8 --deep'),
                quantize=True, plot=False, modes=MODES)
@engine_options(side_b=True)
def diff(
    first: Annotated[str | None, typer.Argument(
        help="A prompt, or a trace saved by `run --json` (or --messages FILE).")] = None,
    second: Annotated[str | None, typer.Argument(
        help="A second prompt (same model), or a second trace file.")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    model_b: Annotated[str | None, typer.Option("--model-b", help="Run the prompt on this "
                                                   "model too.", rich_help_panel="Model")] = None,
    dtype_b: Annotated[str | None, typer.Option("--dtype-b", help="... in this dtype.",
                                                   rich_help_panel="Model")] = None,
    device_b: Annotated[str | None, typer.Option("--device-b", help="... on this device.",
                                                    rich_help_panel="Model")] = None,
    random_weights_b: Annotated[bool, typer.Option(
        "--random-weights-b", help="... with seeded random weights.",
        rich_help_panel="Model")] = False,
    stats: Annotated[bool, typer.Option(
        "--stats", help="FIRST and SECOND are statistics files (`fptrace stats --out`): compare "
        "them channel by channel.", rich_help_panel=STATS)] = False,
    tolerance: Annotated[float | None, typer.Option(
        "--tolerance", help="Largest ‖a − b‖ / ‖a‖ of the last position's stream (with --deep, "
        "also of each point) that counts as the same (default: chosen from the two dtypes, and "
        "stated).",
        rich_help_panel=STATS)] = None,
    quantize_b: Annotated[str | None, typer.Option(
        "--quantize-b", help="... with its linear weights quantized on load: int8 or int4 "
        "(torchao weight-only).", rich_help_panel="Model")] = None,
    deep: Annotated[bool, typer.Option(
        "--deep", help="Also compare, inside every block, the points explain names (norms, q, "
        "k, v after RoPE, attention weights, z, the MLP's gate, up, activation, outputs) and "
        "name the first operation where the runs part.", rich_help_panel=STATS)] = False,
    deep_layers: Annotated[str | None, typer.Option(
        "--deep-layers", help="With --deep: only these blocks, e.g. 3-5, 0,4,8-9 or -1 (the "
        "last).",
        rich_help_panel=STATS)] = None,
    engine: EngineChoice = EngineChoice(),
    emulate: Annotated[str | None, typer.Option(
        "--emulate", help=" ".join(e.emulation.help for e in engines() if e.emulation) +
        " The table then gives each block's error with none, then each step added.",
        rich_help_panel=STATS)] = None,
    outputs: Outputs = Outputs(),
) -> None:
    """Do two runs compute the same? Layer by layer, to the op.

    Do two runs compute the same? Two traces side by side, layer by layer, in one of the four
    modes below. Exit 0 within the tolerance, 1 when not, 2 on bad input."""
    from fptrace.cli.modes import chosen

    side_b = engine.engine
    chosen(MODES, {  # the comparison, and no option of another (commands/diff/modes.py)
        "--stats": stats, "--engine-b": not side_b.default, "--deep": deep,
        "--deep-layers": deep_layers is not None, "--model-b": model_b is not None,
        "--dtype-b": dtype_b is not None, "--device-b": device_b is not None,
        "--quantize-b": quantize_b is not None, "--random-weights-b": random_weights_b,
        "--tolerance": tolerance is not None, "--emulate": emulate is not None,
        "--html": outputs.html is not None})
    if tolerance is not None:  # before anything is read or loaded
        from fptrace.numbers import check_finite

        check_finite(tolerance, "--tolerance", low=0.0)
    flag = side_b.refused(engine.given)
    if flag is not None:
        raise BadInput(f"{flag} is not available with --engine-b {side_b.name}")
    if outputs.html is not None:
        from fptrace.cli.page import check_page

        check_page(outputs.html, force=outputs.force)
    steps: tuple[str, ...] = ()
    if emulate is not None:
        if side_b.emulation is None:
            raise BadInput(f"--emulate: the {side_b.name} engine has no emulation in "
                           "transformers")
        steps = side_b.emulation.parse(emulate)
    if stats:  # diff --stats (its mode checked above)
        from fptrace.commands.diff.channels import diff_stats
        from fptrace.commands.diff.render import stats_diff_view

        if first is None or second is None:
            raise BadInput("diff --stats takes two statistics files (fptrace stats --out)")
        output(diff_stats(first, second), stats_diff_view, outputs)
        return
    from fptrace.addresses import parse_selection
    from fptrace.commands.diff.core import diff_traces
    from fptrace.commands.diff.render import diff_view

    layers = None if deep_layers is None else parse_selection(deep_layers, "--deep-layers")
    if not side_b.default:
        from fptrace.commands.diff.engine import from_cli

        result = from_cli(side_b, first, second, opts, chat, _settings_b(
            model_b, dtype_b, device_b, random_weights_b, quantize_b),
            settings=engine.settings, deep=deep or deep_layers is not None, layers=layers,
            tolerance=tolerance, emulate=steps)
    elif deep or deep_layers is not None:
        result = _deep(first, second, opts, chat, _settings_b(model_b, dtype_b, device_b,
                                                              random_weights_b, quantize_b),
                       layers, tolerance, outputs.html)
    else:
        a, b, labels, same = _diff_inputs(first, second, opts, chat, model_b, dtype_b, device_b,
                                          random_weights_b, quantize_b)
        result = diff_traces(a, b, labels=labels, tolerance=tolerance, same_input=same)
    output(result, diff_view, outputs)
    if not result.within:
        raise typer.Exit(1)


def _settings_b(model_b: str | None, dtype_b: str | None, device_b: str | None,
                random_b: bool, quantize_b: str | None) -> dict:
    """The -b options: what side b changes of the loading options."""
    settings_b = {k: v for k, v in (("model", model_b), ("dtype", dtype_b),
                                    ("device", device_b), ("quantize", quantize_b))
                  if v is not None}
    if random_b:
        settings_b["random_weights"] = True
    return settings_b


def _deep(first: str | None, second: str | None, opts: LoadOptions, chat: ChatOptions,
          settings_b: dict, deep_layers: object, tolerance: float | None,
          html: str | None = None) -> object:
    """--deep: one prompt on two loaded models (a and the -b options); with --html, its page
    (the trace of side a beside the comparison)."""
    import dataclasses

    from fptrace.cli.io import prompt_of
    from fptrace.commands.diff.deep import deep_diff

    if second is not None or (first or "").endswith((".json", ".jsonl")) or not settings_b:
        raise BadInput("--deep compares one prompt on two models or settings: PROMPT and a -b "
                       "option (--model-b, --dtype-b, --device-b, --quantize-b, "
                       "--random-weights-b); saved traces hold no points inside the blocks")
    prompt = prompt_of(first, chat)
    lm_a = load(opts)
    lm_b = load(dataclasses.replace(opts, **settings_b))
    result = deep_diff(lm_a, lm_b, prompt, layers=deep_layers, tolerance=tolerance)
    write_page(html, lm_a, prompt, "diff", result)
    return result


def _diff_inputs(first: str | None, second: str | None, opts: LoadOptions, chat: ChatOptions,
                 model_b: str | None, dtype_b: str | None, device_b: str | None, random_b: bool,
                 quantize_b: str | None = None) -> tuple[dict, dict, tuple[str, str], bool]:
    """The two traces to compare (as JSON dicts), their labels, and whether they ran the same
    input."""
    import dataclasses
    import os

    from fptrace.cli.io import prompt_of
    from fptrace.commands.diff.core import read_trace
    from fptrace.render.json import to_dict

    settings_b = _settings_b(model_b, dtype_b, device_b, random_b, quantize_b)
    files = [p for p in (first, second) if p is not None and p.endswith((".json", ".jsonl"))]
    for path in files:
        if not os.path.exists(path):
            raise BadInput(f"no such file: {path}")
    if files:
        if len(files) != 2 or settings_b:
            raise BadInput("diff takes two trace files, or prompts (not both; the -b options "
                           "go with one prompt)")
        return read_trace(first), read_trace(second), (first, second), False

    def traced(lm_opts: LoadOptions, prompt: object) -> dict:
        from fptrace.core.trace import run_trace

        lm = load(lm_opts)
        return to_dict(run_trace(lm, prompt, snippet=int(lm.config.hidden_size)))

    a = prompt_of(first, chat)
    if second is not None:
        if settings_b:
            raise BadInput("give either a second prompt or --model-b/--dtype-b/--device-b/"
                           "--quantize-b/--random-weights-b, not both")
        b = prompt_of(second, chat)
        return traced(opts, a), traced(opts, b), ("a", "b"), False
    if not settings_b:
        raise BadInput("diff needs something to compare: a second prompt, two trace files, or "
                       "a -b option (--model-b, --dtype-b, --device-b, --quantize-b, "
                       "--random-weights-b)")
    opts_b = dataclasses.replace(opts, **settings_b)
    return traced(opts, a), traced(opts_b, a), ("a", "b"), True
