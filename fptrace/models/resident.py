"""Models held in memory by a resident server (commands/serve/), one per way of loading them.

A server process calls `hold(budget)` once; from then on `LoadOptions.load` asks `loaded()` for
a model loaded before with the same options (model, device, dtype, and every other load option,
the model's files unchanged on disk), and gives a new one to `keep()`. Several are held up to a
memory budget; the least recently used go first. In any other process nothing is held and every
load is a fresh one.

A held model must be what a fresh load gives, or the server would answer with other numbers than
the command computes by itself. Commands restore what they change (hooks removed, the attention
implementation switched back), and `sweep()`, after every request, checks that they did: any
change to a parameter or buffer (torch's version counters), a hook left on a module, a module
left in training mode or another attention implementation drops the model, and the next request
loads it afresh.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel


@dataclass
class Held:
    key: tuple
    lm: LoadedModel
    nbytes: int
    seal: tuple
    loaded_at: float = field(default_factory=time.time)
    load_seconds: float = 0.0
    uses: int = 0


_held: OrderedDict[tuple, Held] = OrderedDict()
_budget: dict[str, int | None] = {"bytes": None}


def hold(budget: int | None) -> None:
    """From now on, keep loaded models (up to `budget` bytes of weights) in this process
    (None: hold none from now on)."""
    _budget["bytes"] = budget


def holding() -> bool:
    return _budget["bytes"] is not None


def key_of(opts: Any) -> tuple:
    """What makes two loads the same: every load option but --tp, and the model's files as
    they are on disk now (a file rewritten since is loaded again)."""
    from fptrace.models.registry import resolve

    args = asdict(opts)
    args.pop("tp", None)
    name = args.pop("model")
    spec = resolve(name)
    files: tuple = ()
    if spec.path:
        path = os.path.abspath(spec.path)
        names = [path] if os.path.isfile(path) else sorted(
            os.path.join(path, f) for f in os.listdir(path))
        stats = ((f, os.stat(f)) for f in names if os.path.isfile(f))
        files = tuple((f, st.st_size, st.st_mtime_ns) for f, st in stats)
    if args.get("offload_folder"):
        args["offload_folder"] = os.path.abspath(args["offload_folder"])
    return (spec.name, spec.kind, getattr(spec, "hub_id", None), files,
            tuple(sorted(args.items())))


def loaded(key: tuple) -> LoadedModel | None:
    """The model held for `key`, or None."""
    held = _held.get(key)
    if held is None:
        return None
    _held.move_to_end(key)
    held.uses += 1
    return held.lm


def keep(key: tuple, lm: LoadedModel, load_seconds: float) -> str | None:
    """Hold `lm` for later requests, letting the least recently used go to stay within the
    budget; a line to show where it cannot be held (it alone is over the budget)."""
    from fptrace.models.memory import human_bytes

    budget = _budget["bytes"]
    if budget is None:
        return None
    nbytes = weight_bytes(lm.model)
    if nbytes > budget:
        return (f"not holding {lm.name} ({human_bytes(nbytes)}): over the server's memory "
                f"budget of {human_bytes(budget)}")
    while _held and sum(h.nbytes for h in _held.values()) + nbytes > budget:
        _held.popitem(last=False)
    _held[key] = Held(key, lm, nbytes, seal(lm), load_seconds=load_seconds, uses=1)
    return None


def sweep() -> list[str]:
    """Drop every held model a request changed; the names of those dropped."""
    dropped = []
    for key, held in list(_held.items()):
        if seal(held.lm) != held.seal:
            del _held[key]
            dropped.append(held.lm.name)
    if dropped:
        import gc

        gc.collect()
    return dropped


def release() -> None:
    _held.clear()


def weight_bytes(model: Any) -> int:
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def seal(lm: LoadedModel) -> tuple:
    """What a request must leave as it found it: the tensors' version counters (bumped by any
    in-place change), the hooks, the training flags, the attention implementation and the
    LoadedModel's own fields."""
    model = lm.model
    versions = sum(t._version for t in [*model.parameters(), *model.buffers()])
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                + len(getattr(m, "_backward_pre_hooks", {})) for m in model.modules())
    training = sum(m.training for m in model.modules())
    attn = getattr(model.config, "_attn_implementation", None)
    fields = tuple((k, id(v)) for k, v in vars(lm).items() if k != "info")
    return versions, hooks, training, attn, fields


def status() -> list[dict]:
    """The held models, most recently used last."""
    held = list(_held.values())  # a copy: asked from the server's receiving thread
    return [{"model": h.lm.name, "options": dict(h.key[-1]), "bytes": h.nbytes,
             "loaded_at": h.loaded_at, "load_seconds": round(h.load_seconds, 2),
             "uses": h.uses} for h in held]


__all__ = ["Held", "hold", "holding", "keep", "key_of", "loaded", "release", "seal", "status",
           "sweep", "weight_bytes"]
