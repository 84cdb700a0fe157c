"""`fptrace batch`: many prompts → one JSON object per prompt (JSON Lines), resumable.

The inputs (core/inputs.py) are read whole before anything runs, so every input mistake is known
up front: a missing file or a duplicate id stops the batch before it starts; a malformed line or
bad UTF-8 becomes an error record and the rest still run. The prompts go through the model a
group at a time (core/prompt_groups.py), a failing prompt becoming an error record.

The output file is only ever appended to, one complete line per `write` call, under an
exclusive lock. A kill can leave at most one partial last line; the next run cuts it off and
skips every prompt whose id is already in the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fptrace.core.inputs import PromptItem, numbered_lines, read_inputs
from fptrace.core.prompt_groups import Encoded, Failure, Summary, run_groups, sigterm_interrupts
from fptrace.errors import BadInput, WriteFailed, param
from fptrace.jsontext import loads
from fptrace.locks import lock
from fptrace.results import SCHEMA_VERSION

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

RECORD_START = b'{"kind": '  # every line record_line writes starts so


def _is_record(obj: Any) -> bool:
    return isinstance(obj, dict) and "id" in obj and obj.get("kind") in ("trace", "error") \
        and "schema_version" in obj


class OutFile:
    """The JSON Lines output: validated, locked, repaired and appended to.

    `open()` refuses a path that is a folder or a file that is not an fptrace batch output;
    with force=False it keeps the records there (resume), with force=True it empties the file.
    """

    def __init__(self, path: str, force: bool = False) -> None:
        self.path = Path(path)
        self.force = force
        self.done: set[str] = set()
        self.written = 0  # complete records in the file
        self.first: dict | None = None  # the first trace record already in the file
        self.fd: int | None = None

    def open(self) -> OutFile:
        p = self.path
        if p.is_dir():
            raise BadInput(f"{param('out')} {p} is a folder; give a file path such as "
                           f"{p}/traces.jsonl")
        if p.exists() and not p.is_file():
            raise BadInput(f"{param('out')} {p} is not a regular file")
        if not p.parent.exists():
            raise BadInput(f"{param('out')} {p}: the folder {p.parent} does not exist")
        try:
            fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as e:
            raise BadInput(f"cannot open {param('out')} {p}: {e.strerror}") from e
        try:
            lock(fd, str(p), "batch")
            self._check_and_repair(fd)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def _check_and_repair(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        if size == 0:
            return
        os.lseek(fd, 0, os.SEEK_SET)
        data = b""
        while len(data) < size:
            chunk = os.read(fd, size - len(data))
            if not chunk:
                break
            data += chunk
        complete = data[:data.rfind(b"\n") + 1]  # a kill can leave one partial last line
        records = []
        for n, raw in numbered_lines(complete):
            if not raw.strip():
                continue
            try:
                obj = loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError):
                obj = None
            if not _is_record(obj):
                if n == 1:
                    raise BadInput(f"{param('out')} {self.path} exists and is not fptrace batch "
                                   f"output; "
                                   "refusing to overwrite it: choose another path")
                raise BadInput(f"{param('out')} {self.path} line {n} is not a complete fptrace "
                               f"record; "
                               f"fix or remove that line, or pass {param('force')} to start over")
            records.append(obj)
        if not records and not data.startswith(RECORD_START):
            # a single unterminated line: ours only if it starts the way every record does
            raise BadInput(f"{param('out')} {self.path} exists and is not fptrace batch output; "
                           "refusing to overwrite it: choose another path")
        if self.force:
            os.ftruncate(fd, 0)
            return
        if len(complete) < len(data):
            os.ftruncate(fd, len(complete))
        self.done = {str(r["id"]) for r in records}
        self.written = len(records)
        self.first = next((r for r in records if r["kind"] == "trace"), None)

    def check_compatible(self, model_name: str, top_k: int, snippet: int,
                         random_weights: bool = False) -> None:
        """A resumed file must hold traces made the same way."""
        r = self.first
        if r is None:
            return
        if r.get("schema_version") != SCHEMA_VERSION:
            raise BadInput(f"{param('out')} {self.path} was written with schema version "
                           f"{r.get('schema_version')}, this fptrace writes {SCHEMA_VERSION}; "
                           f"pass {param('force')} to start over, or choose another {param('out')}")
        model = r.get("model", {})
        was = (model.get("name"), len(r.get("top_k", [])),
               len(r.get("layers", [{}])[0].get("snippet", [])), bool(model.get("random_weights")))
        if was != (model_name, top_k, snippet, random_weights):
            raise BadInput(
                f"{param('out')} {self.path} holds traces of model {was[0]}"
                + (" (random weights)" if was[3] else "") + f" with {param('top_k')} {was[1]} "
                f"{param('snippet')} {was[2]}; resume with the same options, pass "
                f"{param('force')} to start over, "
                f"or choose another {param('out')}")

    def append(self, lines: list[str]) -> None:
        """Whole lines, each in one write; then fsync, so a record is either there or not.
        A failed write (a full disk) is cut back off, so every earlier record stays intact."""
        assert self.fd is not None
        start = os.lseek(self.fd, 0, os.SEEK_END)
        try:
            for line in lines:
                data = (line + "\n").encode("utf-8")
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
            os.fsync(self.fd)
        except OSError as e:
            try:
                os.ftruncate(self.fd, start)
            except OSError:
                pass
            raise WriteFailed(
                f"writing {self.path} failed: {e.strerror or e}; the {self.written} records "
                "before it are intact: free some space and run the same command again to "
                "resume") from None
        self.written += len(lines)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock
            self.fd = None


def record_line(item: PromptItem, result: Any = None, error: str | None = None,
                error_type: str | None = None) -> str:
    """One JSON line: a trace with the prompt's id, source and extra fields, or an error."""
    from fptrace.commands.batch.result import BatchError, BatchHead
    from fptrace.render.json import to_dict

    if result is not None:
        data = to_dict(result)
        head = dataclasses.asdict(BatchHead(id=item.id, source=item.source, extra=item.extra))
        rec = {"kind": data.pop("kind"), "schema_version": data.pop("schema_version"), **head,
               **data}
    else:
        data = to_dict(BatchError(id=item.id, source=item.source, extra=item.extra,
                                  prompt=item.prompt if isinstance(item.prompt, str) else None,
                                  error=error or "",
                                  error_type=error_type or ""))
        rec = {"kind": data.pop("kind"), "schema_version": data.pop("schema_version"), **data}
    line = json.dumps(rec, ensure_ascii=False, allow_nan=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a .jsonl "\ud800" escape: keep it escaped
        line = json.dumps(rec, ensure_ascii=True, allow_nan=False)
    return line


def run_batch(lm: LoadedModel, items: list[PromptItem], out: Callable[[list[str]], None],
              done: set[str], *, batch_size: int = 8, top_k: int = 10, snippet: int = 4,
              truncate: bool = False,
              progress: Callable[[int, int], None] | None = None) -> Summary:
    """Trace every item not in `done`, `batch_size` prompts per forward pass, and hand each
    group's lines to `out` as soon as they are ready. progress(prompts, tokens) is called after
    each group. A failing prompt becomes an error record; a failing group is retried one prompt
    at a time, so one bad prompt never costs the others (core/prompt_groups.py)."""
    from fptrace.core.trace import run_traces

    s = Summary(total=len(items))
    todo = [it for it in items if it.id not in done]
    s.skipped = len(items) - len(todo)

    def traced(group: list[Encoded]) -> dict[str, str]:
        traces = run_traces(lm, [e.prepared for e in group], top_k=top_k, snippet=snippet)
        lines = {}
        for e, t in zip(group, traces):
            s.nonfinite += t.first_nonfinite is not None
            lines[e.item.id] = record_line(e.item, t)
        return lines

    def emit(chunk: list[PromptItem], results: list[dict[str, str]],
             failures: dict[str, Failure]) -> None:
        lines = {i: record_line(f.item, error=f.error, error_type=f.error_type)
                 for i, f in failures.items()}
        for r in results:
            lines.update(r)
        out([lines[it.id] for it in chunk])  # in input order

    return run_groups(lm, todo, traced, emit, summary=s, batch_size=batch_size,
                      truncate=truncate, progress=progress)


def done_ids(path: str) -> set[str]:
    """The ids already in an output file, read without locking or repairing it (the other
    ranks of a tensor-parallel batch: rank 0 owns the file)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return set()
    done = set()
    for _, raw in numbered_lines(data[:data.rfind(b"\n") + 1]):
        try:
            obj = loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if _is_record(obj):
            done.add(str(obj["id"]))
    return done


def batch_file(inputs: Sequence[str], out: str, *, load: Callable[[], LoadedModel], model_name: str,
               random_weights: bool, force: bool = False, batch_size: int = 8,
               top_k: int = 10, snippet: int = 4, truncate: bool = False,
               progress: Callable[[int], Any] | None = None,
               elsewhere: Callable[..., Summary] | None = None) -> Summary:
    """All of `fptrace batch`: read the inputs; open the output file (locked, checked against
    these options before anything is loaded, a partial last line repaired; `-` is stdout);
    load the model only when something is left to do; trace with SIGTERM turned into an
    interruption between records; close the file whatever happens.

    Under tensor parallelism every rank traces every group (the forward passes are collective)
    but only rank 0 opens and writes the file; the others read which ids are done once rank 0
    has opened (and repaired or emptied) it.

    progress(n_to_do) returns a context manager that yields a callback(prompts, tokens).
    elsewhere: traces the groups somewhere else instead of here (`batch --ray`: ray.run_on_ray
    with its cluster settings bound); it takes what run_batch takes but the model."""
    from fptrace.models import tensor_parallel as tp

    ranks, main = tp.world_size(), tp.is_main()
    items = read_inputs(inputs, exclude=out)
    sink = None if out == "-" or not main else OutFile(out, force=force).open()
    try:
        if sink is not None:
            sink.check_compatible(model_name, top_k, snippet, random_weights)
        done = sink.done if sink is not None else set()
        todo = sum(1 for it in items if it.id not in done)
        if todo == 0 and items and ranks == 1:
            return Summary(total=len(items), skipped=len(items))  # nothing to load or run
        lm = load() if elsewhere is None else None
        if ranks > 1:
            import torch.distributed as dist

            dist.barrier()  # rank 0 has opened the file; nothing is appended before all read
            if not main and out != "-":
                done = done_ids(out)

        def write(lines: list[str]) -> None:
            if sink is not None:
                sink.append(lines)
            elif lines:
                sys.stdout.write("".join(line + "\n" for line in lines))
                sys.stdout.flush()

        bar = progress(todo) if progress is not None else contextlib.nullcontext(None)
        with sigterm_interrupts(), bar as tick:
            if elsewhere is not None:
                return elsewhere(items, done, write, batch_size=batch_size, top_k=top_k,
                                 snippet=snippet, truncate=truncate, progress=tick)
            assert lm is not None  # loaded: nothing traces elsewhere
            return run_batch(lm, items, write, done, batch_size=batch_size, top_k=top_k,
                             snippet=snippet, truncate=truncate, progress=tick)
    finally:
        if sink is not None:
            sink.close()


__all__ = ["OutFile", "batch_file", "record_line", "run_batch"]
