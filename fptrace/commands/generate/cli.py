"""`fptrace generate`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fptrace.cli.io import Group, emit_json, load_for, prompt_command, show, stdout_console
from fptrace.cli.options import SAMPLING, STATS, ChatOptions, LoadOptions, Outputs

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel
    from fptrace.models.prompts import Prompt


@prompt_command(order=70, group=Group.compare, docs="generate",
                examples=('fptrace generate "The capital of France is" -n 12',), tp=True,
                plot=False, html=False)
def generate(
    prompt: Annotated[str | None, typer.Argument(
        help="The text to continue (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
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
    outputs: Outputs = Outputs(),
) -> None:
    """Generate token by token, every step traced.

    Generate token by token: each step's input, stream and KV-cache shapes, the chosen token
    and its alternatives, and the time of the prefill and of each decode step."""
    from fptrace.commands.generate.core import check_new_tokens
    from fptrace.core.sampling import check_generation
    from fptrace.errors import as_flag

    check_new_tokens(max_new_tokens, "-n")
    check_generation(temperature, top_k or None, top_p, named=as_flag, off="0")  # --top-k 0
    lm, prompt = load_for(prompt, opts, chat, outputs)
    from fptrace.commands.generate.core import generate as run_generate

    on_step = None if outputs.as_json else _step_printer(lm, prompt, max_new_tokens, layers,
                                                         outputs.wide, sampled=temperature > 0)
    result = run_generate(lm, prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                          top_k=top_k or None, top_p=top_p, seed=opts.seed, layers=layers,
                          alternatives=alternatives, on_step=on_step)
    if outputs.as_json:
        emit_json(result)
    else:
        from fptrace.commands.generate.render import summary

        stdout_console().print(summary(result))
    bad = next((s for s in result.steps if s.first_nonfinite), None)
    if bad is not None:
        from fptrace.errors import NonFiniteValues

        raise NonFiniteValues(f"NaN or Inf appeared at step {bad.index} ({bad.first_nonfinite})")


def _step_printer(lm: LoadedModel, prompt: Prompt, max_new_tokens: int, layers: bool, wide: bool,
                  sampled: bool) -> Callable[[Any, str], None]:
    """Print the header, the prompt's tokens and the step columns; return the callback that
    prints each step's line as soon as the step exists."""
    from fptrace.commands.generate.render import step_columns, step_header, step_layers, step_line
    from fptrace.core.trace import model_info
    from fptrace.render.tables import header, token_table

    out = stdout_console()
    width = None if wide else out.width
    info = model_info(lm)
    prepared = lm.prepare(prompt)
    ids = prepared.ids
    cols = step_columns(width, len(ids) + max_new_tokens, info.d_model, info.n_kv_heads,
                        info.head_dim, sampled=sampled)
    out.print(header(info))
    out.print(token_table(lm.tokens(prepared), title="Prompt tokens", width=width))
    out.print(step_header(cols), soft_wrap=wide)

    def on_step(step: Any, text: str) -> None:
        out.print(step_line(step, text, cols), soft_wrap=True)
        if layers:
            show(lambda w: step_layers(step, w), wide, out)

    return on_step
