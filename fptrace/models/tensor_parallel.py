"""Models too big for one device: transformers' own tensor parallelism (DistributedConfig, the
model's tp plan, sharded DTensor weights), one process per rank, launched by torchrun.

`torchrun --nproc-per-node N -m fptrace run PROMPT` shards the model over the ranks: fptrace
sees WORLD_SIZE > 1 and loads through DistributedConfig(tp_size=WORLD_SIZE). `fptrace run
PROMPT --tp N` starts the N processes itself through torch's launcher. The block outputs are
replicated after each all-reduce, so the hooks see the whole residual stream on every rank;
only rank 0 prints and writes. Backend: NCCL on GPUs, gloo on CPU (transformers picks it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fptrace.errors import BadInput, param

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def world_size() -> int:
    """The number of ranks this process runs among (1 outside torchrun)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def is_main() -> bool:
    return rank() == 0


def check(config: PretrainedConfig, n: int, *, device_map: str | None = None,
          random_weights: bool = False) -> None:
    """Before loading anything: can this config be split over n ranks?"""
    if device_map is not None:
        raise BadInput(f"{param('tp')} (or torchrun) shards the model over processes; "
                       f"{param('device_map')} "
                       "spreads it within one: use one of them")
    if random_weights:
        raise BadInput("tensor parallelism loads saved weights; save the random-weight model "
                       "first (model.save_pretrained) and pass its folder")
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        raise BadInput(f"transformers has no tensor-parallel plan for model type "
                       f"{config.model_type!r}; run it in one process (or {param('device_map')} "
                       f"auto)")
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % n or kv % n:
        raise BadInput(f"{param('tp')} {n}: the model's {heads} attention heads and {kv} "
                       f"key/value heads "
                       f"must both divide by {n}; use a divisor of both (e.g. "
                       f"{_divisors(heads, kv)})")


def _divisors(heads: int, kv: int) -> str:
    ok = [d for d in range(1, min(heads, kv) + 1) if heads % d == 0 and kv % d == 0]
    return ", ".join(str(d) for d in ok[-4:])


def from_pretrained_options(n: int) -> dict:
    from transformers.distributed import DistributedConfig

    return {"distributed_config": DistributedConfig(tp_size=n)}


def full(t: Any) -> Any:
    """A sharded DTensor's whole value (every rank gets it); a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def launch(n: int, args: Sequence[str]) -> int:
    """Run `fptrace ARGS` as n ranks on this machine through torch's launcher (torchrun
    --standalone: a rendezvous on localhost); the exit code of the launch."""
    if n < 2:
        raise BadInput(f"{param('tp')} must be at least 2 (1 is the ordinary single process)")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={n}", "-m", "fptrace", *args]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    return subprocess.run(cmd, env=env).returncode


def strip_tp(argv: Sequence[str]) -> tuple[int | None, list[str]]:
    """(N, argv without --tp N) from a command line."""
    out, n, i = [], None, 0
    argv = list(argv)
    while i < len(argv):
        a = argv[i]
        if a == "--tp" and i + 1 < len(argv):
            n, i = argv[i + 1], i + 2
            continue
        if a.startswith("--tp="):
            n, i = a.split("=", 1)[1], i + 1
            continue
        out.append(a)
        i += 1
    if n is None:
        return None, out
    try:
        return int(n), out
    except ValueError:
        raise BadInput(f"{param('tp')} {n!r}: a whole number of processes") from None
