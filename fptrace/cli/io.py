"""What every command of the command line shares: the `@command` marker that registers it, the
one-line error handling, loading a model (and starting tensor-parallel ranks), printing views that
fit the terminal, JSON and figures."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console

from fptrace.cli.modes import Mode, help_paragraph
from fptrace.cli.options import (
    ChatOptions,
    LoadOptions,
    Outputs,
    chat_options,
    model_options,
    output_options,
)
from fptrace.errors import BadInput, FptraceError, as_flag, spelled, spelling

if TYPE_CHECKING:
    from types import ModuleType

    from matplotlib.figure import Figure

    from fptrace.models.loading import LoadedModel

COMMAND_MARK = "__fptrace_command__"


class Group(str, Enum):
    """The panels of `fptrace --help`, in the order a reader looks for a command."""

    trace = "Trace and look"
    why = "Why this answer"
    compare = "Compare and collect"
    pages = "Pages and servers"
    reference = "Reference"


def command(order: int, group: Group, docs: str | None = None, examples: tuple[str, ...] = (),
            resident: bool = True, words: Callable[[list[str]], list[str]] | None = None,
            modes: tuple[Mode, ...] = ()
            ) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Mark the function of a command's cli.py as `fptrace <its folder>` (cli/main.py finds it):
    order places it in `fptrace --help`, in group's panel, where the first paragraph of its
    docstring is its one line; examples (command lines from its docs' console examples, which
    the transcript test runs) and docs (its page under docs/) end its --help; resident=False
    keeps it out of a resident server (it owns the terminal, or is the server); words, where
    given, rewrites the command's words before they are parsed (an option that is a flag in one
    mode of the command and takes a value in another); modes (its folder's modes.py, cli/modes.py)
    add a paragraph after the docstring's. The docstring's paragraphs are reflowed: no hard line
    break inside one at any width. The function is wrapped by `guarded`, so an error is one line
    and an exit code."""

    def mark(fn: Callable[..., object]) -> Callable[..., object]:
        wrapped = guarded(fn)
        paragraphs = reflowed(fn.__doc__ or "") + ([help_paragraph(modes)] if modes else [])
        kw: dict[str, object] = {"help": "\n\n".join(paragraphs), "short_help": paragraphs[0],
                              "rich_help_panel": group.value, "epilog": epilog(examples, docs)}
        if words is not None:
            kw["cls"] = _rewriting(words)
        setattr(wrapped, COMMAND_MARK, {
            "order": order, "resident": resident, "group": group, "examples": examples,
            "typer": kw})
        return wrapped

    return mark


def prompt_command(order: int, group: Group, docs: str | None = None,
                   examples: tuple[str, ...] = (), placement: bool = True, tp: bool = False,
                   quantize: bool = False, plot: bool = True, html: bool = True,
                   words: Callable[[list[str]], list[str]] | None = None,
                   modes: tuple[Mode, ...] = ()
                   ) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """@command for a command that traces one prompt, with the three option groups such a
    command takes: the loading options (model_options: placement, tp, quantize), the prompt's
    (chat_options: --chat, --system, --messages, --ids, --ids-file) and the outputs
    (output_options: --plot and --html where the command writes them, --force, --json,
    --wide). Its function takes `opts: LoadOptions`, `chat: ChatOptions` and `outputs: Outputs`,
    and starts with `lm, prompt = load_for(prompt, opts, chat, outputs)`."""

    def mark(fn: Callable[..., object]) -> Callable[..., object]:
        fn = output_options(plot=plot, html=html)(fn)
        fn = model_options(placement=placement, tp=tp, quantize=quantize)(fn)
        fn = chat_options()(fn)
        return command(order, group, docs=docs, examples=examples, words=words,
                       modes=modes)(fn)

    return mark


def _rewriting(words: Callable[[list[str]], list[str]]) -> type:
    """A Typer command class whose words pass through `words` before they are parsed."""
    from typer.core import TyperCommand

    class Rewriting(TyperCommand):
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            return super().parse_args(ctx, words(list(args)))

    return Rewriting


def reflowed(doc: str) -> list[str]:
    """A docstring's paragraphs, each on one line (the terminal wraps them at its width)."""
    import inspect

    return [" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n") if p.strip()] \
        or [""]


def epilog(examples: tuple[str, ...], docs: str | None) -> str:
    """The end of a command's --help: its examples, one a line, then its docs page."""
    from rich.markup import escape

    shown = "Examples:\n" + "\n".join(f"  $ {escape(e)}" for e in examples) if examples else ""
    page = f"A worked example and every option explained: docs/{docs}.md." if docs else ""
    return "\n\n".join(x for x in (shown, page) if x)


def command_order(name: str) -> int:
    """Where `fptrace <name>` stands in `fptrace --help`: the order its @command gives (the
    composers list what the command folders offer in this order)."""
    import importlib

    module = importlib.import_module(f"fptrace.commands.{name}.cli")
    return next(getattr(f, COMMAND_MARK)["order"] for f in vars(module).values()
                if hasattr(f, COMMAND_MARK))


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def stdout_console() -> Console:
    """Tables go to stdout; when it is not a terminal they are laid out 130 columns wide
    (COLUMNS overrides)."""
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 130
    return Console(highlight=False, width=width)


