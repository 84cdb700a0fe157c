"""Every sentence fptrace says about a run, in one place, each with the condition that makes it
say it.

A note is a claim about the run at hand, phrased as what was measured (the position, the token,
the value), never a general law. The code that emits a note calls its entry here, e.g.
`TRUNCATED(n=3)`; nothing else writes a note, so this file is the complete list:
docs/notes.md is generated from it (`python scripts/notes_doc.py`; a test fails when it is
stale) and tests/test_notes.py builds, for every entry, a run where its condition does not hold
and checks that the note is absent (a new entry without such a case fails that test).
"""

from __future__ import annotations

import re
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


NOTES: dict[str, Note] = {}


def note(key: str, commands: tuple[str, ...], when: str, text: str) -> Note:
    if key in NOTES:
        raise ValueError(f"note {key!r} is defined twice")
    NOTES[key] = Note(key, commands, when, text)
    return NOTES[key]


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
    "bos_added", TRACING + ("generate",),
    "the prompt's first token is the tokenizer's begin-of-text token",
    "position 0 is the begin-of-text token {token} (id {id}), added by the tokenizer")

NO_BOS = note(
    "no_bos", TRACING + ("generate",),
    "the tokenizer has a begin-of-text token but this prompt does not start with it",
    "position 0 is the prompt's first word {first}: no begin-of-text token was added to this "
    "prompt (the tokenizer's is {token}, id {id})")

CHAT_TEMPLATE = note(
    "chat_template", TRACING + ("generate",),
    "the prompt went through the model's chat template (--chat, --system, --messages)",
    "the model's chat template wrote this prompt: {template} of its {n} tokens are the "
    "template's (marked), the others the messages' text; the next token is the assistant's "
    "first")

TOKENIZED = note(
    "tokenized", ("run",),
    "the prompt was given as text (not as token ids) and tokenized in this run",
    "the tokenizer is a lookup outside the network (which sees only these ids); it ran on the "
    "CPU before the model, and takes {time} on this text (timed warm)")

END_OF_PASS = note(
    "explain_end_of_pass", ("explain", "report", "tui"),
    "the explained block is not the model's last",
    "the end of the pass starts from the model's own output of its last block (block {last}), "
    "not from the recomputed block {layer}")

MATRIX_LIMIT = note(
    "explain_matrix_limit", ("explain", "report", "tui"),
    "the prompt has more tokens than the attention tables show",
    "the attention tables are shown for prompts of at most {n} tokens")

HEADS_UNSPLIT = note(
    "attribute_heads_unsplit", ("attribute", "ablate", "report", "tui"),
    "at some block, the per-head parts (through W_O) do not add up to the attention output",
    "block {layer}: the per-head parts do not add up to the attention output; attention shown "
    "as one part")

SOFTCAP = note(
    "attribute_softcap", ("attribute", "report", "tui"),
    "the model soft-caps its final logits (Gemma 2/3)",
    "the model soft-caps its logits at {cap:g}: the parts sum to the logit before the cap; the "
    "capped logit is shown beside it")

QK_KEY_DEFAULTED = note(
    "attribute_qk_key_defaulted", ("attribute", "report", "tui"),
    "attribute --qk without --key",
    "the key is the position query {query} attends to most in this head; --key chooses another")

QK_SOFTCAP = note(
    "attribute_qk_softcap", ("attribute", "report", "tui"),
    "attribute --qk on a model that soft-caps its attention scores (Gemma 2)",
    "the model soft-caps attention scores at {cap:g}: the terms sum to the score before the cap; "
    "the softmax reads the capped score")

TENSOR_PARALLEL_KV = note(
    "generate_tensor_parallel", ("generate",),
    "the model is sharded over tensor-parallel ranks",
    "tensor parallel over {n} ranks: the KV-cache shapes and bytes are rank 0's shard (1/{n} of "
    "the key/value heads)")

WEAK_CORRUPTION = note(
    "patch_weak_corruption", ("patch", "report"),
    "the corruption lowers the target's probability by less than 0.05",
    "the corruption barely changes the target's probability ({clean:.3f} → {corrupt:.3f}): the "
    "grid shows little; try a larger --noise-scale or another corruption")

STEER_GGUF_BLOCKS = note(
    "steer_gguf_blocks", ("steer", "report", "tui"),
    "the steering vector was read from a llama.cpp control-vector .gguf file",
    "{file}'s direction.N was added to the output of block N ({blocks}), as llama.cpp's loader "
    "adds it (llama.cpp's cvector-generator writes the difference it measured after block N − 1 "
    "as direction.N)")

STEER_POSITIONS = note(
    "steer_positions", ("steer", "report", "tui"),
    "--positions is not all: the vector is added at some prompt positions only",
    "the vector was added at the prompt positions {positions} only (llama.cpp adds it at every "
    "position, generated ones included: --positions all)")

