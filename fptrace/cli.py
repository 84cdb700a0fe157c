"""The command line. Thin: parse options, call one core function, hand the result to a renderer.

Heavy imports (torch, transformers) happen inside the commands, so `fptrace --help` is fast.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console

from .cli_options import (JsonOpt, LoadOptions, OUTPUT, PlotOpt, STATS, WideOpt,
                          model_options)
from .errors import BadInput, FptraceError
from .models.registry import RESOLUTION_HELP

app = typer.Typer(
    name="fptrace",
    help="Trace one forward pass of a transformer language model, block by block.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

def _docs(command: str) -> str:
    """The line every command's --help ends with."""
    return f"\n\nA worked example and every option explained: docs/{command}.md."


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _stdout() -> Console:
    """Tables go to stdout; when it is not a terminal they are laid out 130 columns wide
    (COLUMNS overrides)."""
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 130
    return Console(highlight=False, width=width)


def show(view: Callable[[int | None], Any], wide: bool = False, out: Console | None = None
         ) -> Console:
    """Print a view laid out for the terminal's width: view(width) leaves out the columns
    that do not fit and says so; with --wide, view(None) has every column and the console
    grows to its natural width."""
    out = out or _stdout()
    if wide:
        from .render.fit import natural_width

        rendered = view(None)
        out.width = natural_width(rendered, out.width)
    else:
        rendered = view(out.width)
    out.print(rendered)
    return out


