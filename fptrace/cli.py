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

from .errors import FptraceError
from .models.registry import DEFAULT_MODEL, RESOLUTION_HELP

app = typer.Typer(
    name="fptrace",
    help="Trace one forward pass of a transformer language model, block by block.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

MODEL = "Model"
OUTPUT = "Output"
STATS = "Statistics"

ModelOpt = Annotated[str, typer.Option("--model", "-m", help=RESOLUTION_HELP,
                                       rich_help_panel=MODEL)]
RandomOpt = Annotated[bool, typer.Option(
    "--random-weights", help="Build the model's config with seeded random weights (no weights "
    "needed; predictions then mean nothing).", rich_help_panel=MODEL)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for --random-weights.",
                                      rich_help_panel=MODEL)]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda, cuda:N or mps.",
                                        rich_help_panel=MODEL)]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="auto, float32, bfloat16 or float16 "
                                       "(auto: float32 on CPU).", rich_help_panel=MODEL)]
PickleOpt = Annotated[bool, typer.Option(
    "--allow-pickle", help="Allow pickle (.bin/.pt) weights, which can run code: only for "
    "sources you trust.", rich_help_panel=MODEL)]
RemoteOpt = Annotated[bool, typer.Option(
    "--trust-remote-code", help="Allow a model folder's own Python code to run.",
    rich_help_panel=MODEL)]
DeviceMapOpt = Annotated[Optional[str], typer.Option(
    "--device-map", help="auto: load through Accelerate, spreading blocks over the GPUs, then "
    "CPU RAM, then disk (big models).", rich_help_panel=MODEL)]
MaxMemoryOpt = Annotated[Optional[str], typer.Option(
    "--max-memory", help="With --device-map: memory per device, e.g. 0=70GiB,1=70GiB,cpu=200GiB.",
    rich_help_panel=MODEL)]
OffloadOpt = Annotated[Optional[str], typer.Option(
    "--offload-folder", help="With --device-map: where weights that fit nowhere else go "
    "(default: a temporary folder).", rich_help_panel=MODEL)]
PlotOpt = Annotated[Optional[str], typer.Option(
    "--plot", help="Also write a figure (.png, .svg, .pdf, .jpg or .webp; no display needed).",
    rich_help_panel="Output")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Write the result as one JSON object on "
                                       "stdout.", rich_help_panel=OUTPUT)]


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _stdout() -> Console:
    """Tables go to stdout; when it is not a terminal they are laid out 130 columns wide
    (COLUMNS overrides)."""
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 130
    return Console(highlight=False, width=width)


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


def load(model: str, random_weights: bool, seed: int, device: str, dtype: str,
         allow_pickle: bool, trust_remote_code: bool, device_map: str | None = None,
         max_memory: str | None = None, offload_folder: str | None = None) -> Any:
    _quiet_libraries()
    from .models.loading import load_model

    err = _stderr()
    return load_model(model, random_weights=random_weights, seed=seed, device=device,
                      dtype=dtype, allow_pickle=allow_pickle,
                      trust_remote_code=trust_remote_code, device_map=device_map,
                      max_memory=max_memory, offload_folder=offload_folder,
                      progress=lambda m: err.print(f"[dim]{m}[/dim]", soft_wrap=True))


def _write_plot(fig: Any, path: str) -> None:
    from .render.plots import save

    save(fig, path)
    _stderr().print(f"[dim]wrote {path}[/dim]", soft_wrap=True)


def emit_json(result: Any) -> None:
    from .schema import to_json

    sys.stdout.write(to_json(result) + "\n")
    sys.stdout.flush()


@app.command()
@guarded
def run(
    prompt: Annotated[str, typer.Argument(help="The text to trace.")],
    model: ModelOpt = DEFAULT_MODEL,
    random_weights: RandomOpt = False,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    offload_folder: OffloadOpt = None,
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
) -> None:
    """Trace PROMPT through the model: tokens, shapes, per-layer residual stream, top-k."""
    from .models.tokenizers import check_prompt

    check_prompt(prompt)
    if plot is not None:
        from .render.plots import check_path

        check_path(plot)
    lm = load(model, random_weights, seed, device, dtype, allow_pickle, trust_remote_code,
              device_map, max_memory, offload_folder)
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

        out = _stdout()
        out.print(trace_view(trace, out.width))
    if trace.first_nonfinite:
        fail(f"NaN or Inf first appeared at {trace.first_nonfinite}", 4)


