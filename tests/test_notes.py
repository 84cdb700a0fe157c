"""What fptrace says in words is measured like its numbers: every note of the registry has a
run where its condition does not hold and the note is absent (and, where cheap, one where it
holds and the note is there: a command's notes' cases are in its examples.py, collected here;
the shared notes' are below); docs/notes.md is the registry's current rendering; no note is
written outside the registry; on the bundled model, no sentence of `run` is contradicted by the
same run's JSON."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import build_tiny, tiny_gpt2

from fptrace.models.loading import load_model, wrap_model
from fptrace.notes import NOTES, markdown

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The cat sat on the mat"


def said(note_key: str, sentences) -> bool:
    return any(NOTES[note_key].matches(s) for s in sentences if s)


def _llama(random_weights: bool = True):
    return wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=random_weights)


def _trace(lm, prompt=PROMPT, **kw):
    from fptrace.core.trace import run_trace

    return run_trace(lm, prompt, **kw)


def _said_by_trace(t):
    return t.notes + (t.token_note,)


def _gpt2():
    return load_model(tiny_gpt2(), random_weights=True, device="cpu")


def _tokenizer_model(style: str, tmp_path_factory):
    import tokenizer_fixtures

    folder = tokenizer_fixtures.BUILDERS[style](tmp_path_factory.mktemp(style) / style)
    return load_model(str(folder), device="cpu")


# note -> a function of pytest's tmp_path_factory returning (sentences of a run where the
# condition does not hold, sentences of a run where it holds or None when no cheap case exists)
def _random_weights(f):
    return _said_by_trace(_trace(_llama(False), [5, 6, 7])), \
        _said_by_trace(_trace(_llama(True), [5, 6, 7]))


def _decomposition_withheld(f):
    return _said_by_trace(_trace(_llama(), [5, 6, 7])), None


def _truncated(f):
    lm = _gpt2()
    long = "word " * 40  # the tiny GPT-2 reads 32 positions
    return _said_by_trace(_trace(lm, "short")), \
        _said_by_trace(_trace(lm, long, truncate=True))


def _tied_lens_last(f):
    untied = _llama()  # its tiny config is untied: the condition's first half fails
    return _said_by_trace(_trace(untied, [5, 6, 7])), None


def _tied_lens_grid(f):
    return _said_by_trace(_trace(_llama(), [5, 6, 7], lens_grid=True)), None


def _massive_activation(f):
    return _said_by_trace(_trace(_llama(), [5, 6, 7, 8])), None


def _bos_added(f):
    gpt2_style = _tokenizer_model("gpt2", f)  # adds no begin-of-text token
    bos = _tokenizer_model("llama3", f)
    return _said_by_trace(_trace(gpt2_style, PROMPT)), _said_by_trace(_trace(bos, PROMPT))


def _no_bos(f):
    bos = _tokenizer_model("gemma", f)
    return _said_by_trace(_trace(bos, PROMPT)), _said_by_trace(_trace(_gpt2(), PROMPT))


def _bos_given(f):
    """Ids given that start with the begin-of-text id: said as given, not as added; the same
    ids as a text's tokens are said as the tokenizer's."""
    bos = _tokenizer_model("llama3", f)
    ids = bos.encode(PROMPT)
    return _said_by_trace(_trace(bos, PROMPT)), _said_by_trace(_trace(bos, ids))


def _ids_retokenized(f):
    """The ids of a text tokenize back to themselves; ' c' + 'at' (two tokens) spells ' cat',
    one token of GPT-2's BPE."""
    lm = _tokenizer_model("gpt2", f)
    split = lm.encode(" c")[-1:] + lm.encode("at")[-1:]
    assert lm.encode(" cat") != split
    return _said_by_trace(_trace(lm, lm.encode(PROMPT))), _said_by_trace(_trace(lm, split))


def _chat_template(f):
    from fptrace.models.prompts import Chat

    lm = _tokenizer_model("llama3", f)
    return _said_by_trace(_trace(lm, PROMPT)), _said_by_trace(_trace(lm, Chat.of(PROMPT)))


def _attribute_heads_unsplit(f):
    from fptrace.commands.attribute.core import attribute

    return attribute(_llama(), [5, 6, 7]).notes, None


def _attribute_experts_unsplit(f):
    """An MoE model whose experts add up (tests/test_attribute.py makes one that does not)."""
    from conftest import build_tiny_moe

    from fptrace.commands.attribute.core import attribute

    lm = wrap_model(build_tiny_moe("qwen2_moe"), name="tiny-qwen2_moe", random_weights=True)
    return attribute(lm, [5, 6, 7]).notes, None


def _stats(lm, prompts=(PROMPT, "The dog ran"), **kw):
    from fptrace.commands.stats.core import activation_stats

    return activation_stats(lm, list(prompts), **kw)


