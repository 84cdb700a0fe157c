"""`fptrace explain`."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, check_match, load_for, output, prompt_command
from fptrace.cli.options import SAMPLING, STATS, ChatOptions, LoadOptions, Outputs
from fptrace.cli.page import write_page


@prompt_command(order=30, group=Group.trace, docs="explain",
                examples=('fptrace explain "The capital of France is" --layer 3 --head 2',),
                placement=False, tp=True)
def explain(
    prompt: Annotated[str | None, typer.Argument(
        help="The text whose forward pass is explained (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    layer: Annotated[str, typer.Option("--layer", "-l", metavar="L", help="The block to "
                                       "recompute (negative counts from the end).",
                                       rich_help_panel=STATS)] = "0",
    head: Annotated[str, typer.Option("--head", metavar="H", help="The attention head whose "
                                      "values and matrix are shown (of that block).",
                                      rich_help_panel=STATS)] = "0",
    temperature: Annotated[float, typer.Option("--temperature", "-t", help="Temperature of the "
                                               "sampled strategies (0 = greedy).",
                                               rich_help_panel=SAMPLING)] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="k of top-k sampling.",
                                       rich_help_panel=SAMPLING)] = 10,
    top_p: Annotated[float, typer.Option("--top-p", "-p", help="p of nucleus (top-p) sampling, "
                                         "in (0, 1].", rich_help_panel=SAMPLING)] = 0.9,
    show_rows: Annotated[int, typer.Option("--show", help="Most probable tokens listed in the "
                                           "sampling table.", rich_help_panel=SAMPLING)] = 8,
    outputs: Outputs = Outputs(),
) -> None:
    """Recompute one block step by step, checked against the model.

    Recompute one block step by step from the model's weights, check it matches the model,
    then follow the last position to the logits and the sampling choices."""
    from fptrace.addresses import parse_block, parse_index
    from fptrace.core.sampling import check_options
    from fptrace.errors import as_flag

    check_options(temperature, top_k, top_p, named=as_flag)
    block, h = parse_block(layer, "--layer"), parse_index(head, "--head", "head")
    lm, prompt = load_for(prompt, opts, chat, outputs)
    from fptrace.commands.explain.core import covered
    from fptrace.commands.explain.core import explain as run_explain

    covered(lm.parts.family)
    result = run_explain(lm, prompt, layer=block, head=h, temperature=temperature,
                         top_k=top_k, top_p=top_p, seed=opts.seed, show=show_rows,
                         all_heads=outputs.plot is not None or outputs.html is not None)
    from fptrace.commands.explain.render import attention_figure, explain_view

    output(result, explain_view, outputs, figure=attention_figure)
    write_page(outputs.html, lm, prompt, "explain", result)
    check_match(result.match, [c.name for c in result.checks if not c.ok])
