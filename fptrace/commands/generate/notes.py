"""The notes of `fptrace generate` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

TENSOR_PARALLEL_KV = note(
    "generate_tensor_parallel", ("generate",),
    "the model is sharded over tensor-parallel ranks",
    "tensor parallel over {n} ranks: the KV-cache shapes and bytes are rank 0's shard (1/{n} of "
    "the key/value heads)")
