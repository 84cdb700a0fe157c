"""`fptrace report`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fptrace.cli.io import check_match, command, load, load_for, require_checks, stderr_console
from fptrace.cli.options import (
    OUTPUT,
    STATS,
    ChatOptions,
    ForceOpt,
    LoadOptions,
    chat_options,
    model_options,
)


@command(order=90, docs="report")
@chat_options()
@model_options(placement=False)
def report(
    out: Annotated[str, typer.Option("--out", "-o", help="The .html file to write.",
                                     rich_help_panel=OUTPUT)],
    prompt: Annotated[Optional[str], typer.Argument(
        help="The text to trace (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    layer: Annotated[int, typer.Option("--layer", "-l", help="The block the walkthrough "
                                       "recomputes.", rich_help_panel=STATS)] = 0,
    head: Annotated[int, typer.Option("--head", help="The head whose matrix the walkthrough "
                                      "shows.", rich_help_panel=STATS)] = 0,
    noise: Annotated[Optional[str], typer.Option(
        "--noise", help="Also a causal-tracing section: noise on this subject's embeddings "
        "(as `fptrace patch --noise`).", rich_help_panel=STATS)] = None,
    add: Annotated[Optional[str], typer.Option(
        "--add", help="Also a steering section: this prompt's stream minus --subtract's, added "
        "at --steer-layer at strengths 0,1,2,4,8 (as `fptrace steer`).",
        rich_help_panel=STATS)] = None,
    subtract: Annotated[Optional[str], typer.Option(
        "--subtract", help="With --add: the prompt subtracted.", rich_help_panel=STATS)] = None,
    steer_layer: Annotated[Optional[int], typer.Option(
        "--steer-layer", help="With --add: the block whose output receives the vector.",
        rich_help_panel=STATS)] = None,
    ablate: Annotated[bool, typer.Option(
        "--ablate", help="Also an ablation section: every head and MLP removed one at a time "
        "(as `fptrace ablate --all-heads --all-mlps`).", rich_help_panel=STATS)] = False,
    model_b: Annotated[Optional[str], typer.Option(
        "--model-b", help="Also a `diff --deep` section: the prompt on this model too.",
        rich_help_panel=STATS)] = None,
    dtype_b: Annotated[Optional[str], typer.Option(
        "--dtype-b", help="... or in this dtype.", rich_help_panel=STATS)] = None,
    quantize_b: Annotated[Optional[str], typer.Option(
        "--quantize-b", help="... or quantized on load (int8, int4).",
        rich_help_panel=STATS)] = None,
    qk: Annotated[Optional[str], typer.Option(
        "--qk", metavar="LAYER.HEAD", help="The head whose attention score the report splits "
        "(as `fptrace attribute --qk`); default: the head that adds most to the top-1.",
        rich_help_panel=STATS)] = None,
    force: ForceOpt = False,
) -> None:
    """One self-contained HTML file: the run tables, the figures, the explain walkthrough of
    one layer, the attribution of the top-1, why one head attends where it does (and with
    --noise, causal tracing) and the JSON trace. It makes no network request and opens offline."""
    from fptrace.commands.report.core import build_html, check_out, write_report

    check_out(out, force)
    if (add is None) != (subtract is None) or (add is not None and steer_layer is None):
        from fptrace.errors import BadInput

        raise BadInput("the steering section needs --add, --subtract and --steer-layer")
    from fptrace.commands.attribute.qk import qk_request

    qk_head = qk_request(qk, None, None, "term")
    lm, prompt = load_for(prompt, opts, chat=chat)
    from fptrace.commands.explain.core import covered
    from fptrace.commands.explain.core import explain as run_explain
    from fptrace.core.trace import run_trace

    covered(lm.parts.family)
    from fptrace.commands.attribute.core import attribute as run_attribute

    trace = run_trace(lm, prompt, lens_grid=True)
    explanation = run_explain(lm, prompt, layer=layer, head=head, all_heads=True)
    attribution = run_attribute(lm, prompt)
    from fptrace.commands.attribute.qk import attribute_qk, top_head

    qk_head = qk_head or top_head(attribution)
    split = None if qk_head is None or lm.parts.family.qk_weights is None else \
        attribute_qk(lm, prompt, *qk_head, top=10)
    patching = None
    if noise is not None:
        from fptrace.commands.patch.core import patch as run_patch

        patching = run_patch(lm, prompt, noise=noise, seed=opts.seed)
    steering = ablation = None
    if add is not None or subtract is not None:
        from fptrace.commands.steer.core import steer as run_steer

        steering = run_steer(lm, prompt, add=add, subtract=subtract, layer=steer_layer,
                             scales="0,1,2,4,8")
    if ablate:
        from fptrace.commands.ablate.core import ablate as run_ablate

        ablation = run_ablate(lm, prompt, all_heads=True, all_mlps=True)
    against = None
    settings_b = {k: v for k, v in (("model", model_b), ("dtype", dtype_b),
                                    ("quantize", quantize_b)) if v is not None}
    if settings_b:
        import dataclasses

        from fptrace.commands.diff.deep import deep_diff

        against = deep_diff(lm, load(dataclasses.replace(opts, **settings_b)), prompt)
    write_report(out, build_html(trace, explanation, attribution, patching, against, qk=split,
                                 steering=steering, ablation=ablation))
    stderr_console().print(f"wrote {out}", markup=False, soft_wrap=True)
    check_match(explanation.match, [c.name for c in explanation.checks if not c.ok])
    if split is not None:
        check_match(split.ok, [c.name for c in split.checks if not c.ok])
    if steering is not None:
        require_checks(steering.checks, "the steered run")
    if ablation is not None:
        require_checks(ablation.checks, "the ablation")
