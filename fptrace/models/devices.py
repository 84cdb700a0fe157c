"""Where a model runs: the device and dtype, and Accelerate's device maps (blocks spread over
GPUs, CPU RAM and disk), with a memory estimate before a load that cannot fit."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fptrace.errors import BadInput, param
from fptrace.numbers import DIGITS, is_int, parse_float, parse_int

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

Progress = Callable[[str], None]

def placement(model: Any, blocks_path: str) -> tuple[str, ...]:
    dm = getattr(model, "hf_device_map", None)
    if not dm or (len(set(dm.values())) <= 1 and "disk" not in dm.values()):
        return ()

    def where(v: Any) -> str:
        return f"cuda:{v}" if isinstance(v, int) else str(v)

    prefix = blocks_path + "."
    rows: list[list] = []  # [first, last, device]
    others: dict[str, list[str]] = {}
    for name, dev in dm.items():
        block = _BLOCK.match(name[len(prefix):]) if name.startswith(prefix) else None
        if block is not None:
            i = int(block.group(1))
            if rows and rows[-1][2] == where(dev) and rows[-1][1] == i - 1:
                rows[-1][1] = i
            elif not (rows and rows[-1][1] >= i):
                rows.append([i, i, where(dev)])
        else:
            others.setdefault(where(dev), []).append(name.rsplit(".", 1)[-1] or "everything")
    out = [(f"block {a}" if a == b else f"blocks {a}–{b}") + f": {d}" for a, b, d in rows]
    out += [f"{', '.join(names)}: {d}" for d, names in others.items()]
    return tuple(out)


_BLOCK = re.compile(r"([0-9]+)(?:\.|$)")  # a device map's name under the blocks: "3.mlp"
_MEM = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE | re.ASCII)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str, what: str) -> int:
    """'80GiB' -> bytes (B, KB, MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB of 1024): a
    whole number of bytes, at least one."""
    m = _MEM.match(text or "")
    if not m:
        raise BadInput(f"{what} {text!r}: a size such as 80GiB, 40GB or 24GiB")
    unit = (m.group(2) or "").lower()
    number = parse_float(m.group(1), what)
    if number * _UNITS[unit] < 1 or (_UNITS[unit] == 1 and not number.is_integer()):
        raise BadInput(f"{what} {text!r}: a size of at least one byte, in whole bytes (such "
                       "as 80GiB, 40GB or 24GiB)")
    return int(number * _UNITS[unit])


def parse_max_memory(text: str | None) -> dict | None:
    """'0=70GiB,1=70GiB,cpu=200GiB' -> {0: '70GiB', 1: '70GiB', 'cpu': '200GiB'}."""
    if text is None or not text.strip():
        return None
    out: dict = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not key or not _MEM.match(value):
            raise BadInput(f"{param('max_memory')} {text!r}: expected DEVICE=SIZE pairs separated "
                           f"by commas, "
                           "e.g. 0=70GiB,1=70GiB,cpu=200GiB (sizes in B, KB, MB, GB, KiB, MiB, "
                           "GiB, ...)")
        device: int | str = key
        if is_int(key) or DIGITS.fullmatch(key):  # a GPU number, in ASCII or refused by name
            device = parse_int(key, f"{param('max_memory')}: the GPU number", low=0)
        elif key not in ("cpu", "mps", "disk"):
            raise BadInput(f"{param('max_memory')}: unknown device {key!r}; use GPU numbers (0, "
                           f"1, ...), "
                           "cpu or mps")
        size = _MEM.match(value)
        out[device] = int(float(value)) if size is not None and size.group(2) is None \
            else value.replace(" ", "")
    return out


DTYPES = ("auto", "float32", "bfloat16", "float16")


def pick_device(device: str) -> torch.device:
    import torch

    device = device.strip().lower()
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda:0")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise BadInput(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BadInput(f"{param('device')} {device}: no CUDA GPU is visible here; use "
                           f"{param('device')} cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BadInput(f"{param('device')} {device}: only {torch.cuda.device_count()} CUDA "
                           f"device(s)")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise BadInput(f"{param('device')} mps: no Apple GPU is available here; use "
                           f"{param('device')} cpu")
    elif dev.type != "cpu":
        raise BadInput(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps")
    return dev


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    import torch

    dtype = dtype.strip().lower()
    if dtype not in DTYPES:
        raise BadInput(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, dtype)


def placed_options(device_map: str | None, max_memory: str | None, offload_folder: str | None
            ) -> dict | None:
    """from_pretrained arguments for Accelerate's big-model inference, or None."""
    if device_map is None:
        if max_memory or offload_folder:
            raise BadInput(f"{param('max_memory')} and {param('offload_folder')} go with "
                           f"{param('device_map')} auto")
        return None
    if device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
        raise BadInput(f"{param('device_map')} {device_map!r}: use auto (or balanced, "
                       f"balanced_low_0, "
                       "sequential)")
    if offload_folder is None:
        offload_folder = tempfile.mkdtemp(prefix="fptrace-offload-")
        import atexit

        atexit.register(shutil.rmtree, offload_folder, True)
    elif not os.path.isdir(offload_folder):
        try:
            os.makedirs(offload_folder, exist_ok=True)
        except OSError as e:
            raise BadInput(f"{param('offload_folder')} {offload_folder}: {e.strerror}") from None
    return {"device_map": device_map, "max_memory": parse_max_memory(max_memory),
            "offload_folder": offload_folder}


def alias_tied_offload(model: Any) -> Any:
    """Accelerate's disk-offload index knows a tied weight (the embedding and the LM head) only
    under the name the checkpoint stored it by; the other module then fails with a KeyError when
    it loads its weights. Give the index every name of each tied parameter."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    tied = [names for names in groups.values() if len(names) > 1]
    if not tied:
        return model
    indexes = {}
    for module in model.modules():
        wm = getattr(getattr(module, "_hf_hook", None), "weights_map", None)
        index = getattr(getattr(wm, "dataset", wm), "index", None)
        if isinstance(index, dict):
            indexes[id(index)] = index
    for index in indexes.values():
        for names in tied:
            stored = next((n for n in names if n in index), None)
            for n in names:
                if stored is not None and n not in index:
                    index[n] = index[stored]
    return model


def dispatch(model: Any, placed: dict) -> Any:
    """Spread a model that is already in memory (random weights) as from_pretrained would."""
    from accelerate import dispatch_model, infer_auto_device_map

    dm = infer_auto_device_map(model, max_memory=placed["max_memory"],
                               no_split_module_classes=getattr(model, "_no_split_modules", None))
    model = dispatch_model(model, device_map=dm, offload_dir=placed["offload_folder"])
    model.hf_device_map = dm
    return model


def estimate(config: PretrainedConfig, dtype: Any, device: Any, placed: dict | None,
              progress: Progress) -> None:
    """Before loading: the weights' size from a meta-device model of the config; a clear error
    (not an out-of-memory crash) when they cannot fit the device and no device map spreads
    them."""
    import torch
    from transformers import AutoModelForCausalLM

    from fptrace.models.memory import available_bytes, check_fits, human_bytes

    try:
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(config)
    except Exception:
        return  # an unusual config: from_pretrained will say what is wrong
    needed = sum(p.numel() for p in meta.parameters()) * torch.empty((), dtype=dtype).element_size()
    free = available_bytes(device)
    progress(f"the weights need about {human_bytes(needed)} in {str(dtype)[6:]}"
             + (f"; {human_bytes(free)} free on {device}" if free is not None else ""))
    if placed is None:
        check_fits(needed, device, "the weights")
