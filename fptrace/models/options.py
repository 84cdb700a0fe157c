"""How to load a model, as one object: every command and the Python API pass this around
instead of ten separate arguments."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from fptrace.models.registry import DEFAULT_MODEL

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel


@dataclass(frozen=True)
class LoadOptions:
    model: str = DEFAULT_MODEL  # an alias, a .gguf file, a folder or a hub id
    random_weights: bool = False
    seed: int = 0  # of the random weights (and of a command's sampling)
    device: str = "auto"
    dtype: str = "auto"
    allow_pickle: bool = False
    trust_remote_code: bool = False
    device_map: str | None = None  # "auto": Accelerate spreads the model over GPUs, CPU, disk
    max_memory: str | None = None  # "0=70GiB,cpu=200GiB"
    offload_folder: str | None = None
    tp: int | None = None  # --tp N: shard over N processes on this machine (torch's launcher)
    quantize: str | None = None  # "int8" / "int4": torchao weight-only, on load

    def load(self, progress: Callable[[str], None] | None = None) -> LoadedModel:
        """The LoadedModel these options describe."""
        from fptrace.models import resident
        from fptrace.models.loading import load_model

        args = asdict(self)
        name = args.pop("model")
        args.pop("tp")  # the launcher's business (cli.load); each rank loads its shard
        key = resident.key_of(self) if resident.holding() else None
        held = resident.loaded(key) if key is not None else None
        if held is not None:  # a resident server loaded it before, the same way
            if progress:
                progress(f"{held.name}: held by the server")
            return held
        t0 = time.perf_counter()
        lm = load_model(name, **args, **({"progress": progress} if progress else {}))
        if key is not None:
            refused = resident.keep(key, lm, time.perf_counter() - t0)
            if refused and progress:
                progress(refused)
        return lm