def _diff_stats_prompts(f):
    """A case of two commands (stats writes the files diff reads): it stays here."""
    from fptrace.commands.diff.channels import diff_stats
    from fptrace.commands.stats.core import write_stats

    lm, tmp = _gpt2(), f.mktemp("stats")
    write_stats(str(tmp / "a.json"), _stats(lm))
    write_stats(str(tmp / "b.json"), _stats(lm, (PROMPT,)))
    a, b = str(tmp / "a.json"), str(tmp / "b.json")
    return diff_stats(a, a).notes, diff_stats(a, b).notes


def _llamacpp_engine(f):  # a transformers run: no llama.cpp sentence
    return _said_by_trace(_trace(_llama(), [1, 2, 3])), None


def _llamacpp_lens_withheld(f):
    return _said_by_trace(_trace(_llama(), [1, 2, 3])), None


def _llamacpp_tokens(f):
    return _said_by_trace(_trace(_llama(), [1, 2, 3])), None



class Bench:
    """What the examples of the command folders borrow from the tests (fptrace/examples.py)."""

    def __init__(self, tmp_path_factory):
        self.factory = tmp_path_factory

    def tiny(self, family: str):
        return build_tiny(family)

    def lm(self, family: str, random_weights: bool = True):
        return wrap_model(build_tiny(family), name=f"tiny-{family}",
                          random_weights=random_weights)

    def gpt2_folder(self) -> str:
        return tiny_gpt2()

    def tmp(self, name: str) -> Path:
        return self.factory.mktemp(name)


def _collected() -> dict:
    """The cases the command folders declare beside their notes (examples.py NOTE_CASES)."""
    from fptrace.extensions import declared

    out = {}
    for _, cases in declared("examples", "NOTE_CASES"):
        for case in cases:
            assert case.key not in out, f"two cases for the note {case.key!r}"
            out[case.key] = lambda f, run=case.run: run(Bench(f))
    return out


# the shared notes' cases (and one that needs two commands) are this file's functions
HERE = {name[1:]: fn for name, fn in globals().items()
        if name.startswith("_") and name[1:] in NOTES}
CASES = {**_collected(), **HERE}


def test_every_note_has_a_case():
    missing = sorted(set(NOTES) - set(CASES))
    assert not missing, ("notes without an absent case (a command's: NOTE_CASES in its "
                         f"examples.py; a shared note's: tests/test_notes.py): {missing}")


def test_no_note_has_two_cases():
    assert not set(_collected()) & set(HERE), set(_collected()) & set(HERE)


@pytest.mark.parametrize("key", sorted(NOTES))
def test_absent_where_its_condition_fails(key, tmp_path_factory):
    absent, present = CASES[key](tmp_path_factory)
    assert not said(key, absent), (key, absent)
    if present is not None:
        assert said(key, present), (key, present)


def test_the_doc_lists_every_note():
    doc = (ROOT / "docs" / "notes.md").read_text(encoding="utf-8")
    assert doc == markdown(), "docs/notes.md is stale: python scripts/notes_doc.py"


def test_no_note_is_written_outside_the_registry():
    """Every `notes.append(...)`/`notes.insert(...)` and every `notes = [...]` element in the
    package is a call of a registered note (or a computed list of them), never a literal."""
    bad = []
    for path in (ROOT / "fptrace").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("append", "insert") and \
                    getattr(node.func.value, "id", "") == "notes":
                arg = node.args[-1]
                if isinstance(arg, (ast.Constant, ast.JoinedStr, ast.BinOp)):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, ("notes written as literals (add them to fptrace/notes.py or the "
                     "command's notes.py):\n") + \
        "\n".join(bad)


@pytest.mark.slow
def test_the_bundled_run_says_what_its_json_shows(smollm):
    """The sentences of `run` on the bundled model, read against the numbers of the same run:
    the tied-lens count against the lens grid, the massive activation's channel and value
    against the layer it names, the first token against the token table."""
    t = _trace(smollm, "The capital of France is", lens_grid=True)
    text = " ".join(t.notes)
    m = re.search(r"at (\d+) of (\d+) positions the embedding row", text)
    assert m, t.notes
    same = sum(cell.id == t.tokens[p].id for cell, p in zip(t.lens_grid[0], t.lens_positions))
    assert (int(m.group(1)), int(m.group(2))) == (same, len(t.lens_positions))
    assert "attention sink" not in text  # no attention weight was measured
    m = re.search(r"in ([^,]+(?:, [^,]+)*?), position (\d+) .* than the others \(at most "
                  r"[\d,]+, at block (\d+), .* channel (\d+) = (-?[\d,.]+) at", text)
    assert m, t.notes
    from fptrace.core.trace import row_ranges

    pos = int(m.group(2))
    held = [r.layer for r in t.layers if r.resid_norm_max_position == pos
            and r.resid_norm_max > 10 * r.resid_norm_last]  # every row where it holds
    assert m.group(1) == row_ranges(held)
    row = t.layers[int(m.group(3)) + 1]
    assert row.resid_norm_max_position == pos
    assert row.resid_max_channel == int(m.group(4))
    assert float(m.group(5).replace(",", "")) == pytest.approx(row.resid_max_value, abs=0.05)
    assert abs(row.resid_max_value) > 100  # the bundled model's massive activation
    assert "'The'" in t.token_note and t.tokens[0].text == "The"
