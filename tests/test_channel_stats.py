"""fptrace.core.channel_stats: per-channel running statistics against numpy on all activations
stacked in memory, exact merging of any split, bit-exact JSON, refusals."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fptrace.core.channel_stats import DEFAULT_BINS, ChannelStats
from fptrace.errors import BadInput, NonFiniteValues

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


# ---- helpers --------------------------------------------------------------------------------

def make_prompts(rng, n_prompts, d, *, dtype=torch.float32, quantized=False, lengths=(1, 40),
                 loc=0.0, scale=None):
    """[(x (N, d) tensor, prompt id, positions)]: channel scales 1e-4..1e3 (every default bin),
    or small multiples of 0.5 (many equal |x|, to exercise the tie-break)."""
    scale = np.exp(rng.uniform(np.log(1e-4), np.log(1e3), d)) if scale is None else scale
    out = []
    for p in range(n_prompts):
        n = int(rng.integers(lengths[0], lengths[1] + 1))
        if quantized:
            x = rng.integers(-4, 5, (n, d)) * 0.5
        else:
            x = loc + rng.standard_normal((n, d)) * scale
        out.append((torch.from_numpy(x).to(dtype), p, np.arange(n)))
    return out


def one_pass(prompts, d, bins=DEFAULT_BINS):
    s = ChannelStats(d, bins)
    for x, p, pos in prompts:
        s.update(x, p, pos)
    return s


def reference(prompts, bins=DEFAULT_BINS):
    """numpy float64 on everything stacked: mean, var, absmax, its location and value, hist."""
    xs = np.concatenate([x.double().numpy() for x, _, _ in prompts])  # (M, d)
    prompt = np.concatenate([np.full(len(pos), p) for _, p, pos in prompts])  # (M,)
    position = np.concatenate([np.asarray(pos) for _, _, pos in prompts])  # (M,)
    a = np.abs(xs)
    amax = a.max(0)
    order = np.lexsort((position, prompt))  # rows by (prompt, position)
    first = np.argmax(a[order] == amax, axis=0)  # first row in that order holding the max
    row = order[first]  # (d,)
    cols = np.arange(xs.shape[1])
    binned = np.digitize(a, np.asarray(bins)) - 1  # bin i: e_i <= |x| < e_(i+1)
    hist = np.stack([(binned == k).sum(0) for k in range(len(bins) - 1)], axis=1)
    return {"count": len(xs), "mean": xs.mean(0), "var": xs.var(0), "absmax": amax,
            "absmax_value": xs[row, cols], "argmax_prompt": prompt[row],
            "argmax_position": position[row], "hist": hist}


def assert_close(name, got, want, rtol, atol):
    bad = ~(np.abs(got - want) <= rtol * np.abs(want) + atol)
    assert not bad.any(), f"{name}: {got[bad]} != {want[bad]} (rtol {rtol})"


def assert_moments(got_mean, got_var, want_mean, want_var, absmax, rtol):
    """Within rtol, or within rounding of the data's size where the result is about 0: a mean
    that cancels to 0 in one order is ~1e-17 · |x| in another; a constant channel's variance
    is 0 in one order, ~ulp^2 in another."""
    assert_close("mean", got_mean, want_mean, rtol, 1e-13 * absmax)
    assert_close("var", got_var, want_var, rtol, 1e-24 * absmax * absmax)


def assert_matches(s, ref, rtol=1e-9):
    assert s.count == ref["count"]
    for name in ("absmax", "absmax_value", "argmax_prompt", "argmax_position", "hist"):
        np.testing.assert_array_equal(getattr(s, name), ref[name], err_msg=name)
    assert_moments(s.mean, s.var, ref["mean"], ref["var"], ref["absmax"], rtol)


def assert_same(a, b, rtol=1e-9):
    """Exactly the same counts, maxima, locations, histograms; mean and var within rtol."""
    assert (a.count, a.width, a.bins) == (b.count, b.width, b.bins)
    for name in ("absmax", "absmax_value", "argmax_prompt", "argmax_position", "hist"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert_moments(a.mean, a.var, b.mean, b.var, b.absmax, rtol)


def bits(arr):
    return np.asarray(arr).tobytes()


# ---- against numpy --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES))
def test_one_pass_matches_numpy(dtype):
    rng = np.random.default_rng(1)
    prompts = make_prompts(rng, 12, 33, dtype=DTYPES[dtype], lengths=(1, 70))
    s = one_pass(prompts, 33)
    assert_matches(s, reference(prompts))
    np.testing.assert_allclose(s.std, np.sqrt(s.var))
    assert s.hist.shape == (33, len(DEFAULT_BINS) - 1) and (s.hist.sum(1) == s.count).all()


def test_ties_take_the_smallest_prompt_and_position_whatever_the_feeding_order():
    rng = np.random.default_rng(2)
    prompts = make_prompts(rng, 9, 17, quantized=True, lengths=(1, 12))  # |x| in {0, .5, …, 2}
    shuffled = []
    for i in rng.permutation(len(prompts)):  # prompts out of order, positions out of order
        x, p, pos = prompts[i]
        perm = rng.permutation(len(pos))
        shuffled.append((x[torch.from_numpy(perm)], p + 100, pos[perm] * 3 + 5))
    s = one_pass(shuffled, 17)
    assert_matches(s, reference(shuffled))
    assert (s.absmax == 2.0).sum() > 1  # ties were there to break


def test_a_long_prompt_in_blocks_with_a_tail():
    # 16-row blocks locate the max: the max in the tail block, in the first row, on a block edge
    for n in (1, 15, 16, 17, 47, 48, 49):
        x = torch.zeros(n, 4)
        x[n - 1, 0], x[0, 1], x[min(16, n - 1), 2], x[n // 2, 3] = 5.0, -5.0, 3.0, 2.0
        x[n - 1, 3] = -2.0  # a tie later in the prompt: the earlier position wins
        s = ChannelStats(4)
        s.update(x, 7, range(n))
        assert_matches(s, reference([(x, 7, np.arange(n))]))


@pytest.mark.parametrize("loc,scale", [(1e3, 1e-2), (1e5, 1e-3)])
def test_large_offsets_where_the_naive_sum_of_squares_fails(loc, scale):
    rng = np.random.default_rng(3)
    prompts = make_prompts(rng, 40, 6, dtype=torch.float64, loc=loc, scale=np.full(6, scale),
                           lengths=(1, 60))
    ref = reference(prompts)
    s = one_pass(prompts, 6)
    # the naive streaming formula var = E[x^2] - E[x]^2, in float64 too
    xs = [x.double().numpy() for x, _, _ in prompts]
    n = sum(len(x) for x in xs)
    sx, sxx = sum(x.sum(0) for x in xs), sum((x * x).sum(0) for x in xs)
    naive = sxx / n - (sx / n) ** 2
    assert np.abs(naive / ref["var"] - 1).max() > 1e-6  # fails
    np.testing.assert_allclose(s.var, ref["var"], rtol=1e-6)  # Welford/Chan holds
    np.testing.assert_allclose(s.mean, ref["mean"], rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_inputs_accumulate_in_float64(dtype):
    big = 65504.0 if dtype == "float16" else 3.0e38  # the largest float16; bf16 near its max
    x = torch.tensor([[big, -big, 1.0], [big, big, -1.0], [-big, big, 0.5]] * 50)
    x = x.to(DTYPES[dtype])  # (150, 3): sums of squares far beyond the 16-bit range
    s = ChannelStats(3)
    s.update(x, 0, range(150))
    ref = reference([(x, 0, np.arange(150))])
    assert np.isfinite(s.var).all() and np.isfinite(s.mean).all()
    assert_matches(s, ref)
    assert s.absmax[0] == float(x[0, 0]) and s.absmax_value[1] == -float(x[0, 0])


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_edges_few_channels_straddle_count_only_their_blocks(dtype):
    # width 256 = 4 blocks of 64 channels; outliers in two blocks straddle the high edges
    rng = np.random.default_rng(8)
    scale = np.full(256, 0.5)
    scale[[3, 130]] = [300.0, 5e3]
    prompts = make_prompts(rng, 3, 256, dtype=DTYPES[dtype], scale=scale, lengths=(20, 40))
    assert_matches(one_pass(prompts, 256), reference(prompts))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_values_on_and_next_to_every_edge(dtype):
    bins = (0.0, 1e-40, 1e-3, 0.3, 1.0, 2.5, 1e4, 1e300, math.inf)
    t = DTYPES[dtype]
    finfo = torch.finfo(t)
    top = 1e150 if t == torch.float64 else finfo.max  # float64 squares of 1e155 would overflow
    vals = [0.0, -0.0, finfo.tiny, top, -top]
    for e in bins[1:-1]:
        for v in (e, -e):
            c = torch.tensor(v, dtype=torch.float64).clamp(-finfo.max, finfo.max).to(t)
            vals += [float(c), float(torch.nextafter(c, torch.tensor(0.0, dtype=t))),
                     float(torch.nextafter(c, torch.tensor(math.copysign(math.inf, v), dtype=t)))]
    vals = [v for v in vals if abs(v) <= top]
    x = torch.tensor(vals, dtype=torch.float64).to(t).clamp(-finfo.max, finfo.max)[:, None]
    s = ChannelStats(1, bins)
    s.update(x, 0, range(len(vals)))
    np.testing.assert_array_equal(s.hist, reference([(x, 0, np.arange(len(vals)))], bins)["hist"])


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1,
                max_size=60),
       st.lists(st.floats(min_value=0.0, exclude_min=True, allow_infinity=False), max_size=6,
                unique=True))
def test_histogram_of_any_float32_values_and_any_edges(vals, inner):
    bins = (0.0, *sorted(inner), math.inf)
    x = torch.tensor(vals, dtype=torch.float32)[:, None]
    s = ChannelStats(1, bins)
    s.update(x, 0, range(len(vals)))
    np.testing.assert_array_equal(s.hist, reference([(x, 0, np.arange(len(vals)))], bins)["hist"])


# ---- merging --------------------------------------------------------------------------------

@given(n_prompts=st.integers(1, 20), d=st.integers(1, 7), quantized=st.booleans(),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def test_any_split_merged_in_any_order_equals_one_pass(n_prompts, d, quantized, seed, data):
    rng = np.random.default_rng(seed)
    dtype = data.draw(st.sampled_from(list(DTYPES)))
    prompts = make_prompts(rng, n_prompts, d, dtype=DTYPES[dtype], quantized=quantized,
                           lengths=(1, 30))
    whole = one_pass(prompts, d)
    n_shards = data.draw(st.integers(1, n_prompts))
    owner = data.draw(st.lists(st.integers(0, n_shards - 1), min_size=n_prompts,
                               max_size=n_prompts))
    shards = []
    for k in range(n_shards):
        mine = [prompts[i] for i in rng.permutation(n_prompts) if owner[i] == k]
        shards.append(one_pass(mine, d))  # an empty shard is fine
    while len(shards) > 1:  # random pairs, either operand first: any tree, any order
        i, j = rng.choice(len(shards), 2, replace=False)
        a, b = shards[i], shards[j]
        shards = [s for k, s in enumerate(shards) if k not in (i, j)] + [a.merge(b)]
    assert_same(shards[0], whole)
    assert_matches(whole, reference(prompts))


def test_merge_is_pure_and_commutes_bit_for_bit():
    rng = np.random.default_rng(4)
    prompts = make_prompts(rng, 6, 9)
    a, b = one_pass(prompts[:3], 9), one_pass(prompts[3:], 9)
    before = json.dumps(a.to_dict()), json.dumps(b.to_dict())
    ab, ba = a.merge(b), b.merge(a)
    assert (json.dumps(a.to_dict()), json.dumps(b.to_dict())) == before
    assert json.dumps(ab.to_dict()) == json.dumps(ba.to_dict())
    assert a.merge_(b) is a and json.dumps(a.to_dict()) == json.dumps(ab.to_dict())
    empty = ChannelStats(9)
    assert json.dumps(empty.merge(b).to_dict()) == json.dumps(b.merge(empty).to_dict()) == before[1]


def test_merging_large_offsets_stays_within_1e_9():
    rng = np.random.default_rng(5)
    prompts = make_prompts(rng, 20, 4, dtype=torch.float64, loc=1e3, scale=np.full(4, 1e-2))
    parts = [one_pass(prompts[i::3], 4) for i in range(3)]
    assert_same(parts[2].merge(parts[0]).merge(parts[1]), one_pass(prompts, 4), rtol=1e-9)


# ---- JSON -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES))
def test_json_round_trip_is_bit_exact(dtype):
    rng = np.random.default_rng(6)
    s = one_pass(make_prompts(rng, 5, 11, dtype=DTYPES[dtype]), 11)
    s.update(torch.full((2, 11), -0.0, dtype=DTYPES[dtype]), 99, [0, 1])  # signed zeros too
    text = json.dumps(s.to_dict(), allow_nan=False)  # strict JSON
    back = ChannelStats.from_dict(json.loads(text))
    assert json.dumps(back.to_dict(), allow_nan=False) == text
    assert back.count == s.count and back.bins == s.bins
    for name in ("mean", "m2", "var", "absmax", "absmax_value", "argmax_prompt",
                 "argmax_position", "hist"):
        assert bits(getattr(back, name)) == bits(getattr(s, name)), name
    assert json.loads(text)["bins"][-1] == "inf"
    back.update(torch.ones(1, 11, dtype=DTYPES[dtype]), 100, [0])  # keeps accumulating


def test_json_of_an_empty_accumulator():
    d = ChannelStats(3).to_dict()
    assert d["count"] == 0 and d["absmax"] == [-1.0] * 3 and d["argmax_prompt"] == [-1] * 3
    back = ChannelStats.from_dict(json.loads(json.dumps(d, allow_nan=False)))
    assert back.count == 0 and np.isnan(back.var).all()


# ---- refusals -------------------------------------------------------------------------------

def refused(exc, fn, *args, match=None):
    """fn(*args) raises exc with a one-line message containing match (literally)."""
    with pytest.raises(exc, match=None if match is None else re.escape(match)) as info:
        fn(*args)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_merge_refuses_other_widths_and_bins():
    a = ChannelStats(4)
    refused(BadInput, a.merge, ChannelStats(5), match="width 5 into width 4")
    refused(BadInput, a.merge, ChannelStats(4, (0.0, 1.0, math.inf)), match="different bin edges")
    refused(BadInput, a.merge_, {"width": 4}, match="cannot merge a dict")


def test_from_dict_refuses_what_to_dict_cannot_write():
    rng = np.random.default_rng(7)
    good = one_pass(make_prompts(rng, 2, 3), 3).to_dict()
    bad_cases = {
        "mean must be (3,)": {**good, "mean": good["mean"][:2]},
        "hist must be (3, 9)": {**good, "hist": [row[:8] for row in good["hist"]]},
        "argmax_position must be": {**good, "argmax_position": [0.5] * 3},
        "missing m2": {k: v for k, v in good.items() if k != "m2"},
        "rise strictly": {**good, "bins": [0.0, 1.0, 1.0, "inf"]},
        "number or \"inf\"": {**good, "bins": [0.0, "Infinity"]},
        "sum to count": {**good, "count": good["count"] + 1},
        "width must be a positive int": {**good, "width": "3"},
        "expected a dict": [good],
    }
    for match, d in bad_cases.items():
        refused(BadInput, ChannelStats.from_dict, d, match=match)


def test_update_refuses_bad_batches_and_stays_unchanged_on_nan():
    s = ChannelStats(3)
    s.update(torch.ones(2, 3), 0, [0, 1])
    before = json.dumps(s.to_dict())
    refused(BadInput, s.update, torch.ones(2, 4), 1, [0, 1], match="(N, 3)")
    refused(BadInput, s.update, torch.ones(2, 3, dtype=torch.int64), 1, [0, 1], match="float")
    refused(BadInput, s.update, torch.ones(2, 3), 1, [0], match="positions of shape")
    refused(BadInput, s.update, torch.ones(2, 3), 1, [4, 4], match="repeats a position")
    refused(BadInput, s.update, torch.ones(2, 3), -1, [0, 1], match="prompt id")
    refused(BadInput, s.update, torch.ones(2, 3), 1, [-1, 0], match="positions")
    x = torch.ones(3, 3)
    x[1, 2] = math.nan
    refused(NonFiniteValues, s.update, x, 1, [0, 1, 2], match="prompt 1 has NaN or Inf")
    x[1, 2] = math.inf
    refused(NonFiniteValues, s.update, x, 1, [0, 1, 2])
    assert json.dumps(s.to_dict()) == before
    s.update(torch.ones(0, 3), 1, [])  # nothing to add
    assert json.dumps(s.to_dict()) == before


def test_constructor_refuses_bad_width_and_bins():
    refused(BadInput, ChannelStats, 0, match="width")
    refused(BadInput, ChannelStats, 3, (0.1, 1.0, math.inf), match="from 0 to inf")
    refused(BadInput, ChannelStats, 3, (0.0, 1.0), match="from 0 to inf")
    refused(BadInput, ChannelStats, 3, (0.0, "a", math.inf), match="numbers")


@pytest.mark.system
def test_importing_the_module_imports_neither_torch_nor_numpy():
    code = ("import sys, fptrace.core.channel_stats; "
            "assert not {'torch', 'numpy'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- several prompts per update, tokens, prompt offsets ------------------------------------

def test_several_prompts_in_one_update_equal_one_update_each():
    rng = np.random.default_rng(9)
    prompts = make_prompts(rng, 6, 13, quantized=True, lengths=(1, 9))  # ties across prompts
    tokens = [rng.integers(0, 50, len(pos)) for _, _, pos in prompts]
    each = ChannelStats(13)
    for (x, p, pos), tok in zip(prompts, tokens):
        each.update(x, p, pos, tok)
    together = ChannelStats(13)
    order = rng.permutation(sum(len(pos) for _, _, pos in prompts))  # rows in any order
    x = torch.cat([x for x, _, _ in prompts])[torch.from_numpy(order)]
    p = np.concatenate([np.full(len(pos), p) for _, p, pos in prompts])[order]
    pos = np.concatenate([pos for _, _, pos in prompts])[order]
    together.update(x, p, pos, np.concatenate(tokens)[order])
    assert_same(together, each)
    np.testing.assert_array_equal(together.argmax_token, each.argmax_token)
    assert_matches(together, reference(prompts))


def test_the_token_at_each_max_is_kept():
    x = torch.tensor([[1.0, -9.0], [7.0, 2.0], [-7.0, 3.0]])  # a tie in channel 0: row 1 wins
    s = ChannelStats(2)
    s.update(x, 4, [0, 1, 2], tokens=[10, 11, 12])
    assert s.argmax_token.tolist() == [11, 10]
    assert s.argmax_position.tolist() == [1, 0]
    assert ChannelStats(2).argmax_token.tolist() == [-1, -1]
    t = ChannelStats(2)
    t.update(x, 4, [0, 1, 2])  # no tokens given: -1
    assert t.argmax_token.tolist() == [-1, -1]
    refused(BadInput, s.update, x, 5, [0, 1, 2], [1, 2], match="tokens of shape")
    refused(BadInput, s.update, x, [5, 5, -1], [0, 1, 2], match="prompt ids")


def test_shards_numbered_from_0_merge_with_offsets_into_one_pass():
    rng = np.random.default_rng(10)
    prompts = make_prompts(rng, 9, 7, quantized=True, lengths=(1, 6))  # many ties
    whole = one_pass(prompts, 7)
    cuts = [0, 2, 3, 7, 9]
    total = ChannelStats(7)
    for a, b in zip(cuts, cuts[1:]):  # each shard numbers its prompts from 0
        shard = one_pass([(x, p - a, pos) for x, p, pos in prompts[a:b]], 7)
        total.merge_(shard, prompt_offset=a)
    assert_same(total, whole)
    assert (whole.absmax == 2.0).sum() > 1
