"""Every sentence fptrace says about a run, each with the condition that makes it say it: the
Note type, the notes several commands print, and the collection of all of them.

A note is a claim about the run at hand, phrased as what was measured (the position, the token,
the value), never a general law. The code that emits a note calls its entry, e.g.
`TRUNCATED(n=3)`; nothing else writes a note. A note that one command prints lives in that
command's folder (commands/<name>/notes.py); those that the shared engine prints (core/, models/,
results.py) live here. NOTES collects them all, this file's first, then each command folder's in
the order of the folders' names: docs/notes.md is generated from it (`python
scripts/notes_doc.py`; a test fails when it is stale) and tests/test_notes.py runs, for every
entry, a case where its condition does not hold and checks that the note is absent (a command's
cases live beside its notes, in its examples.py; a new entry without one fails that test).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Note:
    key: str  # a stable name
    commands: tuple[str, ...]  # the commands that can print it
    when: str  # the condition under which it is printed, for docs/notes.md
    text: str  # the sentence, with {fields} filled from the run

    def __call__(self, **values: object) -> str:
        return self.text.format(**values)

    def pattern(self) -> re.Pattern:
        """The note with its fields filled with anything."""
        parts = re.split(r"\{[^}]*\}", self.text)
        return re.compile(".+?".join(re.escape(p) for p in parts), re.S)

    def matches(self, sentence: str) -> bool:
        """Whether a printed sentence is this note."""
        return self.pattern().fullmatch(sentence) is not None


def note(key: str, commands: tuple[str, ...], when: str, text: str) -> Note:
    """A note entry; the module that defines it is what registers it (see collect)."""
    return Note(key, commands, when, text)


TRACING = ("run", "batch", "diff", "report", "tui")

RANDOM = note(
    "random_weights", TRACING + ("explain", "attribute", "patch", "generate", "steer", "ablate"),
    "the model was built with --random-weights",
    "RANDOM WEIGHTS: the predictions and logit-lens tokens of this trace mean nothing")

WITHHELD = note(
    "decomposition_withheld", TRACING + ("generate",),
    "at some block, what the attention and MLP modules output does not add up to what the block "
    "added to the stream (beyond the dtype's rounding)",
    "‖attn‖ and ‖mlp‖ withheld for {blocks}: what the attention and MLP modules output does not "
    "add up to what the block added to the stream{measured}; the other columns are exact")

TRUNCATED = note(
    "truncated", TRACING,
    "--truncate removed tokens from the start of a prompt longer than the context window",
    "--truncate dropped the first {n} tokens")

TIED_LENS_LAST = note(
    "tied_lens_last", TRACING,
    "the LM head is tied to the embedding and, at the last position, the embedding row's "
    "logit-lens top-1 is the input token itself (no lens grid computed)",
    "at the last position, the embedding row's logit-lens top-1 is the input token itself "
    "({token}, p {p:.3f}); the LM head is tied, W_U = W_E; that row says nothing about the next "
    "token")

TIED_LENS_GRID = note(
    "tied_lens_grid", TRACING,
    "the LM head is tied to the embedding and, with the lens grid (--plot, report), the "
    "embedding row's top-1 is the input token itself at one position or more",
    "at {k} of {n} positions the embedding row's logit-lens top-1 is the input token itself; "
    "the LM head is tied, W_U = W_E")

MASSIVE = note(
    "massive_activation", TRACING,
    "in some rows, one position's ‖resid‖ is more than 10 times the last position's (the note "
    "names every row where that holds)",
    "in {where}, position {position} ({token}) has a far larger ‖resid‖ than the others (at "
    "most {norm:,.0f}, at {peak}, against {last:,.1f} at the last position): a massive "
    "activation, channel {channel} = {value:,.1f} at {peak}; it is what lifts the mean ‖resid‖ "
    "column")

BOS_ADDED = note(
    "bos_added", TRACING + ("generate", "tokens"),
    "the prompt's first token is the tokenizer's begin-of-text token",
    "position 0 is the begin-of-text token {token} (id {id}), added by the tokenizer")

NO_BOS = note(
    "no_bos", TRACING + ("generate", "tokens"),
    "the tokenizer has a begin-of-text token but this prompt does not start with it",
    "position 0 is the prompt's first word {first}: no begin-of-text token was added to this "
    "prompt (the tokenizer's is {token}, id {id})")

BOS_GIVEN = note(
    "bos_given", (*TRACING, "generate", "tokens"),
    "the prompt was given as token ids (--ids, --ids-file, a record's \"ids\") and the first is "
    "the tokenizer's begin-of-text token",
    "position 0 is the begin-of-text token {token} (id {id}), as the given ids have it")

PROMPT_IDS = (*TRACING, "generate", "explain", "attribute", "patch", "steer", "ablate", "features",
              "tokens")

IDS_RETOKENIZED = note(
    "ids_retokenized", PROMPT_IDS,
    "the prompt was given as token ids, and the text they decode to tokenizes to other ids",
    "the text these {n} ids decode to tokenizes to other ids (length {m}; from position {pos}: "
    "{given} given, {got} from the text); the ids are taken as given")

CHAT_TEMPLATE = note(
    "chat_template", TRACING + ("generate",),
    "the prompt went through the model's chat template (--chat, --system, --messages)",
    "the model's chat template wrote this prompt: {template} of its {n} tokens are the "
    "template's (marked), the others the messages' text; the next token is the assistant's "
    "first")

EXPERTS_UNSPLIT = note(
    "attribute_experts_unsplit", ("attribute", "ablate", "report", "tui"),
    "at some mixture-of-experts block, the chosen experts' weighted outputs and the shared "
    "experts' do not add up to what the block added",
    "block {layer}: its experts' weighted outputs do not add up to the mixture of experts' "
    "output; the block's MLP shown as one part")

HEADS_UNSPLIT = note(
    "attribute_heads_unsplit", ("attribute", "ablate", "report", "tui"),
    "at some block, the per-head parts (through W_O) do not add up to the attention output",
    "block {layer}: the per-head parts do not add up to the attention output; attention shown "
    "as one part")


def collect() -> dict[str, Note]:
    """Every note: this module's, then those of each command folder's notes.py (by folder name),
    then each engine folder's, each in the order its module defines them. A key defined twice is
    refused."""
    from fptrace.extensions import parts

    found: dict[str, Note] = {}
    where: dict[str, str] = {}
    for origin, module in [("fptrace/notes.py", sys.modules[__name__])] + [
            (m.__name__.replace(".", "/") + ".py", m) for _, m in parts("notes")]:
        for value in vars(module).values():
            if not isinstance(value, Note) or found.get(value.key) is value:
                continue  # a note imported from another module is that module's
            if value.key in found:
                raise ValueError(f"note {value.key!r} is defined twice: in {where[value.key]} "
                                 f"and in {origin}")
            found[value.key], where[value.key] = value, origin
    return found


def all_notes() -> dict[str, Note]:
    """NOTES: collected once, on first use (the command folders' notes.py import this module,
    so it cannot collect them while it is being imported)."""
    if "NOTES" not in globals():
        globals()["NOTES"] = collect()
    return globals()["NOTES"]


def __getattr__(name: str) -> object:
    if name == "NOTES":
        return all_notes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def markdown() -> str:
    """docs/notes.md: every note, with the commands that print it and its condition."""
    out = ["# Every note fptrace prints", "",
           "Generated by `python scripts/notes_doc.py` from `fptrace/notes.py`, the one "
           "place notes are written. A note is a claim about the run at hand, stating what was "
           "measured; `{field}` marks a value filled from the run. For each note a test builds "
           "a run where its condition does not hold and checks the note is absent "
           "(`tests/test_notes.py`).", "",
           "| note | printed by | when | text |", "|---|---|---|---|"]
    for n in all_notes().values():
        esc = lambda s: s.replace("|", "\\|")  # noqa: E731
        out.append(f"| `{n.key}` | {', '.join(n.commands)} | {esc(n.when)} | {esc(n.text)} |")
    return "\n".join(out) + "\n"
