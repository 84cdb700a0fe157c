"""`fptrace serve`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from fptrace.cli.io import Group, command, stderr_console
from fptrace.cli.options import JsonOpt

SERVER = "Server"
IDLE_MAX = 10**9  # seconds of --idle-timeout at most (about 31 years; 0 is never)


@command(order=130, group=Group.pages, docs="serve", resident=False,
         examples=('fptrace serve',
                   'fptrace serve --status'))
def serve(
    stop: Annotated[bool, typer.Option("--stop", help="Stop the running server (a command "
                                       "it runs is interrupted).",
                                       rich_help_panel=SERVER)] = False,
    status: Annotated[bool, typer.Option("--status", help="Show the running server: its "
                                         "models, memory and requests.",
                                         rich_help_panel=SERVER)] = False,
    foreground: Annotated[bool, typer.Option("--foreground", help="Serve from this process "
                                             "(logs on stderr; Ctrl-C stops it) instead of "
                                             "starting a background one.",
                                             rich_help_panel=SERVER)] = False,
    idle_timeout: Annotated[int, typer.Option("--idle-timeout", min=0, max=IDLE_MAX,
                                              metavar="SECONDS",
                                              help="Stop after this long without a request "
                                              "(0: never).", rich_help_panel=SERVER)] = 1800,
    memory_budget: Annotated[str | None, typer.Option(
        "--memory-budget", metavar="SIZE", help="Weights held at most (e.g. 8GiB); the least "
        "recently used model goes first. Default: half of this machine's memory.",
        rich_help_panel=SERVER)] = None,
    as_json: JsonOpt = False,
) -> None:
    """Keep models loaded: every command answers from them.

    Keep models loaded in one background process: every fptrace command then sends its
    arguments there and prints what it would have printed, without loading anything (a
    Unix socket of this user, mode 0600; `FPTRACE_SERVER=off` runs a command here)."""
    from fptrace import serving
    from fptrace.commands.serve import core

    path = serving.socket_path()
    if stop or status:
        if stop and status:
            from fptrace.errors import BadInput

            raise BadInput("give --stop or --status, not both")
        answer = serving.request({"op": "stop" if stop else "status"}, path)
        if answer is None:
            stderr_console().print(f"no fptrace server is running (socket {path})",
                                   markup=False, soft_wrap=True)
            raise typer.Exit(0 if stop else 1)
        if stop:
            gone = core.wait_gone(path)
            stderr_console().print(f"stopped the server (pid {answer['pid']})" if gone else
                                   f"asked the server (pid {answer['pid']}) to stop; it still "
                                   f"listens at {path}", markup=False, soft_wrap=True)
            if not gone:
                raise typer.Exit(1)
        elif as_json:
            import json

            sys.stdout.write(json.dumps(answer, indent=2) + "\n")
        else:
            sys.stdout.write(core.describe(answer) + "\n")
        return
    budget = core.budget_bytes(memory_budget)
    if foreground:
        core.serve(path, idle_timeout, budget)
        return
    pid = core.start_background(path, idle_timeout, budget)
    stderr_console().print(f"fptrace server listening at {path} (pid {pid}); `fptrace serve "
                           "--stop` stops it", markup=False, soft_wrap=True)