def fail(message: str, code: int = 2) -> None:
    """One line on stderr, then exit non-zero."""
    line = " ".join(str(message).split())
    _stderr().print(f"fptrace: error: {line}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every error into one line on stderr and a non-zero exit code: never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except FptraceError as e:
            fail(str(e), e.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except Exception as e:  # a bug of ours: still one line, the traceback on request
            from .hooks import is_oom

            if is_oom(e):
                fail("out of memory: try --dtype bfloat16, --device-map auto, a shorter prompt "
                     f"or a smaller model ({type(e).__name__}: {str(e)[:120]})", 3)
            if os.environ.get("FPTRACE_DEBUG"):
                raise
            fail(f"internal error: {type(e).__name__}: {e} (set FPTRACE_DEBUG=1 for the "
                 "traceback)", 70)

    return wrapper


def _quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def load(opts: LoadOptions) -> Any:
    """The model, or with --tp N outside torchrun: N ranks of this same command started through
    torch's launcher (after the checks that need no weights), whose exit code ends this one."""
    _quiet_libraries()
    launch_ranks(opts)
    err = _stderr()
    return opts.load(progress=lambda m: err.print(f"[dim]{m}[/dim]", soft_wrap=True))


def launch_ranks(opts: LoadOptions) -> None:
    """With --tp N outside torchrun: check the config, run this command as N ranks, and exit
    with their exit code. Commands that open files call it before opening them."""
    from .distributed import tensor_parallel as tp

    if opts.tp is not None and tp.world_size() == 1:
        from .models.registry import resolve
        from .models.sources import load_config

        tp.check(load_config(resolve(opts.model)), opts.tp, device_map=opts.device_map,
                 random_weights=opts.random_weights)
        n, argv = tp.strip_tp(sys.argv[1:])
        raise typer.Exit(tp.launch(n or opts.tp, argv))


def _write_plot(fig: Any, path: str) -> None:
    from .render.plots import save

    save(fig, path)
    _stderr().print(f"[dim]wrote {path}[/dim]", soft_wrap=True)


def emit_json(result: Any) -> None:
    from .schema import to_json

    sys.stdout.write(to_json(result) + "\n")
    sys.stdout.flush()


@app.command(epilog=_docs("run"))
@guarded
@model_options(tp=True)
def run(
    prompt: Annotated[str, typer.Argument(help="The text to trace.")],
    opts: LoadOptions,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="How many next tokens.",
                                       rich_help_panel=STATS)] = 10,
    snippet: Annotated[int, typer.Option("--snippet", min=0, help="First values of the last "
                                         "position shown per layer.",
                                         rich_help_panel=STATS)] = 4,
    all_positions: Annotated[bool, typer.Option(
        "--all-positions", help="Compute the LM head for every position, not only the last.",
        rich_help_panel=STATS)] = False,
    truncate: Annotated[bool, typer.Option(
        "--truncate", help="Keep the last tokens of a prompt longer than the context window.",
        rich_help_panel=STATS)] = False,
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Trace PROMPT through the model: tokens, shapes, per-layer residual stream, top-k."""
    from .models.tokenizers import check_prompt
    from .render.plots import check_path

    check_prompt(prompt)
    if plot is not None:
        check_path(plot)
    lm = load(opts)
    from .tracer import run_trace

    trace = run_trace(lm, prompt, top_k=top_k, snippet=snippet, all_positions=all_positions,
                      truncate=truncate, lens_grid=plot is not None)
    if plot is not None:
        from .render.plots import trace_figure

        _write_plot(trace_figure(trace)[0], plot)
    if as_json:
        emit_json(trace)
    else:
        from .render.tables import trace_view

        show(lambda width: trace_view(trace, width), wide)
    if trace.first_nonfinite:
        from .errors import NonFiniteValues

        raise NonFiniteValues(f"NaN or Inf first appeared at {trace.first_nonfinite}")


@app.command(epilog=_docs("shapes"))
@guarded
def shapes(
    prompt: Annotated[Optional[str], typer.Argument(help="Text to tokenize offline "
                                                    "(optional; else --seq-len).")] = None,
    model: Annotated[str, typer.Option("--model", "-m", help=RESOLUTION_HELP,
                                       rich_help_panel="Model")] = "gpt2",
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", "-T", help="Sequence length "
                                                   "when no prompt is given (default 8).",
                                                   rich_help_panel=STATS)] = None,
    batch: Annotated[int, typer.Option("--batch", "-B", help="Batch size.",
                                       rich_help_panel=STATS)] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="Precision of activations for the "
                                       "memory figures: float32, bfloat16 or float16.",
                                       rich_help_panel=STATS)] = "float32",
    gpu_memory: Annotated[Optional[str], typer.Option(
        "--gpu-memory", help="Plan for GPUs of this memory (e.g. 80GiB): how many the weights "
        "and the KV cache need, and the smallest valid --tp.", rich_help_panel=STATS)] = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Shape flow, parameters, memory and FLOPs of a model, without reading its weights."""
    _quiet_libraries()
    from .shapes import shape_report

    err = _stderr()
    report = shape_report(model, prompt, seq_len=seq_len, batch=batch, dtype=dtype,
                          warn=lambda m: err.print(f"warning: {m}", style="yellow"),
                          gpu_memory=gpu_memory)
    if as_json:
        emit_json(report)
        return
    from .render.shapes import shape_view

    show(lambda width: shape_view(report, width), wide)


SAMPLING = "Sampling"


@app.command(epilog=_docs("explain"))
@guarded
@model_options(placement=False, tp=True)
def explain(
    prompt: Annotated[str, typer.Argument(help="The text whose forward pass is explained.")],
    opts: LoadOptions,
    layer: Annotated[int, typer.Option("--layer", "-l", help="The block to recompute "
                                       "(negative counts from the end).",
                                       rich_help_panel=STATS)] = 0,
    head: Annotated[int, typer.Option("--head", help="The attention head whose values and "
                                      "matrix are shown.", rich_help_panel=STATS)] = 0,
    temperature: Annotated[float, typer.Option("--temperature", "-t", help="Temperature of the "
                                               "sampled strategies (0 = greedy).",
                                               rich_help_panel=SAMPLING)] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="k of top-k sampling.",
                                       rich_help_panel=SAMPLING)] = 10,
    top_p: Annotated[float, typer.Option("--top-p", "-p", help="p of nucleus (top-p) sampling, "
                                         "in (0, 1].", rich_help_panel=SAMPLING)] = 0.9,
    show_rows: Annotated[int, typer.Option("--show", help="Most probable tokens listed in the "
                                           "sampling table.", rich_help_panel=SAMPLING)] = 8,
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Recompute one block step by step from the model's weights, check it matches the model,
    then follow the last position to the logits and the sampling choices."""
    from .models.tokenizers import check_prompt
    from .render.plots import check_path
    from .sampling import check_options

    check_prompt(prompt)
    check_options(temperature, top_k, top_p)
    if plot is not None:
        check_path(plot)
    lm = load(opts)
    from .walkthrough import explain as run_explain, family_module

    family_module(lm.parts.family)
    result = run_explain(lm, prompt, layer=layer, head=head, temperature=temperature,
                         top_k=top_k, top_p=top_p, seed=opts.seed, show=show_rows,
                         all_heads=plot is not None)
    if plot is not None:
        from .render.plots import attention_figure

        _write_plot(attention_figure(result)[0], plot)
    if as_json:
        emit_json(result)
    else:
        from .render.explain import explain_view

        show(lambda width: explain_view(result, width), wide)
    _check_match(result.match, [c.name for c in result.checks if not c.ok])


def _check_match(match: bool, failed: list[str]) -> None:
    if not match:
        from .errors import Mismatch

        raise Mismatch(f"the recomputation does not match the model ({'; '.join(failed)})")


@app.command(epilog=_docs("attribute"))
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
    if plot is not None:
        from .render.plots import attribution_figure

        _write_plot(attribution_figure(result)[0], plot)
    if as_json:
        emit_json(result)
    else:
        from .render.attribution import attribution_view

        show(lambda width: attribution_view(result, width), wide)
    if not result.ok:
        from .errors import Mismatch

        raise Mismatch(f"the parts do not sum to the model's logit (difference "
                       f"{result.difference:+.2e}; {result.tolerance})")


@app.command(epilog=_docs("diff"))
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
    if as_json:
        emit_json(result)
    else:
        from .render.diff import diff_view

        show(lambda width: diff_view(result, width), wide)
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


@app.command(epilog=_docs("patch"))
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
    if plot is not None:
        from .render.plots import patch_figure

        _write_plot(patch_figure(result)[0], plot)
    if as_json:
        emit_json(result)
    else:
        from .render.patch import patch_view

        show(lambda width: patch_view(result, width), wide)


@app.command(epilog=_docs("generate"))
@guarded
@model_options(tp=True)
def generate(
    prompt: Annotated[str, typer.Argument(help="The text to continue.")],
    opts: LoadOptions,
    max_new_tokens: Annotated[int, typer.Option("-n", "--max-new-tokens", help="Tokens to "
                                                "generate (fewer if an end-of-sequence token "
                                                "comes first).", rich_help_panel=STATS)] = 12,
    temperature: Annotated[float, typer.Option("--temperature", "-t", help="0 (the default) is "
                                               "greedy; above 0 samples.",
                                               rich_help_panel=SAMPLING)] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="Sample among the k most "
                                       "probable tokens (0: off).",
                                       rich_help_panel=SAMPLING)] = 0,
    top_p: Annotated[float, typer.Option("--top-p", "-p", help="Sample from the smallest set "
                                         "of tokens whose mass reaches p (1: off).",
                                         rich_help_panel=SAMPLING)] = 1.0,
    alternatives: Annotated[int, typer.Option("--alternatives", help="Most probable tokens "
                                              "shown at each step.",
                                              rich_help_panel=STATS)] = 5,
    layers: Annotated[bool, typer.Option("--layers", help="Per-layer statistics of every step, "
                                         "as `run` shows them.", rich_help_panel=STATS)] = False,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Generate token by token: each step's input, stream and KV-cache shapes, the chosen token
    and its alternatives, and the time of the prefill and of each decode step."""
    from .generate import check_new_tokens
    from .models.tokenizers import check_prompt
    from .sampling import check_generation

    check_prompt(prompt)
    check_new_tokens(max_new_tokens)
    check_generation(temperature, top_k or None, top_p)  # --top-k 0: off
    lm = load(opts)
    from .generate import generate as run_generate

    on_step = None if as_json else _step_printer(lm, prompt, max_new_tokens, layers, wide,
                                                 sampled=temperature > 0)
    result = run_generate(lm, prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                          top_k=top_k or None, top_p=top_p, seed=opts.seed, layers=layers,
                          alternatives=alternatives, on_step=on_step)
    if as_json:
        emit_json(result)
    else:
        from .render.generate import summary

        _stdout().print(summary(result))
    bad = next((s for s in result.steps if s.first_nonfinite), None)
    if bad is not None:
        from .errors import NonFiniteValues

        raise NonFiniteValues(f"NaN or Inf appeared at step {bad.index} ({bad.first_nonfinite})")