def show(view: Callable[[int | None], Any], wide: bool = False, out: Console | None = None
         ) -> Console:
    """Print a view laid out for the terminal's width: view(width) leaves out the columns
    that do not fit and says so; with --wide, view(None) has every column and the console
    grows to its natural width."""
    out = out or stdout_console()
    if wide:
        from fptrace.render.fit import natural_width

        rendered = view(None)
        out.width = natural_width(rendered, out.width)
    else:
        rendered = view(out.width)
    out.print(rendered)
    return out


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit non-zero."""
    from fptrace import interrupt

    line = " ".join(spelled(str(message), flag).split())
    if code == interrupt.EXIT:
        interrupt.said()
        line = interrupt.with_reason(line)
    stderr_console().print(f"fptrace: error: {line}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def flag(name: str) -> str:
    """How the running command spells a parameter that an error names through `param`: the
    longest `--option` it declares for that name, else `--` + the name with `_` -> `-`."""
    command = getattr(click_context(), "command", None)
    for p in getattr(command, "params", ()):
        if p.name == name:
            longs = [o for o in p.opts if o.startswith("--")]  # not its --no-x
            if longs:
                return max(longs, key=len)
    return as_flag(name)


def click_module(name: str) -> ModuleType:
    """click's module `name` (globals, exceptions), whether typer vendors click (0.29+) or
    uses it (older releases)."""
    import importlib

    base = next(c for c in typer.Context.__mro__ if c.__name__ == "Context"
                and c.__module__.endswith(".core") and c is not typer.Context)
    return importlib.import_module(f"{base.__module__.rsplit('.', 1)[0]}.{name}")


def click_context() -> object | None:
    """The running command's click context, or None outside one."""
    return click_module("globals").get_current_context(silent=True)


def option_given(flag: str, value: object, default: object) -> bool:
    """Whether the option `flag` was given: typed on the command line, which click's context
    of the running command says (so that an option typed at its default value, `--top 5` or
    `--latents 2048`, still counts and is refused where its mode does not take it); called
    without a command line (the Python API), whether its value is not its default."""
    core = click_module("core")  # typer's own click (it vendors one)
    ctx = click_context()
    if not isinstance(ctx, core.Context):
        return value != default
    param = next((p for p in ctx.command.params if flag in getattr(p, "opts", ())), None)
    if param is None or param.name is None:
        return value != default
    source = core.ParameterSource
    return ctx.get_parameter_source(param.name) in (source.COMMANDLINE, source.ENVIRONMENT)


def guarded(fn: Callable[..., object]) -> Callable[..., object]:
    """Turn every error into one line on stderr and a non-zero exit code: never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        with spelling(flag):  # the errors' parameters as this command's flags
            try:
                return fn(*args, **kwargs)
            except typer.Exit:
                raise
            except FptraceError as e:
                from fptrace.interrupt import seen

                if seen() and e.exit_code != 130:  # an error that the interrupt caused
                    fail("interrupted", 130)
                fail(e.message(flag), e.exit_code)
            except KeyboardInterrupt:
                fail("interrupted", 130)
            except Exception as e:  # a bug of ours: still one line, the traceback on request
                from fptrace.core.hooks import is_oom
                from fptrace.interrupt import seen

                if seen():  # a library turned our KeyboardInterrupt into another error
                    fail("interrupted", 130)

                if is_oom(e):
                    fail("out of memory: try --dtype bfloat16, --device-map auto, a shorter prompt "
                         f"or a smaller model ({type(e).__name__}: {str(e)[:120]})", 3)
                if os.environ.get("FPTRACE_DEBUG"):
                    raise
                fail(f"internal error: {type(e).__name__}: {e} (set FPTRACE_DEBUG=1 for the "
                     "traceback)", 70)

    return wrapper


def quiet_libraries() -> None:
    from fptrace.models.quantize import quiet_torchao

    quiet_torchao()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def load(opts: LoadOptions) -> LoadedModel:
    """The model, or with --tp N outside torchrun: N ranks of this same command started through
    torch's launcher (after the checks that need no weights), whose exit code ends this one."""
    quiet_libraries()
    launch_ranks(opts)
    err = stderr_console()
    return opts.load(progress=lambda m: err.print(f"[dim]{m}[/dim]", soft_wrap=True))


