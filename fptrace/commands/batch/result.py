"""The lines of `fptrace batch` output: a traced prompt's line is its trace with a head of three
fields after `schema_version` (see core.record_line); a prompt that could not be traced gets an
error line."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, result


@result
class BatchHead:
    """A line of `fptrace batch` output for a prompt that was traced: every field of a trace plus
    `id`, `source` and `extra`."""

    id: str
    """The prompt's id: the `id` of its .jsonl line, else `<file stem>:<line>`."""
    source: str
    """Where the prompt came from, as `file:line`."""
    extra: dict
    """The other fields of the prompt's .jsonl object, unchanged."""


@result
class BatchError:
    """A line of `fptrace batch` output for a prompt that could not be traced."""

    id: str
    """The prompt's id, as for a traced prompt."""
    source: str
    """Where the prompt came from, as `file:line`."""
    extra: dict
    """The other fields of the prompt's .jsonl object (empty if it did not parse)."""
    prompt: str | None
    """The prompt text, or null when the line could not be read."""
    error: str
    """What went wrong, in one line, naming the file and line for input errors."""
    error_type: str
    """The error's class (BadInput, TraceFailed, ...)."""
    kind: str = "error"
    schema_version: str = SCHEMA_VERSION


# `fptrace schema`: BatchHead is generated with the kinds (not one itself); schema_kinds then
# adds the traced line, a trace with the head's fields after schema_version
SCHEMA_PARTS = (BatchHead,)


def schema_kinds(defs: dict) -> dict:
    """The kinds this module adds to the schema's definitions, built from them."""
    head = defs.pop("BatchHead")
    trace = defs["Trace"]["properties"]
    at = list(trace).index("schema_version") + 1
    names = list(trace)
    props = {k: trace[k] for k in names[:at]} | head["properties"] | \
        {k: trace[k] for k in names[at:]}
    return {"BatchTrace": {"type": "object", "description": head["description"],
                           "properties": props, "required": list(props),
                           "additionalProperties": False}}
