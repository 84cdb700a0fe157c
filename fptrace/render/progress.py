"""The progress bars on stderr: of the commands over many prompts (batch, stats: prompts done,
tokens/s and the time left) and of a dictionary's training (features train: the collection,
then the steps)."""

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


@contextlib.contextmanager
def training_progress(err: Console, collecting: str) -> Iterator[Callable[[str, int, int], None]]:
    """A dictionary's training on stderr: the collection (phase `prompts`, advanced by prompts,
    its bar named `collecting`) and the training (phase `steps`, or `layer L` for each block,
    in steps: one training bar at a time)."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                  console=err) as bar:
        tasks: dict = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase == "prompts":
                if phase not in tasks:
                    tasks[phase] = bar.add_task(collecting, total=total)
                bar.update(tasks[phase], advance=done)
                return
            verb = "training: steps" if phase == "steps" else f"training {phase}: steps"
            if phase not in tasks:
                for old in [p for p in tasks if p != "prompts"]:
                    bar.remove_task(tasks.pop(old))
                tasks[phase] = bar.add_task(verb, total=total)
            bar.update(tasks[phase], completed=done)

        yield progress