def prompt_of(prompt: str | None, chat: ChatOptions | None = None) -> Any:
    """What is traced: PROMPT as text, with --chat/--system/--messages a conversation for the
    model's chat template (models/prompts.py's Chat), or with --ids/--ids-file token ids (a
    tuple of ints); checked before anything is loaded."""
    from fptrace.models.prompts import Chat, read_messages
    from fptrace.models.tokenizers import check_prompt

    chat = chat or ChatOptions()
    if chat.ids is not None or chat.ids_file is not None:
        return ids_of(prompt, chat)
    if chat.messages is not None:
        if chat.chat or chat.system is not None:
            raise BadInput("--messages holds the whole conversation: give it without --chat "
                           "and --system")
        if prompt is not None:
            raise BadInput("give PROMPT or --messages FILE, not both")
        conversation = read_messages(chat.messages)
        for m in conversation.messages:
            if m.content:
                check_prompt(m.content)
        return conversation
    if prompt is None:
        raise BadInput("give a PROMPT to trace (or a conversation with --messages FILE, or "
                       "token ids with --ids)")
    check_prompt(prompt)
    if chat.system is not None:
        check_prompt(chat.system, "--system")
    if chat.chat or chat.system is not None:
        return Chat.of(prompt, chat.system)
    return prompt


def ids_of(prompt: str | None, chat: ChatOptions) -> tuple[int, ...]:
    """The token ids of --ids or --ids-file, refused with PROMPT or the other prompt options."""
    from fptrace.models.prompts import parse_ids, read_ids

    flag = "--ids" if chat.ids is not None else "--ids-file"
    if chat.ids is not None and chat.ids_file is not None:
        raise BadInput("give --ids or --ids-file, not both")
    if prompt is not None:
        raise BadInput(f"give PROMPT or {flag}, not both")
    if chat.messages is not None or chat.chat or chat.system is not None:
        raise BadInput(f"{flag} are the model's input as they are: give them without --chat, "
                       "--system and --messages")
    return parse_ids(chat.ids) if chat.ids is not None else read_ids(chat.ids_file or "")


def load_for(prompt: str | None, opts: LoadOptions, chat: ChatOptions | None = None,
             out: Outputs = Outputs()) -> tuple[LoadedModel, Any]:
    """What a command that traces one prompt does first: check the prompt (and turn it into a
    conversation with --chat/--messages) and the --plot and --html paths, before anything is
    loaded, so a mistake costs nothing; then load the model. Returns (model, what to trace)."""
    from fptrace.render.figures import check_path

    traced = prompt_of(prompt, chat)
    if out.plot is not None:
        check_path(out.plot, force=out.force)
    if out.html is not None:
        from fptrace.cli.page import check_page

        check_page(out.html, force=out.force)
    lm = load(opts)
    if isinstance(traced, tuple):  # token ids: checked against the vocabulary, and said on
        said_of_ids(lm, traced)  # stderr where their text tokenizes to other ids
    return lm, traced


def said_of_ids(lm: LoadedModel, ids: tuple[int, ...]) -> None:
    """Refuse ids outside the model's vocabulary; say on stderr (the ids are traced as given)
    where the text they decode to tokenizes to other ids."""
    lm.check_ids(ids)
    ctx = getattr(lm.config, "max_position_embeddings", None)
    if lm.tokenizer is None or (ctx and len(ids) > ctx):  # refused or truncated where traced
        return
    from fptrace.models.loading import retokenized

    note = retokenized(lm.tokenizer, ids)
    if note:
        stderr_console().print(f"note: {note}", markup=False, soft_wrap=True)


def launch_ranks(opts: LoadOptions) -> None:
    """With --tp N outside torchrun: check the config, run this command as N ranks, and exit
    with their exit code. Commands that open files call it before opening them."""
    from fptrace.models import tensor_parallel as tp

    if opts.tp is not None and tp.world_size() == 1:
        from fptrace.models.registry import resolve
        from fptrace.models.sources import load_config

        tp.check(load_config(resolve(opts.model)), opts.tp, device_map=opts.device_map,
                 random_weights=opts.random_weights)
        n, argv = tp.strip_tp(sys.argv[1:])
        raise typer.Exit(tp.launch(n or opts.tp, argv))


def write_plot(fig: Figure, path: str, force: bool = False) -> None:
    from fptrace.render.figures import save

    save(fig, path, force)
    stderr_console().print(f"[dim]wrote {path}[/dim]", soft_wrap=True)


def output(result: object, view: Callable[[Any, int | None], Any], out: Outputs,
           figure: Callable[[Any], Any] | None = None) -> None:
    """A command's result: the figure for --plot, then the JSON (--json) or the view that fits
    the terminal."""
    if out.plot is not None and figure is not None:
        write_plot(figure(result)[0], out.plot, out.force)
    if out.as_json:
        emit_json(result)
    else:
        show(lambda width: view(result, width), out.wide)


def emit_json(result: object) -> None:
    from fptrace.render.json import to_json

    sys.stdout.write(to_json(result) + "\n")
    sys.stdout.flush()


def check_match(match: bool, failed: list[str]) -> None:
    if not match:
        from fptrace.errors import Mismatch

        raise Mismatch(f"the recomputation does not match the model ({'; '.join(failed)})")


def require_checks(checks: Any, what: str) -> None:
    """Exit 5 when any of a result's checks of its own numbers fails: `what` does not check
    out, each failed check named with its measure and its rule."""
    bad = [c for c in checks if not c.ok]
    if bad:
        from fptrace.errors import Mismatch

        raise Mismatch(f"{what} does not check out: " + "; ".join(
            f"{c.name}: {c.value:.2e}, {c.tolerance}" for c in bad))
