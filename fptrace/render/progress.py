"""The progress bar of the commands over many prompts (batch, stats), on stderr: prompts done,
tokens/s and the time left."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


@contextlib.contextmanager
def prompts_progress(err: Console, todo: int, verb: str = "tracing"
                     ) -> Iterator[Callable[[int, int], None]]:
    """A bar over `todo` prompts; yields the callback(prompts, tokens) the loop calls."""
    columns = (TextColumn(verb), BarColumn(), MofNCompleteColumn(),
               TextColumn("prompts  {task.fields[tps]:>7,.0f} tokens/s"), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task("prompts", total=todo, tps=0.0)
        tokens = 0
        t0 = time.perf_counter()

        def tick(n_prompts: int, n_tokens: int) -> None:
            nonlocal tokens
            tokens += n_tokens
            bar.update(task, advance=n_prompts, tps=tokens / max(time.perf_counter() - t0, 1e-9))

        yield tick
