"""Examples of `fptrace generate`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

from typing import Any

from fptrace.examples import Bench, NoteCase


def _tensor_parallel(bench: Bench) -> tuple[Any, Any]:
    from fptrace.commands.generate.core import generate

    return generate(bench.lm("llama"), [5, 6, 7], max_new_tokens=1).notes, None


NOTE_CASES = (NoteCase("generate_tensor_parallel", _tensor_parallel),)