def _step_printer(lm: Any, prompt: str, max_new_tokens: int, layers: bool, wide: bool,
                  sampled: bool) -> Callable[[Any, str], None]:
    """Print the header, the prompt's tokens and the step columns; return the callback that
    prints each step's line as soon as the step exists."""
    from .render.generate import step_columns, step_header, step_layers, step_line
    from .render.tables import header, token_table
    from .tracer import model_info

    out = _stdout()
    width = None if wide else out.width
    info = model_info(lm)
    ids = lm.encode(prompt)
    cols = step_columns(width, len(ids) + max_new_tokens, info.d_model, info.n_kv_heads,
                        info.head_dim, sampled=sampled)
    out.print(header(info))
    out.print(token_table(lm.tokens(ids), title="Prompt tokens", width=width))
    out.print(step_header(cols), soft_wrap=wide)

    def on_step(step: Any, text: str) -> None:
        out.print(step_line(step, text, cols), soft_wrap=True)
        if layers:
            show(lambda w: step_layers(step, w), wide, out)

    return on_step


@app.command(epilog=_docs("batch"))
@guarded
@model_options(tp=True)
def batch(
    inputs: Annotated[list[str], typer.Argument(
        help=".txt files (one prompt per line), .jsonl files ({\"id\": ..., \"prompt\": ...} "
        "per line, other fields carried into the record), folders of them, or - for stdin.",
        show_default=False)],
    out: Annotated[str, typer.Option("--out", "-o", help="The JSON Lines file to write (or - "
                                     "for stdout). An existing one is resumed.",
                                     rich_help_panel=OUTPUT)],
    opts: LoadOptions,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", min=1, help="Prompts per "
                                            "forward pass (left-padded, with an attention "
                                            "mask).", rich_help_panel=STATS)] = 8,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="How many next tokens.",
                                       rich_help_panel=STATS)] = 10,
    snippet: Annotated[int, typer.Option("--snippet", min=0, help="First values of the last "
                                         "position kept per layer.",
                                         rich_help_panel=STATS)] = 4,
    truncate: Annotated[bool, typer.Option(
        "--truncate", help="Keep the last tokens of prompts longer than the context window "
        "(else such a prompt is an error record).", rich_help_panel=STATS)] = False,
    force: Annotated[bool, typer.Option("--force", help="Start over: empty an existing --out "
                                        "file of fptrace records instead of resuming it.",
                                        rich_help_panel=OUTPUT)] = False,
) -> None:
    """Trace many prompts into JSON Lines, one record per prompt; rerun to resume.

    Exit code 0 when every prompt was traced, 1 when some failed (their records carry an
    `error` field), 130 when interrupted (rerun the same command to resume)."""
    from .batch import batch_file
    from .models.registry import resolve
    from .render.progress import batch_progress

    launch_ranks(opts)  # before the output file is opened and locked
    err = _stderr()
    summary = batch_file(inputs, out, load=lambda: load(opts),
                         model_name=resolve(opts.model).name,
                         random_weights=opts.random_weights, force=force,
                         batch_size=batch_size, top_k=top_k, snippet=snippet, truncate=truncate,
                         progress=lambda todo: batch_progress(err, todo))
    where = "stdout" if out == "-" else out
    rate = summary.tokens / summary.seconds if summary.seconds > 0 else 0.0
    err.print(f"traced {summary.traced}, failed {summary.failed}, skipped {summary.skipped} "
              f"(already in {where}), {summary.seconds:.1f} s ({rate:,.0f} tokens/s)"
              + (f"; {summary.nonfinite} with NaN/Inf" if summary.nonfinite else "")
              + f" → {where}", markup=False, soft_wrap=True)
    if summary.interrupted:
        fail(f"interrupted; {where} holds every record finished so far: run the same command "
             "again to resume", 130)
    if summary.failed:
        raise typer.Exit(1)


