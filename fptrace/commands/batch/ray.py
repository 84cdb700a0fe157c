"""Many prompts on a Ray cluster: `fptrace batch INPUTS --out F --ray auto|ADDRESS`.

The actor pool is models/ray_pool.py's: each actor loads the model once and traces each group
it is handed with the same batched tracer as a local batch (`run_batch`); the records stream
back to the driver in input order, which writes them through the same resumable writer. When a
group keeps failing, the batch stops there with every finished record written, and rerunning the
command finishes the rest.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from fptrace.commands.batch.core import run_batch
from fptrace.core.inputs import PromptItem, prompt_from_json, prompt_to_json
from fptrace.core.prompt_groups import Summary

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel


def trace_block(lm: LoadedModel, block: dict, *, top_k: int, snippet: int, truncate: bool) -> dict:
    """On an actor: trace one group of rows (see run_on_ray) into its lines."""
    items = [PromptItem(id=i, source=s, prompt=prompt_from_json(p), extra=json.loads(e),
                        error=err or None)
             for i, s, p, e, err in zip(block["id"], block["source"], block["prompt"],
                                        block["extra"], block["error"])]
    lines: list[str] = []
    summary = run_batch(lm, items, lines.extend, set(), batch_size=len(items), top_k=top_k,
                        snippet=snippet, truncate=truncate)
    pad = [0] * (len(lines) - 1)
    return {"line": lines, "traced": [summary.traced] + pad, "failed": [summary.failed] + pad,
            "tokens": [summary.tokens] + pad}


def run_on_ray(items: list[PromptItem], done: set[str], write: Callable[[list[str]], None], *,
               address: str, workers: int, gpus_per_worker: float | None, load: dict,
               batch_size: int, top_k: int, snippet: int, truncate: bool,
               progress: Callable[[int, int], None] | None = None) -> Summary:
    """Trace every item not in `done` on the cluster; hand each group's lines to `write` in
    input order."""
    import time

    from fptrace.models.ray_pool import ray_map

    todo = [it for it in items if it.id not in done]
    s = Summary(total=len(items), skipped=len(items) - len(todo))
    rows = [{"id": it.id, "source": it.source, "prompt": prompt_to_json(it.prompt),
             "extra": json.dumps(it.extra), "error": it.error or ""} for it in todo]
    start = time.perf_counter()
    written = 0
    try:
        for block in ray_map(rows, trace_block, address=address, workers=workers,
                             gpus_per_worker=gpus_per_worker, load=load,
                             settings={"top_k": top_k, "snippet": snippet,
                                       "truncate": truncate},
                             rows_per_call=batch_size,
                             kept=lambda: f"{written} of {len(todo)} records were written and "
                                          "are kept: rerun the same command to finish the rest"):
            lines = list(block["line"])
            write(lines)
            written += len(lines)
            s.traced += int(sum(block["traced"]))
            s.failed += int(sum(block["failed"]))
            s.tokens += int(sum(block["tokens"]))
            if progress is not None:
                progress(len(lines), int(sum(block["tokens"])))
    except KeyboardInterrupt:
        s.interrupted = True
    finally:
        s.seconds = time.perf_counter() - start
    return s


__all__ = ["run_on_ray", "trace_block"]
