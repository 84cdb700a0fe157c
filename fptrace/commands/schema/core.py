"""The JSON contract: one JSON Schema (draft 2020-12) for every JSON output, and its Markdown
rendering (docs/schema.md), both generated from the result types themselves.

The top-level kinds are found, not listed: every result type with a `kind` field in
results.py and in each commands/<name>/result.py; a result module may also add types generated
with them (SCHEMA_PARTS) and kinds composed from their definitions (schema_kinds). pydantic reads each type's fields, their
type hints and the docstring under each field (the `@result` decorator asks for that); this
module then states what the JSON writer guarantees (render/json.py): every field is always
written (required, nothing else allowed), a float that is NaN or infinite is written as null,
and a top-level object lists those in `nonfinite`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any

from fptrace.results import SCHEMA_VERSION

# the fields every top-level kind has, described once
COMMON = {
    "kind": "Which output this is (its value names the kind).",
    "schema_version": "Version of this contract: the minor number grows when fields or kinds "
                      "are added, the major number when a field changes or goes.",
    "nonfinite": "Paths (e.g. `layers[3].resid_norm_last`) of the floats that were NaN or "
                 "infinite and are written as null.",
}


def result_modules() -> list[Any]:
    """results.py and every commands/<name>/result.py."""
    from fptrace.extensions import parts

    return [importlib.import_module("fptrace.results")] + [m for _, m in parts("result")]


def top_level() -> list[type]:
    """The result types a command writes as JSON: those with a `kind`, in the order their
    modules and definitions give (core first, then the commands by name)."""
    out = []
    for module in result_modules():
        for obj in vars(module).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and \
                    obj.__module__ == module.__name__ and \
                    any(f.name == "kind" for f in dataclasses.fields(obj)):
                out.append(obj)
    return out


def check_targets() -> str:
    """What Check.target can be: the CHECK_TARGETS of every command's result module, in the
    order of `fptrace --help`."""
    from fptrace.cli.io import command_order
    from fptrace.extensions import declared

    found = sorted(declared("result", "CHECK_TARGETS"), key=lambda d: command_order(d[0]))
    return "Which check: " + "; ".join(str(text) for _, text in found) + "."


def _walk(node: Any, fn: Any) -> Any:
    if isinstance(node, dict):
        return fn({k: _walk(v, fn) for k, v in node.items()})
    if isinstance(node, list):
        return [_walk(v, fn) for v in node]
    return node


def _plain(node: dict) -> dict:
    """pydantic's schema, as the JSON writer writes: no titles or defaults; a number may be
    null (NaN and Inf are written as null)."""
    node = {k: v for k, v in node.items() if k not in ("title", "default")}
    if isinstance(node.get("description"), str):  # a docstring's line breaks
        node["description"] = " ".join(node["description"].split())
    if node.get("type") == "number":
        node["type"] = ["number", "null"]
    if "anyOf" in node:
        kinds = node["anyOf"]
        if {"type": "null"} in kinds and any(k.get("type") == ["number", "null"] for k in kinds):
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            node = {**rest, "type": ["number", "null"]}
    return node


def _closed(name: str, obj: dict, cls: type | None) -> dict:
    """Every property required (the writer always writes every field), no other property;
    `kind` a constant; the common fields described once."""
    props = obj.get("properties", {})
    fields = {f.name: f for f in dataclasses.fields(cls)} if cls is not None else {}
    for key, prop in props.items():
        if key == "kind" and key in fields:
            props[key] = {"const": fields[key].default}
        if key in COMMON and not prop.get("description"):
            props[key]["description"] = COMMON[key]
    obj["required"] = list(props)
    obj["additionalProperties"] = False
    return obj


def json_schema() -> dict[str, Any]:
    """One JSON Schema (2020-12) for every JSON output of fptrace, generated from the result
    types so it cannot drift from them."""
    from pydantic import TypeAdapter

    kinds = top_level()
    parts = [cls for module in result_modules() for cls in getattr(module, "SCHEMA_PARTS", ())]
    mapping, defs = TypeAdapter.json_schemas(
        [(cls.__name__, "serialization", TypeAdapter(cls)) for cls in kinds + parts],
        ref_template="#/$defs/{model}")
    defs = defs.get("$defs", {})
    every = {cls.__name__: cls for module in result_modules() for cls in vars(module).values()
             if isinstance(cls, type) and dataclasses.is_dataclass(cls)}
    defs = {name: _closed(name, _walk(d, _plain), every.get(name)) for name, d in defs.items()}
    defs["Check"]["properties"]["target"]["description"] = check_targets()
    for cls in kinds:
        defs[cls.__name__]["properties"]["nonfinite"] = {
            "type": "array", "items": {"type": "string"}, "description": COMMON["nonfinite"]}
        defs[cls.__name__]["required"] = list(defs[cls.__name__]["properties"])
    # kinds a result module composes from these definitions (schema_kinds), after the others
    order = [cls.__name__ for cls in kinds]
    for module in result_modules():
        if hasattr(module, "schema_kinds"):
            added = module.schema_kinds(defs)
            defs.update(added)
            order += list(added)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:fptrace:schema:{SCHEMA_VERSION}",
        "title": f"fptrace JSON output, schema version {SCHEMA_VERSION}",
        "description": "Every object fptrace writes as JSON: the --json output of every command "
                       "and each line of batch output.",
        "oneOf": [{"$ref": f"#/$defs/{name}"} for name in order],
        "$defs": {name: defs[name] for name in order + sorted(set(defs) - set(order))},
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
    """docs/schema.md: every type and field of the contract (generated by `fptrace schema
    --markdown`; a test keeps it current)."""
    doc = json_schema()
    top = [ref["$ref"].rsplit("/", 1)[1] for ref in doc["oneOf"]]
    out = [f"# The fptrace JSON contract (schema version {SCHEMA_VERSION})", "",
           "Generated by `fptrace schema --markdown` from the result types (each field's text "
           "is the docstring under the field); `fptrace schema` prints the same contract as a "
           "JSON Schema document (draft 2020-12). Every float that is NaN or infinite is "
           "written as `null` and its path is listed in the top-level `nonfinite` array, so "
           "the output is always valid JSON. The minor version grows when fields or kinds are "
           "added, the major version when a field changes meaning or goes.", "",
           "Top-level objects: " + ", ".join(f"[{n}](#{n.lower()})" for n in top) + ".", ""]
    for name in top + sorted(n for n in doc["$defs"] if n not in top):
        d = doc["$defs"][name]
        out += [f"## {name}", "", " ".join(d["description"].split()), "",
                "| field | type | meaning |", "|---|---|---|"]
        for key, prop in d["properties"].items():
            meaning = " ".join(prop.get("description", "").split()).replace("|", "\\|")
            out.append(f"| `{key}` | {_type_name(prop).replace('|', '/')} | {meaning} |")
        out.append("")
    return "\n".join(out)


def schema_text(markdown_page: bool = False) -> str:
    """What `fptrace schema` prints: the JSON Schema document, or the Markdown page."""
    if markdown_page:
        return markdown()
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
