"""The Typer app and the entry point.

Commands are found, not listed: every folder of fptrace/commands/ whose cli.py marks a function
with `@command(...)` (cli/io.py) becomes `fptrace <folder>`, in the order the markers give. The
command modules keep their heavy imports (torch, transformers, textual) inside the functions, so
building the app, and `fptrace --help`, imports neither.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from typing import Annotated

import typer

from fptrace import interrupt
from fptrace.cli.io import COMMAND_MARK, click_module, stderr_console

app = typer.Typer(
    name="fptrace",
    help="Trace one forward pass of a transformer language model, block by block.",
    epilog="With `fptrace serve` running, every command answers from the models it holds "
           "(`--keep-warm` on any command starts one; FPTRACE_SERVER=off runs here): "
           "docs/serve.md.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from fptrace.version import describe

        typer.echo(describe())
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", "-V", is_eager=True, callback=_version,
        help="The versions of fptrace, torch and transformers, and which optional parts are "
        "installed.")] = False) -> None:
    """Trace one forward pass of a transformer language model, block by block."""


def discover() -> list[tuple[int, str, object]]:
    """(order, name, function) of every command: the marked function of each
    fptrace/commands/<name>/cli.py."""
    import fptrace.commands as pkg

    found = []
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.ispkg:
            continue
        module = importlib.import_module(f"{pkg.__name__}.{info.name}.cli")
        marked = [f for f in vars(module).values() if hasattr(f, COMMAND_MARK)]
        if len(marked) != 1:
            raise RuntimeError(f"fptrace/commands/{info.name}/cli.py marks {len(marked)} "
                               "functions with @command; it must mark exactly one")
        fn = marked[0]
        found.append((getattr(fn, COMMAND_MARK)["order"], info.name, fn))
    return sorted(found, key=lambda t: (t[0], t[1]))


COMMANDS = discover()
for _order, _name, _fn in COMMANDS:
    app.command(name=_name, **getattr(_fn, COMMAND_MARK)["typer"])(_fn)


def resident_may_answer(argv: list[str]) -> bool:
    """Whether a resident server may run this command line for a client: not for a command
    marked resident=False (the server itself, the TUI, which owns the terminal)."""
    words = [a for a in argv if not a.startswith("-")]
    return not words or all(getattr(fn, COMMAND_MARK)["resident"]
                            for _, name, fn in COMMANDS if name == words[0])


def main(argv: list[str] | None = None) -> None:
    """The console entry point (after fptrace/client.py found no server to answer). Usage
    errors (a bad option value, a missing argument, an unknown command) get the same single
    line as every other error, not a multi-line box; an interrupt at any moment is
    `fptrace: error: interrupted` and exit 130 (fptrace/interrupt.py, whose handler
    `fptrace/__init__.py` installed before the imports above)."""
    rc = answer(argv)
    if rc == interrupt.EXIT:  # never lost: an interrupted run is not 0
        interrupt.leave()
    sys.exit(rc)


def answer(argv: list[str] | None = None) -> int:
    """Run one command line and return its exit code, never raising: what `main` does in a
    process of its own, and what a resident server (commands/serve/) does for each client."""
    interrupt.running()
    try:
        rc = _run(argv)
    except KeyboardInterrupt:
        rc = interrupt.EXIT
    interrupt.settled()
    if interrupt.seen() or rc == interrupt.EXIT:
        interrupt.say()
        return interrupt.EXIT
    return rc


def _run(argv: list[str] | None) -> int:
    usage_error = click_module("exceptions").UsageError
    from fptrace.models.tensor_parallel import rank, world_size

    if world_size() > 1 and rank() != 0:  # under torchrun only rank 0 prints and writes
        sys.stdout = sys.stderr = open(os.devnull, "w", encoding="utf-8")
    try:
        rc = app(args=argv, prog_name="fptrace", standalone_mode=False)
    except usage_error as e:
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `fptrace`: the help
            sys.stdout.write(ctx.get_help() + "\n" if ctx else "")
            return 0
        where = f" (see {ctx.command_path} --help)" if ctx else ""
        stderr_console().print(f"fptrace: error: {' '.join(e.format_message().split())}{where}",
                               markup=False, soft_wrap=True)
        rc = 2
    except typer.Abort:  # click's answer to a KeyboardInterrupt outside a command's body
        rc = interrupt.EXIT
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    main()