@app.command()
@guarded
def models(as_json: JsonOpt = False, wide: WideOpt = False) -> None:
    """List the built-in models and whether their weights are available here."""
    from .models.catalog import list_models

    rows = list_models()
    if as_json:
        from .results import ModelList

        emit_json(ModelList(models=tuple(rows)))
        return
    from .render.catalog import models_table

    show(lambda width: models_table(rows, width), wide)


@app.command(epilog=_docs("report"))
@guarded
@model_options(placement=False)
def report(
    prompt: Annotated[str, typer.Argument(help="The text to trace.")],
    out: Annotated[str, typer.Option("--out", "-o", help="The .html file to write.",
                                     rich_help_panel=OUTPUT)],
    opts: LoadOptions,
    layer: Annotated[int, typer.Option("--layer", "-l", help="The block the walkthrough "
                                       "recomputes.", rich_help_panel=STATS)] = 0,
    head: Annotated[int, typer.Option("--head", help="The head whose matrix the walkthrough "
                                      "shows.", rich_help_panel=STATS)] = 0,
    noise: Annotated[Optional[str], typer.Option(
        "--noise", help="Also a causal-tracing section: noise on this subject's embeddings "
        "(as `fptrace patch --noise`).", rich_help_panel=STATS)] = None,
) -> None:
    """One self-contained HTML file: the run tables, the figures, the explain walkthrough of
    one layer, the attribution of the top-1 (and with --noise, causal tracing) and the JSON
    trace. It makes no network request and opens offline."""
    from .models.tokenizers import check_prompt
    from .report import build_html, check_out, write_report

    check_prompt(prompt)
    check_out(out)
    lm = load(opts)
    from .tracer import run_trace
    from .walkthrough import explain as run_explain, family_module

    family_module(lm.parts.family)
    from .attribution import attribute as run_attribute

    trace = run_trace(lm, prompt, lens_grid=True)
    explanation = run_explain(lm, prompt, layer=layer, head=head, all_heads=True)
    attribution = run_attribute(lm, prompt)
    patching = None
    if noise is not None:
        from .patching import patch as run_patch

        patching = run_patch(lm, prompt, noise=noise, seed=opts.seed)
    write_report(out, build_html(trace, explanation, attribution, patching))
    _stderr().print(f"wrote {out}", markup=False, soft_wrap=True)
    _check_match(explanation.match, [c.name for c in explanation.checks if not c.ok])


