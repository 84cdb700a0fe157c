"""The notes of `fptrace steer` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

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