@app.command()
@guarded
def shapes(
    prompt: Annotated[Optional[str], typer.Argument(help="Text to tokenize offline "
                                                    "(optional; else --seq-len).")] = None,
    model: ModelOpt = "gpt2",
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", "-T", help="Sequence length "
                                                   "when no prompt is given (default 8).",
                                                   rich_help_panel=STATS)] = None,
    batch: Annotated[int, typer.Option("--batch", "-B", help="Batch size.",
                                       rich_help_panel=STATS)] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="Precision of activations for the "
                                       "memory figures: float32, bfloat16 or float16.",
                                       rich_help_panel=STATS)] = "float32",
    as_json: JsonOpt = False,
) -> None:
    """Shape flow, parameters, memory and FLOPs of a model, without reading its weights."""
    _quiet_libraries()
    from .shapes import shape_report

    err = _stderr()
    report = shape_report(model, prompt, seq_len=seq_len, batch=batch, dtype=dtype,
                          warn=lambda m: err.print(f"warning: {m}", style="yellow"))
    if as_json:
        emit_json(report)
        return
    from .render.shapes import shape_view

    out = _stdout()
    out.print(shape_view(report))


SAMPLING = "Sampling"


@app.command()
@guarded
def explain(
    prompt: Annotated[str, typer.Argument(help="The text whose forward pass is explained.")],
    model: ModelOpt = DEFAULT_MODEL,
    random_weights: RandomOpt = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed for --random-weights and for the "
                                      "sampled picks.", rich_help_panel=MODEL)] = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
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
    show: Annotated[int, typer.Option("--show", help="Most probable tokens listed in the "
                                      "sampling table.", rich_help_panel=SAMPLING)] = 8,
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Recompute one block step by step from the model's weights, check it matches the model,
    then follow the last position to the logits and the sampling choices."""
    from .models.tokenizers import check_prompt
    from .sampling import check_options

    check_prompt(prompt)
    check_options(temperature, top_k, top_p)
    if plot is not None:
        from .render.plots import check_path

        check_path(plot)
    lm = load(model, random_weights, seed, device, dtype, allow_pickle, trust_remote_code)
    from .walkthrough import explain as run_explain, family_module

    family_module(lm.parts.family)
    result = run_explain(lm, prompt, layer=layer, head=head, temperature=temperature,
                         top_k=top_k, top_p=top_p, seed=seed, show=show,
                         all_heads=plot is not None)
    if plot is not None:
        from .render.plots import attention_figure

        _write_plot(attention_figure(result)[0], plot)
    if as_json:
        emit_json(result)
    else:
        from .render.explain import explain_view

        out = _stdout()
        out.print(explain_view(result))
    if not result.match:
        from .errors import Mismatch

        failed = "; ".join(c.name for c in result.checks if not c.ok)
        raise Mismatch(f"the recomputation does not match the model ({failed})")


@app.command()
@guarded
def generate(
    prompt: Annotated[str, typer.Argument(help="The text to continue.")],
    max_new_tokens: Annotated[int, typer.Option("-n", "--max-new-tokens", help="Tokens to "
                                                "generate (fewer if an end-of-sequence token "
                                                "comes first).", rich_help_panel=STATS)] = 12,
    model: ModelOpt = DEFAULT_MODEL,
    random_weights: RandomOpt = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed for --random-weights and for the "
                                      "sampled tokens.", rich_help_panel=MODEL)] = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    offload_folder: OffloadOpt = None,
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
) -> None:
    """Generate token by token: each step's input, stream and KV-cache shapes, the chosen token
    and its alternatives, and the time of the prefill and of each decode step."""
    from .generate import check_new_tokens
    from .models.tokenizers import check_prompt
    from .sampling import check_generation

    check_prompt(prompt)
    check_new_tokens(max_new_tokens)
    check_generation(temperature, top_k or None, top_p)  # --top-k 0: off
    lm = load(model, random_weights, seed, device, dtype, allow_pickle, trust_remote_code,
              device_map, max_memory, offload_folder)
    from .generate import generate as run_generate

    out = _stdout()

    def on_step(step: Any, text: str) -> None:  # each step's line as soon as it exists
        from .render.generate import step_layers, step_line

        out.print(step_line(step, text, out.width), soft_wrap=True)
        if layers:
            out.print(step_layers(step, out.width))

    if not as_json:
        from .render.generate import step_header
        from .render.tables import header, token_table
        from .tracer import _prepare, model_info, tokens_of

        out.print(header(model_info(lm)))
        out.print(token_table(tokens_of(lm, _prepare(lm, prompt, truncate=False)[0]),
                              title="Prompt tokens"))
        out.print(step_header())

    result = run_generate(lm, prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                          top_k=top_k or None, top_p=top_p, seed=seed, layers=layers,
                          alternatives=alternatives, on_step=None if as_json else on_step)
    if as_json:
        emit_json(result)
    else:
        from .render.generate import summary

        out.print(summary(result))
    bad = next((s for s in result.steps if s.first_nonfinite), None)
    if bad is not None:
        fail(f"NaN or Inf appeared at step {bad.index} ({bad.first_nonfinite})", 4)


@app.command()
@guarded
def batch(
    inputs: Annotated[list[str], typer.Argument(
        help=".txt files (one prompt per line), .jsonl files ({\"id\": ..., \"prompt\": ...} "
        "per line, other fields carried into the record), folders of them, or - for stdin.",
        show_default=False)],
    out: Annotated[str, typer.Option("--out", "-o", help="The JSON Lines file to write (or - "
                                     "for stdout). An existing one is resumed.",
                                     rich_help_panel=OUTPUT)],
    model: ModelOpt = DEFAULT_MODEL,
    random_weights: RandomOpt = False,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    offload_folder: OffloadOpt = None,
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
    import signal

    from .batch import OutFile, read_inputs

    items = read_inputs(inputs, exclude=out)
    err = _stderr()
    to_stdout = out == "-"
    sink = None if to_stdout else OutFile(out, force=force).open()
    try:
        if sink is not None:
            from .models.registry import resolve

            sink.check_compatible(resolve(model).name, top_k, snippet,  # before any loading
                                  random_weights)
        if sink is not None and all(it.id in sink.done for it in items):
            from .batch import Summary

            summary = Summary(total=len(items), skipped=len(items))  # nothing to load or run
            lm = None
        else:
            lm = load(model, random_weights, seed, device, dtype, allow_pickle,
                      trust_remote_code, device_map, max_memory, offload_folder)

        def write(lines: list[str]) -> None:
            if sink is not None:
                sink.append(lines)
            elif lines:
                sys.stdout.write("".join(line + "\n" for line in lines))
                sys.stdout.flush()

        def terminate(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        if lm is not None:
            old = signal.signal(signal.SIGTERM, terminate)
            try:
                summary = _batch_with_progress(err, lm, items, write, sink, batch_size, top_k,
                                               snippet, truncate)
            finally:
                signal.signal(signal.SIGTERM, old)
    finally:
        if sink is not None:
            sink.close()
    where = "stdout" if to_stdout else out
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


def _batch_with_progress(err: Console, lm: Any, items: list, write: Callable, sink: Any,
                         batch_size: int, top_k: int, snippet: int, truncate: bool) -> Any:
    import time

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from .batch import run_batch

    done = sink.done if sink is not None else set()
    todo = sum(1 for it in items if it.id not in done)
    columns = (TextColumn("tracing"), BarColumn(), MofNCompleteColumn(),
               TextColumn("prompts  {task.fields[tps]:>7,.0f} tokens/s"), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task("batch", total=todo, tps=0.0)
        tokens = 0
        t0 = time.perf_counter()

        def progress(n_prompts: int, n_tokens: int) -> None:
            nonlocal tokens
            tokens += n_tokens
            bar.update(task, advance=n_prompts,
                       tps=tokens / max(time.perf_counter() - t0, 1e-9))

        return run_batch(lm, items, write, done, batch_size=batch_size, top_k=top_k,
                         snippet=snippet, truncate=truncate, progress=progress)


@app.command()
@guarded
def models(as_json: JsonOpt = False) -> None:
    """List the built-in models and whether their weights are available here."""
    from .models.catalog import list_models

    rows = list_models()
    if as_json:
        from .results import ModelList

        emit_json(ModelList(models=tuple(rows)))
        return
    from .render.catalog import models_table

    _stdout().print(models_table(rows))


@app.command()
@guarded
def report(
    prompt: Annotated[str, typer.Argument(help="The text to trace.")],
    out: Annotated[str, typer.Option("--out", "-o", help="The .html file to write.",
                                     rich_help_panel=OUTPUT)],
    model: ModelOpt = DEFAULT_MODEL,
    random_weights: RandomOpt = False,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    layer: Annotated[int, typer.Option("--layer", "-l", help="The block the walkthrough "
                                       "recomputes.", rich_help_panel=STATS)] = 0,
    head: Annotated[int, typer.Option("--head", help="The head whose matrix the walkthrough "
                                      "shows.", rich_help_panel=STATS)] = 0,
) -> None:
    """One self-contained HTML file: the run tables, the figures, the explain walkthrough of
    one layer and the JSON trace. It makes no network request and opens offline."""
    from .models.tokenizers import check_prompt
    from .report import build_html, check_out, write_report

    check_prompt(prompt)
    check_out(out)
    lm = load(model, random_weights, seed, device, dtype, allow_pickle, trust_remote_code)
    from .tracer import run_trace
    from .walkthrough import explain as run_explain, family_module

    family_module(lm.parts.family)
    trace = run_trace(lm, prompt, lens_grid=True)
    explanation = run_explain(lm, prompt, layer=layer, head=head, all_heads=True)
    write_report(out, build_html(trace, explanation))
    _stderr().print(f"wrote {out}", markup=False, soft_wrap=True)
    if not explanation.match:
        from .errors import Mismatch

        raise Mismatch("the recomputation in the report does not match the model")


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