@app.command()
@guarded
def schema(
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the field-by-field "
                                           "documentation (docs/schema.md) instead.",
                                           rich_help_panel=OUTPUT)] = False,
) -> None:
    """Print the JSON Schema of every JSON output (run, shapes, explain, models, batch lines)."""
    from .schema import json_schema, markdown as schema_markdown

    if markdown:
        sys.stdout.write(schema_markdown())
    else:
        import json

        sys.stdout.write(json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> None:
    """The console entry point. Usage errors (a bad option value, a missing argument, an
    unknown command) get the same single line as every other error, not a multi-line box."""
    # click's UsageError, whether typer vendors click (0.29+) or uses it (older releases)
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    from .distributed.tensor_parallel import rank, world_size

    if world_size() > 1 and rank() != 0:  # under torchrun only rank 0 prints and writes
        sys.stdout = sys.stderr = open(os.devnull, "w", encoding="utf-8")
    try:
        rc = app(args=argv, prog_name="fptrace", standalone_mode=False)
    except usage_error as e:
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `fptrace`: the help
            sys.stdout.write(ctx.get_help() + "\n" if ctx else "")
            sys.exit(0)
        where = f" (see {ctx.command_path} --help)" if ctx else ""
        _stderr().print(f"fptrace: error: {' '.join(e.format_message().split())}{where}",
                        markup=False, soft_wrap=True)
        rc = 2
    except typer.Abort:
        _stderr().print("fptrace: error: interrupted", markup=False)
        rc = 130
    sys.exit(rc if isinstance(rc, int) else 0)

if __name__ == "__main__":
    main()
