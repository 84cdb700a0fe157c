"""What fptrace says in words is measured like its numbers: every note of notes.py has a
run here where its condition does not hold and the note is absent (and, where cheap, one where
it holds and the note is there); docs/notes.md is the registry's current rendering; no note is
written outside the registry; on the bundled model, no sentence of `run` is contradicted by the
same run's JSON."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from conftest import build_tiny, tiny_gpt2
from fptrace.notes import NOTES, markdown
from fptrace.models.loading import load_model, wrap_model

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


def _run_view(t) -> list[str]:
    """The token-table sentences about tokenizing, in the rendered run view."""
    import io

    from rich.console import Console

    from fptrace.commands.run.render import trace_view

    c = Console(file=io.StringIO(), width=200, color_system=None)
    c.print(trace_view(t, 200))
    text = " ".join(c.file.getvalue().split())
    return [m.group(0) for m in NOTES["tokenized"].pattern().finditer(text)]


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


def _chat_template(f):
    from fptrace.models.prompts import Chat

    lm = _tokenizer_model("llama3", f)
    return _said_by_trace(_trace(lm, PROMPT)), _said_by_trace(_trace(lm, Chat.of(PROMPT)))


def _tokenized(f):
    lm = _gpt2()
    ids = lm.encode(PROMPT)
    return _run_view(_trace(lm, ids)), _run_view(_trace(lm, PROMPT))


def _explain(lm, **kw):
    from fptrace.commands.explain.core import explain

    return explain(lm, [5, 6, 7, 8], **kw).notes


def _explain_end_of_pass(f):
    lm = _llama()
    return _explain(lm, layer=-1), _explain(lm, layer=0)


def _explain_matrix_limit(f):
    lm = _llama()
    return _explain(lm), _explain(lm, max_matrix=2)


def _attribute_heads_unsplit(f):
    from fptrace.commands.attribute.core import attribute

    return attribute(_llama(), [5, 6, 7]).notes, None


def _attribute_softcap(f):
    from fptrace.commands.attribute.core import attribute

    capped = wrap_model(build_tiny("gemma2"), name="tiny-gemma2", random_weights=True)
    return attribute(_llama(), [5, 6, 7]).notes, attribute(capped, [5, 6, 7]).notes


def _qk(lm, **kw):
    from fptrace.commands.attribute.qk import attribute_qk

    return attribute_qk(lm, [5, 6, 7, 8], 1, 0, **kw).notes


def _attribute_qk_key_defaulted(f):
    lm = _llama()
    return _qk(lm, key=1), _qk(lm)


def _attribute_qk_softcap(f):
    capped = wrap_model(build_tiny("gemma2"), name="tiny-gemma2", random_weights=True)
    return _qk(_llama(), key=1), _qk(capped, key=1)


def _generate_tensor_parallel(f):
    from fptrace.commands.generate.core import generate

    return generate(_llama(), [5, 6, 7], max_new_tokens=1).notes, None


def _patch_weak_corruption(f):
    """A corruption that changes the answer (other tokens, on a model with sharp logits) and
    one that cannot (the prompt itself)."""
    import torch

    from fptrace.commands.patch.core import patch

    model = build_tiny("llama")
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # sharp logits: the clean top-1 is near certain
    lm = wrap_model(model, name="tiny-llama-sharp", random_weights=True)
    strong = patch(lm, [5, 6, 7], corrupt=[900, 901, 902])
    assert strong.p_clean - strong.p_corrupt >= 0.05, (strong.p_clean, strong.p_corrupt)
    weak = patch(lm, [5, 6, 7], corrupt=[5, 6, 7])
    return strong.notes, weak.notes


def _steer(lm=None, **kw):
    from fptrace.commands.steer.core import steer

    kw.setdefault("token", "#5")
    kw.setdefault("layer", 1)
    return steer(lm or _llama(), [5, 6, 7], scales="0,1", **kw).notes


def _steer_gguf_blocks(f):
    from fptrace.commands.steer.vectors import token_vector, write_vector

    lm = _llama()
    path = str(f.mktemp("vector") / "v.gguf")
    write_vector(path, token_vector(lm, "#5", 1), lm)
    return _steer(lm), _steer(lm, token=None, layer=None, vector=path)


def _steer_positions(f):
    return _steer(), _steer(positions="last")


def _steer_block0(f):
    return _steer(), _steer(layer=0)


def _ablate(lm=None, **kw):
    from fptrace.commands.ablate.core import ablate

    kw.setdefault("heads", ["1.0"])
    return ablate(lm or _llama(), [5, 6, 7], **kw).notes


def _ablate_softcap(f):
    capped = wrap_model(build_tiny("gemma2"), name="tiny-gemma2", random_weights=True)
    return _ablate(), _ablate(capped)


def _ablate_wo_bias(f):
    """GPT-2's c_proj has a bias: removing only an MLP leaves no head's block behind."""
    gpt2 = wrap_model(build_tiny("gpt2"), name="tiny-gpt2", random_weights=True)
    return _ablate(gpt2, heads=(), mlps=[1]), _ablate(gpt2)


def _ablate_mean(f):
    return _ablate(), _ablate(mode="mean")


def _diff(a, b, **kw):
    from fptrace.commands.diff.core import diff

    return diff(a, b, **kw).notes


def _diff_models(f):
    lm = _llama()
    other = wrap_model(build_tiny("mistral"), name="tiny-mistral", random_weights=True)
    t = _trace(lm, [5, 6, 7], snippet=64)
    return _diff(t, t), _diff(t, _trace(other, [5, 6, 7], snippet=64))


def _diff_random(f):
    lm = _llama(False)
    t = _trace(lm, [5, 6, 7], snippet=64)
    r = _trace(_llama(True), [5, 6, 7], snippet=64)
    return _diff(t, t), _diff(t, r)


def _diff_blocks(f):
    t = _trace(_llama(), [5, 6, 7], snippet=64)
    short = dataclasses.replace(t, layers=t.layers[:-1])
    return _diff(t, t), _diff(t, short)


def _diff_widths(f):
    t = _trace(_llama(), [5, 6, 7], snippet=64)
    return _diff(t, t), None


def _diff_snippet(f):
    lm = _llama()
    return _diff(_trace(lm, [5, 6, 7], snippet=64), _trace(lm, [5, 6, 8], snippet=64)), \
        _diff(_trace(lm, [5, 6, 7]), _trace(lm, [5, 6, 8]))


def _deep(b):
    import copy

    from fptrace.commands.diff.deep import deep_diff

    a = _llama()
    other = b or wrap_model(copy.deepcopy(a.model), name="copy", random_weights=True)
    return deep_diff(a, other, [5, 6, 7]).deep.notes


def _diff_deep_block_level(f):
    return _deep(None), _deep(wrap_model(build_tiny("gpt2"), name="tiny-gpt2",
                                         random_weights=True))


def _diff_deep_missing_points(f):
    return _deep(None), None


def _shapes_beyond_context(f):
    from fptrace.commands.shapes.core import shape_report

    return shape_report("gpt2", seq_len=8).notes, shape_report("gpt2", seq_len=2000).notes


def _stats(lm, prompts=(PROMPT, "The dog ran"), **kw):
    from fptrace.commands.stats.core import activation_stats

    return activation_stats(lm, list(prompts), **kw)


def _stats_random_weights(f):
    gpt2 = _gpt2()
    trained = load_model(tiny_gpt2(), device="cpu")  # its weights as saved: not random
    return _stats(trained).notes, _stats(gpt2).notes


def _stats_failed(f):
    lm = _gpt2()
    return _stats(lm).notes, _stats(lm, (PROMPT, "word " * 40)).notes  # 32 positions at most


def _stats_eager_attention(f):
    lm = _gpt2()
    return _stats(lm, sinks=False).notes, _stats(lm).notes


def _diff_stats_prompts(f):
    from fptrace.commands.diff.channels import diff_stats
    from fptrace.commands.stats.core import write_stats

    lm, tmp = _gpt2(), f.mktemp("stats")
    write_stats(str(tmp / "a.json"), _stats(lm))
    write_stats(str(tmp / "b.json"), _stats(lm, (PROMPT,)))
    a, b = str(tmp / "a.json"), str(tmp / "b.json")
    return diff_stats(a, a).notes, diff_stats(a, b).notes


CASES = {name[1:]: fn for name, fn in globals().items()
         if name.startswith("_") and name[1:] in NOTES}


def test_every_note_has_a_case():
    missing = sorted(set(NOTES) - set(CASES))
    assert not missing, f"notes without an absent case in tests/test_notes.py: {missing}"


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
    assert not bad, "notes written as literals (add them to fptrace/notes.py):\n" + \
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
