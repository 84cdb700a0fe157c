"""The notes of the llama.cpp engine (`run --engine llama.cpp`, `diff --engine-b llama.cpp`;
fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

LLAMACPP_ENGINE = note(
    "llamacpp_engine", ("run", "diff"),
    "the numbers come from llama.cpp (--engine llama.cpp, --engine-b llama.cpp)",
    "computed by llama.cpp ({version}); the logit lens applies the checkpoint's final norm and "
    "head, in float32, to llama.cpp's streams")

LLAMACPP_LENS_WITHHELD = note(
    "llamacpp_lens_withheld", ("run", "diff"),
    "llama.cpp's logits are not the last stream through the final norm and head",
    "logit lens withheld: llama.cpp's final norm differs from the checkpoint's by {norm:.2g} "
    "and its logits from the head's by {logits:.2g} (relative)")

LLAMACPP_TOKENS = note(
    "llamacpp_tokens", ("run", "diff"),
    "llama.cpp's tokenizer splits the prompt differently from transformers'",
    "the tokenizers differ: llama.cpp splits the prompt as {llamacpp}, transformers as "
    "{transformers}; both engines ran transformers' ids")
