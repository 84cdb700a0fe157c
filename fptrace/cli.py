"""The command line. Thin: parse options, call one core function, hand the result to a renderer.

Heavy imports (torch, transformers) happen inside the commands, so `fptrace --help` is fast.
The shared machinery is in cli_common.py, the loading options in cli_options.py, and the
attribute/diff/patch commands in cli_analysis.py.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any, Callable, Optional

import typer

from .cli_common import (app, check_match, docs_epilog, emit_json, fail, guarded, launch_ranks,
                         load, output, quiet_libraries, show, stderr_console, stdout_console)
from .cli_options import (JsonOpt, LoadOptions, OUTPUT, PlotOpt, STATS, WideOpt,
                          model_options)
from .errors import BadInput
from .models.registry import RESOLUTION_HELP

@app.command(epilog=docs_epilog("run"))
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
    from .render.plots import trace_figure
    from .render.tables import trace_view

    output(trace, trace_view, as_json=as_json, wide=wide, plot=plot, figure=trace_figure)
    if trace.first_nonfinite:
        from .errors import NonFiniteValues

        raise NonFiniteValues(f"NaN or Inf first appeared at {trace.first_nonfinite}")


@app.command(epilog=docs_epilog("shapes"))
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
    quiet_libraries()
    from .shapes import shape_report

    err = stderr_console()
    report = shape_report(model, prompt, seq_len=seq_len, batch=batch, dtype=dtype,
                          warn=lambda m: err.print(f"warning: {m}", style="yellow"),
                          gpu_memory=gpu_memory)
    if as_json:
        emit_json(report)
        return
    from .render.shapes import shape_view

    show(lambda width: shape_view(report, width), wide)


SAMPLING = "Sampling"


@app.command(epilog=docs_epilog("explain"))
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
    from .render.explain import explain_view
    from .render.plots import attention_figure

    output(result, explain_view, as_json=as_json, wide=wide, plot=plot, figure=attention_figure)
    check_match(result.match, [c.name for c in result.checks if not c.ok])


@app.command(epilog=docs_epilog("generate"))
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

        stdout_console().print(summary(result))
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

    out = stdout_console()
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


@app.command(epilog=docs_epilog("batch"))
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
    ray: Annotated[Optional[str], typer.Option(
        "--ray", help="Trace on a Ray cluster: auto (the cluster `ray start` or RAY_ADDRESS "
        "names, else a local one) or its address.", rich_help_panel="Ray")] = None,
    workers: Annotated[int, typer.Option("--workers", help="With --ray: actors, each loading "
                                         "the model once.", rich_help_panel="Ray")] = 1,
    gpus_per_worker: Annotated[Optional[float], typer.Option(
        "--gpus-per-worker", help="With --ray: GPUs per actor (default 1 when the cluster has "
        "GPUs, else 0).", rich_help_panel="Ray")] = None,
) -> None:
    """Trace many prompts into JSON Lines, one record per prompt; rerun to resume.

    Exit code 0 when every prompt was traced, 1 when some failed (their records carry an
    `error` field), 130 when interrupted (rerun the same command to resume)."""
    from .batch import batch_file
    from .models.registry import resolve
    from .render.progress import batch_progress

    launch_ranks(opts)  # before the output file is opened and locked
    err = stderr_console()
    on_ray = None
    if ray is not None:
        import dataclasses

        if opts.tp is not None:
            raise BadInput("--ray spreads prompts over workers, --tp one model over processes: "
                           "use one of them")
        on_ray = {"address": ray, "workers": workers, "gpus_per_worker": gpus_per_worker,
                  "load": {**dataclasses.asdict(opts), "tp": None}}
    summary = batch_file(inputs, out, load=lambda: load(opts),
                         model_name=resolve(opts.model).name,
                         random_weights=opts.random_weights, force=force,
                         batch_size=batch_size, top_k=top_k, snippet=snippet, truncate=truncate,
                         progress=lambda todo: batch_progress(err, todo), ray=on_ray)
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


@app.command(epilog=docs_epilog("report"))
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
    stderr_console().print(f"wrote {out}", markup=False, soft_wrap=True)
    check_match(explanation.match, [c.name for c in explanation.checks if not c.ok])


@app.command()
@guarded
@model_options(placement=False)
def tui(
    prompt: Annotated[Optional[str], typer.Argument(help="A first prompt to trace.")] = None,
    opts: LoadOptions = LoadOptions(),
) -> None:
    """Explore forward passes interactively in the terminal, with the model loaded once:
    edit the prompt, move through the layers, switch heads, attribute, export."""
    quiet_libraries()
    from .tui import FptraceApp

    FptraceApp(prompt=prompt, load=opts).run()


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


from .cli_analysis import attribute, diff, patch  # noqa: E402  (registered after run..report)


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
        stderr_console().print(f"fptrace: error: {' '.join(e.format_message().split())}{where}",
                        markup=False, soft_wrap=True)
        rc = 2
    except typer.Abort:
        stderr_console().print("fptrace: error: interrupted", markup=False)
        rc = 130
    sys.exit(rc if isinstance(rc, int) else 0)

if __name__ == "__main__":
    main()


__all__ = ["app", "main", "run", "shapes", "explain", "attribute", "diff", "patch", "generate", "tui",
           "batch", "models", "report", "schema"]
