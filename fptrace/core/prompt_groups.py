"""Many prompts, a group at a time: the loop `batch` and `stats` share.

The prompts still to do go through the model `batch_size` at a time (one padded forward pass
per group). A prompt that cannot be read or prepared (bad UTF-8, longer than the context without
--truncate) fails alone, before the pass; a group whose pass fails is run again one prompt at a
time, so one bad prompt never costs the others. Ctrl-C, and SIGTERM inside
`sigterm_interrupts()`, stop the loop between groups: what was handed on stays handed on, and a
group is handed on whole (`interrupts_held`: an interrupt during the hand-over waits for its end).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fptrace.core.inputs import PromptItem
from fptrace.errors import BadInput, FptraceError

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel


@dataclass
class Summary:
    total: int = 0
    traced: int = 0
    failed: int = 0
    skipped: int = 0  # already done (in the output file)
    nonfinite: int = 0  # traced, but with NaN/Inf somewhere
    tokens: int = 0
    seconds: float = 0.0
    interrupted: bool = False


@dataclass(frozen=True)
class Encoded:
    """A prompt ready for the model: its item and its Prepared prompt (models/prompts.py: the
    ids, the text they spell, what --truncate dropped)."""

    item: PromptItem
    prepared: Any

    @property
    def ids(self) -> tuple[int, ...]:
        return self.prepared.ids


@dataclass(frozen=True)
class Failure:
    """A prompt that could not be run: the one-line message and the error's class name."""

    item: PromptItem
    error: str
    error_type: str


def failure(item: PromptItem, e: BaseException) -> Failure:
    return Failure(item, str(e) if isinstance(e, FptraceError) else f"{type(e).__name__}: {e}",
                   type(e).__name__)


def encode(lm: LoadedModel, item: PromptItem, truncate: bool) -> Encoded:
    """The item's prompt as the model takes it (text through the tokenizer, a conversation
    through the chat template: LoadedModel.prepare), or an FptraceError saying why it cannot be
    run."""
    return Encoded(item, lm.prepare(item.checked(), truncate))


def run_groups(lm: LoadedModel, items: Sequence[PromptItem], work: Callable[[list[Encoded]], Any],
               emit: Callable[[list[PromptItem], list[Any], dict[str, Failure]], None], *,
               summary: Summary, batch_size: int, truncate: bool,
               progress: Callable[[int, int], None] | None = None) -> Summary:
    """Run every item: work(group) does one forward pass over a group of encoded prompts and
    returns what it made of them; emit(chunk, results, failures) then gets the chunk's items in
    input order, the results of its pass (one, or one per prompt when the group was run again
    prompt by prompt, in input order) and the failures by id. Counts go into summary (traced,
    failed, tokens, seconds, interrupted); progress(prompts, tokens) after each chunk."""
    if batch_size < 1:  # the CLI's --batch-size is held to the same by Typer
        raise BadInput(f"batch_size must be at least 1, not {batch_size}")
    start = time.perf_counter()
    try:
        for g in range(0, len(items), batch_size):
            chunk = list(items[g:g + batch_size])
            failures: dict[str, Failure] = {}
            group: list[Encoded] = []
            for it in chunk:
                if it.error is not None:
                    failures[it.id] = Failure(it, it.error, "BadInput")
                    continue
                try:
                    group.append(encode(lm, it, truncate))
                except FptraceError as e:
                    failures[it.id] = failure(it, e)
            results = _run(group, work, failures) if group else []
            done = [e for e in group if e.item.id not in failures]
            summary.traced += len(done)
            summary.failed += len(failures)
            summary.tokens += sum(len(e.ids) for e in done)
            with interrupts_held():  # handed on whole or not at all
                emit(chunk, results, failures)
            if progress is not None:
                progress(len(chunk), sum(len(e.ids) for e in group))
    except KeyboardInterrupt:
        summary.interrupted = True
    summary.seconds += time.perf_counter() - start
    return summary


def _run(group: list[Encoded], work: Callable[[list[Encoded]], Any],
         failures: dict[str, Failure]) -> list[Any]:
    """work on the whole group; if that fails, on each prompt alone."""
    try:
        return [work(group)]
    except (FptraceError, RuntimeError, MemoryError) as e:
        if len(group) == 1:
            failures[group[0].item.id] = failure(group[0].item, e)
            return []
    results = []
    for one in group:  # one prompt at a time, so a bad one costs only itself
        try:
            results.append(work([one]))
        except (FptraceError, RuntimeError, MemoryError) as e1:
            failures[one.item.id] = failure(one.item, e1)
    return results


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM that land inside are held until its end and then delivered there, to
    the handlers they had: what a group hands on (statistics merged, records written) is handed
    on whole or not at all. Off the main thread (a resident server's request) signals are not
    this thread's to hold, and nothing is held."""
    held: list[int] = []

    def hold(signum: int, frame: object) -> None:
        held.append(signum)

    signals = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.getsignal(sig) for sig in signals}
    try:
        for sig in signals:
            signal.signal(sig, hold)
    except ValueError:  # not the main thread: nothing was changed
        before = {}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:
                signal.signal(sig, handler)
    for signum in dict.fromkeys(held):
        signal.raise_signal(signum)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops the loop between groups, as Ctrl-C does."""
    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


__all__ = [
    "Encoded",
    "Failure",
    "Summary",
    "encode",
    "failure",
    "run_groups",
    "sigterm_interrupts",
]
