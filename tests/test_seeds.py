"""What the walkthroughs teach, on screen and checked: per-position predictions and the loss,
the embedding lookup, the last-position slice and the parameter table of shapes, and the notes
that explain what would otherwise surprise a student."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_CONFIGS, build_tiny

from fptrace.commands.explain.core import explain
from fptrace.core.trace import run_trace
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311]


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_per_position_losses_are_cross_entropy(name):
    lm = wrap_model(build_tiny(name), name=name, random_weights=True)
    t = run_trace(lm, IDS, all_positions=True)
    with torch.inference_mode():
        logits = lm.model(torch.tensor([IDS]), use_cache=False).logits[0].float()  # (T, V)
    ce = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(IDS[1:]),
                                           reduction="none")
    assert [r.loss for r in t.positions[:-1]] == pytest.approx(ce.tolist(), rel=1e-5, abs=1e-5)
    assert t.positions[-1].loss is None and t.positions[-1].actual is None
    assert t.mean_loss == pytest.approx(float(ce.mean()), rel=1e-5)
    assert t.perplexity == pytest.approx(math.exp(float(ce.mean())), rel=1e-5)
    for r in t.positions:
        assert r.predicted.id == int(logits[r.position].argmax())
        if r.actual is not None:
            assert r.actual_rank == int((logits[r.position] > logits[r.position,
                                                                    r.actual.id]).sum()) + 1
    assert run_trace(lm, IDS).positions == ()


@pytest.mark.slow
def test_bundled_losses_from_the_issue(smollm):
    t = run_trace(smollm, "The capital of France is", all_positions=True)
    assert [round(r.loss, 2) for r in t.positions[:-1]] == [11.54, 0.34, 2.44, 0.45]
    assert t.token_note.startswith("position 0 is the prompt's first word 'The': no "
                                   "begin-of-text token")
    assert any("massive activation" in n and "position 0" in n for n in t.notes)
    assert not any("attention sink" in n for n in t.notes)  # no attention weight was measured
    assert any(n.startswith("at the last position, the embedding row's logit-lens top-1 is the "
                            "input token itself (' is'") for n in t.notes)


@pytest.mark.parametrize("name", ["gpt2", "gemma", "llama"])
def test_embedding_lookup_against_the_model_modules(name):
    lm = wrap_model(build_tiny(name), name=name, random_weights=True)
    e = explain(lm, IDS)
    check = next(c for c in e.checks if c.target == "embedding")
    assert check.ok
    with torch.inference_mode():
        tok = lm.model.get_input_embeddings()(torch.tensor([IDS]))[0]  # scaled for Gemma
        ref = lm.model(torch.tensor([IDS]), output_hidden_states=True).hidden_states[0][0]
    for r in e.embedding:
        assert r.id == IDS[r.position]
        raw = lm.parts.embed.weight[r.id, :4]
        torch.testing.assert_close(torch.tensor(r.token_row), raw.float())
        torch.testing.assert_close(torch.tensor(r.stream), ref[r.position, :4])
        if name == "gpt2":
            wpe = lm.model.transformer.wpe.weight[r.position, :4]
            torch.testing.assert_close(torch.tensor(r.position_row), wpe)
        else:
            assert r.position_row is None
        if name == "gemma":
            assert r.scale == pytest.approx(math.sqrt(lm.config.hidden_size))
            torch.testing.assert_close(torch.tensor(r.stream), tok[r.position, :4])
    names = [s.name for s in e.steps if s.section == "embedding"]
    assert names[0] == "token embedding" and names[-1] == "dropout"


def test_previews_say_which_tensor():
    lm = wrap_model(build_tiny("llama"), name="llama", random_weights=True)
    steps = {s.name: s for s in explain(lm, IDS).steps}
    assert steps["repeat K/V (GQA)"].where.startswith("K, ")
    assert steps["RoPE on Q and K"].where.startswith("Q, ")


def test_shapes_slice_matrix_shapes_and_parameter_rows():
    from fptrace.commands.shapes.core import shape_report

    r = shape_report("gpt2", seq_len=5, batch=2)
    labels = [s.label for s in r.steps]
    i = labels.index("last position only: h[:, −1]")
    assert r.steps[i].shape == (2, 1, 768)
    assert any("W_U" in l for l in labels)
    assert any("broadcast" in l for l in labels)  # the position embedding over the batch
    rows = {g.name: g for g in r.params}
    assert rows["block: attn.c_attn.weight (fused QKV projection)"].shape == (768, 2304)
    assert rows["block: attn.c_attn.bias (fused QKV projection)"].count == 2304
    assert rows["block: mlp.c_fc.weight (MLP up)"].shape == (768, 3072)
    assert rows["block: mlp.c_proj.weight (MLP down)"].shape == (3072, 768)
    assert sum(g.count * g.times for g in r.params) == r.n_params == 124_439_808
    per_block = sum(g.count for g in r.params if g.part == "block")
    assert per_block == 7_087_872  # 12 blocks × this + embeddings + final norm = the total
    import io

    from rich.console import Console

    from fptrace.commands.shapes.render import params

    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(params(r, 160))
    assert "per block, all of the above (12 tensors)" in out.getvalue()
    assert "7,087,872" in out.getvalue()
