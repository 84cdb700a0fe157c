"""Seeded faults: a copy of the bundled GGUF modified with the `gguf` package (a wrong RoPE base,
a wrong norm epsilon, two query heads swapped in one block), run in llama.cpp against the
original in transformers; `diff --engine-b llama.cpp --deep` names the block and the operation
where each fault acts, and not an earlier one."""

from __future__ import annotations

import shutil

import pytest

from fptrace.engines.llamacpp import binding as B

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(B.installed_version() is None,
                                 reason="the [llamacpp] extra (xllamacpp) is not installed")]

PROMPT = "The capital of France is"


def seeded(gguf: str, folder, name: str, edit) -> str:
    """A copy of the GGUF with `edit(reader)` applied in place (the reader maps the file
    writable: metadata values and tensor bytes are changed where they lie)."""
    from gguf import GGUFReader

    path = folder / f"{name}.gguf"
    shutil.copyfile(gguf, path)
    reader = GGUFReader(str(path), "r+")
    edit(reader)
    reader.data.flush()
    del reader
    return str(path)


def set_value(key: str, value: float):
    def edit(reader):
        field = reader.fields[key]
        field.parts[field.data[0]][0] = value
    return edit


def swap_heads(tensor: str, h1: int, h2: int, hd: int = 64):
    def edit(reader):
        t = next(t for t in reader.tensors if t.name == tensor)
        rows = t.data  # (out rows, bytes per quantized row): one head is hd whole rows
        a, b = rows[h1 * hd:(h1 + 1) * hd].copy(), rows[h2 * hd:(h2 + 1) * hd].copy()
        rows[h1 * hd:(h1 + 1) * hd], rows[h2 * hd:(h2 + 1) * hd] = b, a
    return edit


@pytest.mark.parametrize("name,edit,block,points", [
    ("norm_eps", set_value("llama.attention.layer_norm_rms_epsilon", 0.5), 0, ("ln1",)),
    ("rope_base", set_value("llama.rope.freq_base", 1000.0), 0, ("q", "k")),
    ("heads_swapped", swap_heads("blk.5.attn_q.weight", 2, 6), 5, ("q",)),
])
def test_a_seeded_fault_is_named(smollm, gguf, tmp_path_factory, name, edit, block, points):
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine

    path = seeded(gguf, tmp_path_factory.mktemp(name), name, edit)
    # the unmodified file parts from transformers at 1e-2 (8-bit activations); these faults
    # part by far more, so a tolerance above the engines' own gap isolates them
    result = engine_diff(smollm, engine("llama.cpp"), path, PROMPT, deep=True,
                         layers=list(range(block + 1)), tolerance=0.1, name_b=name)
    parted = result.deep.parted
    assert parted is not None, name
    assert (parted.layer, parted.point) in {(block, p) for p in points}, parted.sentence
    assert parted.cause == "operation", parted.sentence
    if name == "heads_swapped":
        assert {s.index for s in parted.heads[:2]} == {2, 6}, parted.sentence
    assert any("different models" in n for n in result.notes)


def test_the_unmodified_file_stays_within_the_loose_tolerance(smollm, gguf):
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine

    result = engine_diff(smollm, engine("llama.cpp"), gguf, PROMPT, deep=True, layers=list(range(6)),
                         tolerance=0.1)
    assert result.deep.parted is None and result.within
