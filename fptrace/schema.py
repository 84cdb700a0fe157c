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

from .results import SCHEMA_VERSION


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

TOP_LEVEL = ("Trace", "ShapeReport", "Explanation", "Generation", "Attribution", "TraceDiff",
             "PatchResult", "ModelList", "BatchTrace",
             "BatchError")


def _result_types() -> dict[str, type]:
    from . import results

    return {name: obj for name, obj in vars(results).items()
            if isinstance(obj, type) and dataclasses.is_dataclass(obj)}


def _type_schema(tp: Any) -> dict[str, Any]:
    import types
    import typing

    origin = typing.get_origin(tp)
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:  # NaN and Inf are written as null (and listed in `nonfinite`)
        return {"type": ["number", "null"]}
    if tp is str:
        return {"type": "string"}
    if tp is dict or origin is dict:
        return {"type": "object"}
    if tp is tuple:
        return {"type": "array"}
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _type_schema(args[0])}
        return {"type": "array", "prefixItems": [_type_schema(a) for a in args]}
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = _type_schema(args[0]) if len(args) == 1 else {
            "anyOf": [_type_schema(a) for a in args]}
        if inner.get("type") == ["number", "null"]:
            return inner
        return {"anyOf": [inner, {"type": "null"}]}
    if dataclasses.is_dataclass(tp):
        return {"$ref": f"#/$defs/{tp.__name__}"}
    raise TypeError(f"no JSON Schema type for {tp!r}")


def _object(name: str, cls: type, top: bool) -> dict[str, Any]:
    import typing

    from .schema_fields import COMMON, FIELDS, TYPES

    hints = typing.get_type_hints(cls)
    props: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "kind":
            prop: dict[str, Any] = {"const": f.default}
        else:
            prop = _type_schema(hints[f.name])
        desc = FIELDS.get(name, {}).get(f.name) or COMMON.get(f.name)
        if desc is None:
            raise KeyError(f"{name}.{f.name} has no description in schema_fields.py")
        props[f.name] = {**prop, "description": desc}
    if top:
        props["nonfinite"] = {"type": "array", "items": {"type": "string"},
                              "description": COMMON["nonfinite"]}
    return {"type": "object", "description": TYPES[name], "properties": props,
            "required": list(props), "additionalProperties": False}


def json_schema() -> dict[str, Any]:
    """One JSON Schema (2020-12) for every JSON output of fptrace, generated from the result
    types so it cannot drift from them."""
    from .schema_fields import COMMON, FIELDS, TYPES

    types_ = _result_types()
    defs = {name: _object(name, cls, name in TOP_LEVEL) for name, cls in sorted(types_.items())}
    trace = defs["Trace"]
    batch_trace = {"type": "object", "description": TYPES["BatchTrace"],
                   "properties": dict(trace["properties"]), "additionalProperties": False}
    for key, typ in (("id", {"type": "string"}), ("source", {"type": "string"}),
                     ("extra", {"type": "object"})):
        batch_trace["properties"][key] = {**typ, "description": FIELDS["BatchTrace"][key]}
    batch_trace["required"] = list(batch_trace["properties"])
    defs["BatchTrace"] = batch_trace
    err_props: dict[str, Any] = {
        "kind": {"const": "error", "description": COMMON["kind"]},
        "schema_version": {"type": "string", "description": COMMON["schema_version"]},
        "id": {"type": "string"}, "source": {"type": "string"}, "extra": {"type": "object"},
        "prompt": {"type": ["string", "null"]}, "error": {"type": "string"},
        "error_type": {"type": "string"},
        "nonfinite": {"type": "array", "items": {"type": "string"}},
    }
    for key, prop in err_props.items():
        prop.setdefault("description", FIELDS["BatchError"].get(key) or COMMON.get(key))
    defs["BatchError"] = {"type": "object", "description": TYPES["BatchError"],
                          "properties": err_props, "required": list(err_props),
                          "additionalProperties": False}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:fptrace:schema:{SCHEMA_VERSION}",
        "title": f"fptrace JSON output, schema version {SCHEMA_VERSION}",
        "description": "Every object fptrace writes as JSON: run, shapes, explain, generate and "
                       "models --json, and each line of batch output.",
        "oneOf": [{"$ref": f"#/$defs/{name}"} for name in TOP_LEVEL],
        "$defs": defs,
    }


def _type_name(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[1]
    if "const" in prop:
        return f'"{prop["const"]}"'
    if "anyOf" in prop:
        return " or ".join(_type_name(p) for p in prop["anyOf"])
    t = prop.get("type")
    if t == "array":
        if "items" in prop:
            return f"array of {_type_name(prop['items'])}"
        if "prefixItems" in prop:
            return "[" + ", ".join(_type_name(p) for p in prop["prefixItems"]) + "]"
        return "array"
    if isinstance(t, list):
        return " or ".join("number (null if NaN/Inf)" if x == "number" else x for x in t
                           if not (x == "null" and "number" in t))
    return str(t)


def markdown() -> str:
    """docs/schema.md: every type and field of the contract (generated; a test keeps it
    current)."""
    doc = json_schema()
    out = [f"# The fptrace JSON contract (schema version {SCHEMA_VERSION})", "",
           "Generated by `python -m fptrace.schema --markdown` from the result types; "
           "`fptrace schema` prints the same contract as a JSON Schema document "
           "(draft 2020-12). Every float that is NaN or infinite is written as `null` and its "
           "path is listed in the top-level `nonfinite` array, so the output is always valid "
           "JSON. The minor version grows when fields or kinds are added, the major version "
           "when a field changes meaning or goes.", "",
           "Top-level objects: " + ", ".join(f"[{n}](#{n.lower()})" for n in TOP_LEVEL) + ".",
           ""]
    names = list(TOP_LEVEL) + sorted(n for n in doc["$defs"] if n not in TOP_LEVEL)
    for name in names:
        d = doc["$defs"][name]
        out += [f"## {name}", "", d["description"], "", "| field | type | meaning |",
                "|---|---|---|"]
        for key, prop in d["properties"].items():
            meaning = prop.get("description", "").replace("|", "\\|")
            out.append(f"| `{key}` | {_type_name(prop).replace('|', '/')} | {meaning} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--markdown"]:
        sys.stdout.write(markdown())
    else:
        sys.stdout.write(json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n")