STEER_BLOCK0 = note(
    "steer_block0", ("steer", "report", "tui"),
    "the vector steers the output of block 0",
    "this vector steers block 0's output, which llama.cpp never steers (its loader refuses "
    "direction.0): it cannot be used there")

ABLATE_SOFTCAP = note(
    "ablate_softcap", ("ablate", "report", "tui"),
    "the model soft-caps its final logits (Gemma 2/3)",
    "the model soft-caps its logits at {cap:g}: the logits here are the LM head's, before the "
    "cap, like attribute's; the probabilities are the model's own")

ABLATE_WO_BIAS = note(
    "ablate_wo_bias", ("ablate", "report", "tui"),
    "a head is removed and the attention output projection has a bias",
    "the blocks of the removed heads keep their attention output projection's bias, which "
    "belongs to no head")

ABLATE_MEAN = note(
    "ablate_mean", ("ablate", "report"),
    "--mode mean: a removed part's output is replaced by its mean",
    "mean ablation: each removed part output its mean over {n} positions, the same at every "
    "position")

DIFF_MODELS = note(
    "diff_models", ("diff",),
    "the two traces come from different models (name or source)",
    "different models: {a} ({source_a}) and {b} ({source_b})")

DIFF_RANDOM = note(
    "diff_random", ("diff",),
    "one of the two traces ran with random weights",
    "RANDOM WEIGHTS in {which}")

DIFF_BLOCKS = note(
    "diff_blocks", ("diff",),
    "the two models have different numbers of blocks",
    "{a} has {la} blocks and {b} {lb}: the rows are compared up to the shorter")

DIFF_WIDTHS = note(
    "diff_widths", ("diff",),
    "the two models' streams have different widths",
    "the streams have different widths ({da} and {db}): no difference or cosine")

DIFF_SNIPPET = note(
    "diff_snippet", ("diff",),
    "a trace file holds only the first values of the stream (saved without --snippet d_model)",
    "a trace holds only the first values of the stream, so the relative difference and cosine "
    "are withheld; save traces with `--snippet D` (D = d_model) to compare them")

DEEP_BLOCK_LEVEL = note(
    "diff_deep_block_level", ("diff", "report"),
    "with --deep, the two models' blocks have no points to match: models of two families, a "
    "family with no points recorded, or blocks of other shapes",
    "{reason}: the points inside the blocks are not compared, only the block level")

DEEP_MISSING = note(
    "diff_deep_missing_points", ("diff", "report"),
    "with --deep, a point of the family's blocks did not show in one of the runs (an attention "
    "module that returns no weights even when eager)",
    "not compared, as a run did not show them: {points}")

BEYOND_CONTEXT = note(
    "shapes_beyond_context", ("shapes",),
    "the sequence length asked for is beyond the model's context window",
    "sequence length {n} is beyond the context window of {model} ({ctx})")

STATS_RANDOM = note(
    "stats_random_weights", ("stats",),
    "the statistics were counted on a model built with --random-weights",
    "RANDOM WEIGHTS: these statistics were counted on randomly initialized weights, not on the "
    "trained model's")

STATS_FAILED = note(
    "stats_failed", ("stats",),
    "some prompts could not be counted (longer than the context without --truncate, unreadable, "
    "NaN/Inf in the pass)",
    "{n} prompt(s) not counted: statistics.failed says why")

STATS_EAGER = note(
    "stats_eager_attention", ("stats",),
    "the attention sinks were tallied (--sinks, the default)",
    "attention weights are the model's own, from transformers' eager attention (the pass ran "
    "with it)")

STATS_DIFF_PROMPTS = note(
    "diff_stats_prompts", ("diff",),
    "with --stats, the two statistics files count different prompt ids",
    "the two files count different prompts: the moves mix what the models do differently with "
    "what the prompts do")


def markdown() -> str:
    """docs/notes.md: every note, with the commands that print it and its condition."""
    out = ["# Every note fptrace prints", "",
           "Generated by `python scripts/notes_doc.py` from `fptrace/notes.py`, the one "
           "place notes are written. A note is a claim about the run at hand, stating what was "
           "measured; `{field}` marks a value filled from the run. For each note a test builds "
           "a run where its condition does not hold and checks the note is absent "
           "(`tests/test_notes.py`).", "",
           "| note | printed by | when | text |", "|---|---|---|---|"]
    for n in NOTES.values():
        esc = lambda s: s.replace("|", "\\|")  # noqa: E731
        out.append(f"| `{n.key}` | {', '.join(n.commands)} | {esc(n.when)} | {esc(n.text)} |")
    return "\n".join(out) + "\n"
