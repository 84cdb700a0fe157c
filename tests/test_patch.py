"""fptrace patch: restoring a whole layer's stream gives back the clean probability, restoring
nothing the corrupted one; the batched grid equals the one-by-one grid; noise is seeded; bad
input is refused with what to change."""

from __future__ import annotations

import json

import pytest
from conftest import build_tiny, tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.patch.core import Patcher, patch, patch_rows
from fptrace.errors import BadInput
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311]
runner = CliRunner()


def test_restoring_a_whole_layer_gives_back_the_clean_run(tiny):
    import torch

    corrupt = [11, 12, 13, 14, 15, 16]
    p = Patcher(tiny, IDS, corrupt, "resid")
    target = int(p.clean_logits.argmax())
    clean = float(torch.softmax(p.clean_logits, -1)[target])
    T, L = len(IDS), len(tiny.parts.blocks)
    rows = [[(layer, i) for i in range(T)] for layer in range(L)] + [[]]
    got = p.probs(rows, target, batch_size=4)
    for layer in range(L):
        assert got[layer] == pytest.approx(clean, rel=1e-4, abs=1e-6)
    with torch.inference_mode():
        want = torch.softmax(tiny.model(torch.tensor([corrupt]), use_cache=False)
                             .logits[0, -1].float(), -1)[target]
    assert got[-1] == pytest.approx(float(want), rel=1e-4, abs=1e-6)


def test_batched_grid_equals_one_by_one(tiny):
    a = patch(tiny, IDS, corrupt=[11, 12, 13, 14, 15, 16], batch_size=64)
    b = patch(tiny, IDS, corrupt=[11, 12, 13, 14, 15, 16], batch_size=1)
    for ra, rb in zip(a.grid, b.grid):
        assert ra == pytest.approx(rb, rel=1e-4, abs=1e-6)
    assert a.forward_passes < b.forward_passes


@pytest.mark.parametrize("what", ["attn", "mlp"])
def test_attn_and_mlp_windows(what):
    lm = wrap_model(build_tiny("gemma2"), name="tiny-gemma2", random_weights=True)
    L = len(lm.parts.blocks)
    r = patch(lm, IDS, corrupt=[11, 12, 13, 14, 15, 16], what=what, window=L)
    # a window of every layer at the last position restores every attention (MLP) output
    # there; a window of all layers and positions would restore the clean run
    assert len(r.grid) == L and all(len(row) == len(IDS) for row in r.grid)
    rows = patch_rows(what, L, len(IDS), L)
    assert all(sorted({l for l, _ in row}) == list(range(L)) for row in rows)


def test_noise_is_seeded_and_on_the_subject():
    r = runner.invoke(app, ["patch", "The cat sat on the mat", "-m", tiny_gpt2(),
                            "--random-weights", "--noise", " cat", "--json"])
    assert r.exit_code == 0, r.stderr
    first = json.loads(r.stdout)
    again = json.loads(runner.invoke(app, ["patch", "The cat sat on the mat", "-m", tiny_gpt2(),
                                           "--random-weights", "--noise", " cat",
                                           "--json"]).stdout)
    other = json.loads(runner.invoke(app, ["patch", "The cat sat on the mat", "-m", tiny_gpt2(),
                                           "--random-weights", "--noise", " cat", "--seed", "3",
                                           "--json"]).stdout)
    assert first["grid"] == again["grid"]
    assert first["subject_positions"] == [1]
    assert first["p_corrupt"] != other["p_corrupt"]


@pytest.mark.parametrize("args,needle", [
    (["--noise", " dog"], "not in the prompt"),
    (["--corrupt", "A dog"], "different lengths"),
    (["--noise", " cat", "--what", "attn", "--window", "9"], "--window 9"),
    (["--noise", " cat", "--window", "2"], "--window goes with"),
    ([], "give one corruption"),
    (["--noise", " cat", "--what", "heads"], "--what"),
])
def test_bad_input(args, needle):
    r = runner.invoke(app, ["patch", "The cat sat on the mat", "-m", tiny_gpt2(),
                            "--random-weights", *args])
    assert r.exit_code == 2, r.stdout
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("fptrace: error:") and needle in line


def test_too_big_a_batch_says_what_to_lower(monkeypatch):
    import fptrace.models.memory as memory

    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    with pytest.raises(BadInput, match="lower --batch-size"):
        patch(lm, IDS, corrupt=[11, 12, 13, 14, 15, 16])


@pytest.mark.slow
def test_bundled_model_locates_the_subject(smollm):
    r = patch(smollm, "The capital of France is", noise=" France")
    assert r.target.text == " Paris" and r.p_corrupt < 0.1 < 0.7 < r.p_clean
    T = len(r.tokens)
    # early layers at the subject, late layers at the last position carry the answer
    assert r.grid[0][3] > 0.5 and r.grid[-1][T - 1] == pytest.approx(r.p_clean, rel=1e-4)
