"""Where a model's config and weights come from: a built-in config, a local folder, a hub id;
which weight files may be read (safetensors unless pickle is allowed) and loading them."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from fptrace.errors import (
    FptraceError,
    ModelLoadError,
    ModelNotFound,
    UnsafeModel,
    UnsupportedModel,
    param,
)
from fptrace.jsontext import loads
from fptrace.models.devices import alias_tied_offload
from fptrace.models.registry import ModelSpec

_PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def config_from_dict(d: dict[str, Any]) -> Any:
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
                             f"{short_error(e)}") from None


def read_json(path: str) -> dict[str, Any]:
    from fptrace.userfiles import read_text

    try:
        data = loads(read_text(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ModelLoadError(f"{path} is not a transformers config (no model_type)")
    return data


def load_config(spec: ModelSpec) -> Any:
    """The model's config without reading any weights."""
    if spec.known is not None:
        return config_from_dict(spec.known.config)
    if spec.kind == "folder":
        return config_from_dict(read_json(os.path.join(spec.local, "config.json")))
    if spec.kind == "gguf":
        from transformers import AutoConfig

        from fptrace.models import gguf_reader
        from fptrace.models.gguf_metadata import check, config_overrides, loader_gap, unreadable

        meta = check(spec.path) if spec.path else None
        if meta is not None and gguf_reader.reads(meta):  # transformers' loader reads none
            return gguf_reader.config(meta)
        gap = loader_gap(meta) if meta is not None else None
        if gap is not None:
            raise ModelLoadError(f"cannot read the GGUF file {spec.path}: {gap}")
        overrides = config_overrides(meta) if meta is not None else {}
        try:
            return AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(spec.local)),
                                              gguf_file=os.path.basename(spec.local), **overrides)
        except Exception as e:  # gguf raises many kinds on a bad file
            why = unreadable(meta.architecture if meta is not None else None, e)
            raise ModelLoadError(f"cannot read the GGUF file {spec.path}: {why}") from None
    return config_from_dict(read_json(hub_file(spec.repo, "config.json")))


def short_error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def hub_file(hub_id: str, filename: str) -> str:
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
            f"({short_error(e)}); use a built-in alias (`fptrace models`), a local folder or a "
            f".gguf file") from None


def check_folder_weights(folder: str, allow_pickle: bool) -> bool:
    """True when the folder's weights are safetensors; refuses pickle unless allowed."""
    if glob.glob(os.path.join(folder, "*.safetensors")):
        return True
    pickles = [p for pat in _PICKLE_PATTERNS for p in glob.glob(os.path.join(folder, pat))
               if "training_args" not in p]
    if pickles and not allow_pickle:
        raise UnsafeModel(
            f"{folder} holds only pickle weights ({os.path.basename(pickles[0])}), which can run "
            f"arbitrary code when loaded; convert them to safetensors, or pass "
            f"{param('allow_pickle')} if "
            "you trust the source")
    if not pickles:
        raise ModelNotFound(f"{folder} has config.json but no weights (model.safetensors); "
                            f"use {param('random_weights')} to trace its config with random "
                            f"weights")
    return False


def needs_remote_code(config_path: str, trust_remote_code: bool) -> bool:
    """True when the config names its own Python code (auto_map) and the user allowed it;
    refuses when they did not. The code is never imported without --trust-remote-code."""
    data = read_json(config_path)
    if "auto_map" not in data:
        return False
    if not trust_remote_code:
        raise UnsafeModel(f"{os.path.dirname(config_path)} needs its own Python code to load "
                          f"(auto_map in config.json: {', '.join(sorted(data['auto_map']))}); "
                          f"pass {param('trust_remote_code')} only if you trust its source")
    return True


def ensure_hub_weights(hub_id: str, folder: str) -> None:
    """Bring the weights of a hub repo into the cache folder of its config (safetensors only)."""
    if glob.glob(os.path.join(folder, "*.safetensors")):
        return
    for name in ("model.safetensors.index.json", "model.safetensors"):
        try:
            path = hub_file(hub_id, name)
        except ModelNotFound:
            continue
        if name.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                shards = sorted(set(json.load(f).get("weight_map", {}).values()))
            for shard in shards:
                hub_file(hub_id, shard)
        return


# transformers (5.2x, with the `kernels` package it depends on) swaps modules and functions for
# code fetched from the Hub (RMSNorm, SiLU, RoPE on CUDA) unless told not to: third-party code a
# user never agreed to run, and not the modules whose outputs fptrace hooks and recomputes
NO_HUB_KERNELS: dict[str, bool] = {"use_kernels": False}


def from_pretrained(folder: str, safe: bool, trust_remote_code: bool, dtype: Any,
                     placed: dict | None = None) -> Any:
    from transformers import AutoModelForCausalLM

    try:
        # read into memory, not mapped from the user's file: a file truncated or rewritten
        # while a pass reads a mapped weight kills the process (SIGBUS) with no line at all
        return alias_tied_offload(AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, use_safetensors=safe, trust_remote_code=trust_remote_code,
            disable_mmap=True, **NO_HUB_KERNELS, **(placed or {})))
    except FptraceError:
        raise
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise UnsafeModel(f"{folder} needs its own Python code to load; pass "
                              f"{param('trust_remote_code')} only if you trust its "
                              f"source") from None
        raise ModelLoadError(f"cannot load {folder}: {short_error(e)}") from None
    except Exception as e:
        raise ModelLoadError(f"cannot load {folder}: {short_error(e)}") from None
