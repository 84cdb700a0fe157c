"""The JSON contract: every result type to a plain dict, with NaN/Inf written as null.

A float that is not finite becomes `null`, and its path is listed in the top-level
`nonfinite` array (e.g. "layers[3].resid_norm_last"), so the JSON is always valid and nothing
is hidden.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from fptrace.results import SCHEMA_VERSION


def _plain(obj: Any, path: str, bad: list[str]) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name, bad)
                for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _plain(v, f"{path}.{k}" if path else str(k), bad) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v, f"{path}[{i}]", bad) for i, v in enumerate(obj)]
    if isinstance(obj, float):
        if not math.isfinite(obj):
            bad.append(path)
            return None
        return obj
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    if hasattr(obj, "tolist"):  # a numpy scalar or small array
        return _plain(obj.tolist(), path, bad)
    return str(obj)


def to_dict(result: Any) -> dict[str, Any]:
    bad: list[str] = []
    data = _plain(result, "", bad)
    data.setdefault("schema_version", SCHEMA_VERSION)
    data["nonfinite"] = bad
    return data


def to_json(result: Any, indent: int | None = 2) -> str:
    return json.dumps(to_dict(result), indent=indent, ensure_ascii=False, allow_nan=False)


# ---- the JSON Schema document (`fptrace schema`) and its Markdown rendering (docs/schema.md) ----


