"""`fptrace tui`."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, command, quiet_libraries
from fptrace.cli.options import ChatOptions, LoadOptions, chat_options, model_options


@command(order=100, group=Group.pages, resident=False,
         examples=('fptrace tui "The capital of France is"',))
@chat_options()
@model_options(placement=False)
def tui(
    prompt: Annotated[str | None, typer.Argument(help="A first prompt to trace.")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
) -> None:
    """Explore forward passes interactively in the terminal.

    Explore forward passes interactively in the terminal, with the model loaded once:
    edit the prompt, move through the layers, switch heads, attribute, export. With --chat
    (--system, --messages) the prompt box holds the user's message."""
    quiet_libraries()
    from fptrace.cli.io import prompt_of
    from fptrace.commands.tui.app import FptraceApp
    from fptrace.models.prompts import Chat

    if chat.ids is not None or chat.ids_file is not None:
        from fptrace.errors import BadInput

        raise BadInput("the TUI's prompt box holds text: trace token ids with `fptrace run --ids`")
    before = None
    if chat.messages is not None or chat.chat or chat.system is not None:
        conversation = prompt_of(prompt if chat.messages is None else None, chat) \
            if prompt is not None or chat.messages is not None else Chat.of("", chat.system)
        last = conversation.messages[-1]
        if last.role == "user":
            before, prompt = Chat(conversation.messages[:-1]), last.content or prompt
        else:
            before = conversation
    FptraceApp(prompt=prompt, load=opts, chat=before).run()
