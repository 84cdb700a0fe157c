"""The sampling functions are pure and seeded: properties checked on random logits."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fptrace.core import sampling
from fptrace.errors import BadInput

logits_lists = st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=2, max_size=60,
                        unique=True)


@settings(max_examples=60, deadline=None)
@given(logits_lists, st.integers(1, 80))
def test_top_k_keeps_exactly_k(values, k):
    probs = torch.softmax(torch.tensor(values), dim=-1)
    before = probs.clone()
    out = sampling.keep_top_k(probs, k)
    assert torch.equal(probs, before)  # pure: the input is untouched
    kept = out > 0
    assert int(kept.sum()) == min(k, len(values))
    # the kept ones are the most probable, and their ratios are preserved
    assert probs[kept].min() >= probs[~kept].max() if (~kept).any() else True
    assert torch.isclose(out.sum(), torch.tensor(1.0))
    top = probs[kept]
    torch.testing.assert_close(out[kept], top / top.sum())


@settings(max_examples=60, deadline=None)
@given(logits_lists, st.floats(0.01, 1.0))
def test_top_p_keeps_smallest_set_reaching_p(values, p):
    probs = torch.softmax(torch.tensor(values, dtype=torch.float64), dim=-1)
    out = sampling.keep_top_p(probs, p)
    kept = out > 0
    n = int(kept.sum())
    ranked = torch.sort(probs, descending=True).values
    # the kept set is the n most probable tokens
    assert torch.equal(torch.sort(probs[kept], descending=True).values, ranked[:n])
    # its mass reaches p (up to rounding) and one token fewer would not
    assert float(ranked[:n].sum()) >= p - 1e-9 or n == len(values)
    assert float(ranked[:n - 1].sum()) < p + 1e-12  # (rounding of the running sum)
    assert torch.isclose(out.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_top_p_one_keeps_everything_with_mass():
    probs = torch.tensor([0.5, 0.3, 0.2])
    assert int((sampling.keep_top_p(probs, 1.0) > 0).sum()) == 3
    assert int((sampling.keep_top_p(probs, 0.5) > 0).sum()) == 1
    assert int((sampling.keep_top_p(probs, 0.51) > 0).sum()) == 2


@settings(max_examples=40, deadline=None)
@given(logits_lists)
def test_temperature_towards_zero_is_greedy(values):
    logits = torch.tensor(values)
    greedy = sampling.greedy(logits)
    assert int(greedy.argmax()) == int(logits.argmax()) and float(greedy.sum()) == 1.0
    assert torch.equal(sampling.with_temperature(logits, 0.0), greedy)
    gap = float(torch.sort(logits, descending=True).values[:2].diff().abs())
    cold = sampling.with_temperature(logits, gap / 200)  # exp(-200) underflows: one-hot
    torch.testing.assert_close(cold, greedy)


def test_temperature_one_is_softmax_and_higher_is_flatter():
    logits = torch.tensor([2.0, 1.0, 0.0])
    torch.testing.assert_close(sampling.with_temperature(logits, 1.0), torch.softmax(logits, -1))
    hot = sampling.with_temperature(logits, 5.0)
    assert hot.max() < torch.softmax(logits, -1).max()


def test_draw_is_seeded():
    probs = torch.softmax(torch.randn(500, generator=torch.Generator().manual_seed(1)), -1)
    assert sampling.draw(probs, 7) == sampling.draw(probs, 7)
    draws = {sampling.draw(probs, s) for s in range(30)}
    assert len(draws) > 5  # different seeds, different tokens
    one_hot = sampling.greedy(probs)
    assert sampling.draw(one_hot, 3) == int(probs.argmax())


@pytest.mark.parametrize("t,k,p", [(-0.1, 10, 0.9), (float("nan"), 10, 0.9), (1.0, 0, 0.9),
                                   (1.0, 10, 0.0), (1.0, 10, 1.5), (1.0, 10, -0.2)])
def test_bad_options(t, k, p):
    with pytest.raises(BadInput):
        sampling.check_options(t, k, p)
