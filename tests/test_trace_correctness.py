"""Every number fptrace shows is checked against the model itself."""

from __future__ import annotations

import pytest
import torch

from fptrace.core.hooks import Capture, capture_stats
from fptrace.core.trace import run_trace, run_traces


def _ids(lm, n=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, lm.config.vocab_size, (n,), generator=g).tolist()


def _reference(lm, ids):
    with torch.inference_mode():
        return lm.model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)


def test_layers_match_output_hidden_states(tiny):
    ids = _ids(tiny)
    d = tiny.config.hidden_size
    trace = run_trace(tiny, ids, top_k=5, snippet=d)
    ref = _reference(tiny, ids)
    hs = ref.hidden_states
    L = len(tiny.parts.blocks)
    assert len(hs) == L + 1 and len(trace.layers) == L + 1
    # hidden_states[k] (k < L) is the stream entering block k: the embedding row, then the
    # output of block k-1. The last entry already has the final norm applied.
    for k in range(L):
        row = trace.layers[k]
        torch.testing.assert_close(torch.tensor(row.snippet), hs[k][0, -1], rtol=1e-5, atol=1e-5)
        assert row.resid_norm_last == pytest.approx(float(hs[k][0, -1].norm()), rel=1e-5)
        assert row.resid_norm_mean == pytest.approx(float(hs[k][0].norm(dim=-1).mean()),
                                                    rel=1e-5)
        _assert_peak(row, hs[k][0])
    torch.testing.assert_close(torch.tensor(trace.final_norm.snippet), hs[L][0, -1],
                               rtol=1e-5, atol=1e-5)
    # the stream after the last block is the pre-norm residual, not hidden_states[-1]
    last = tiny.parts.final_norm(torch.tensor(trace.layers[L].snippet)[None])[0]
    torch.testing.assert_close(last, hs[L][0, -1], rtol=1e-5, atol=1e-5)


def _assert_peak(row, h):
    """The row's largest ‖stream‖, its position, and there the channel of the largest |value|
    and that value, against the stream h (T, d) the model computed."""
    norms = h.norm(dim=-1)
    where = int(norms.argmax())
    channel = int(h[where].abs().argmax())
    assert row.resid_norm_max == pytest.approx(float(norms[where]), rel=1e-5)
    assert (row.resid_norm_max_position, row.resid_max_channel) == (where, channel)
    assert row.resid_max_value == pytest.approx(float(h[where, channel]), rel=1e-5)


def test_top_k_matches_model_logits(tiny):
    ids = _ids(tiny, seed=2)
    trace = run_trace(tiny, ids, top_k=5)
    logits = _reference(tiny, ids).logits[0, -1]
    probs = logits.softmax(-1)
    p, idx = probs.topk(5)
    assert [t.id for t in trace.top_k] == idx.tolist()
    for t, pp, i in zip(trace.top_k, p.tolist(), idx.tolist()):
        assert t.prob == pytest.approx(pp, rel=1e-5)
        assert t.logit == pytest.approx(float(logits[i]), rel=1e-5, abs=1e-5)
    # the logit lens of the last block's stream is the model's own prediction
    assert trace.layers[-1].lens_id == trace.top_k[0].id
    assert trace.layers[-1].lens_prob == pytest.approx(trace.top_k[0].prob, rel=1e-4)


def test_logit_lens_matches_manual_projection(tiny):
    """The lens is the model's own final projection: final norm, LM head and, where the config
    has one (Gemma 2/3), the final-logit softcap (read here from the config, not the registry)."""
    ids = _ids(tiny, seed=3)
    trace = run_trace(tiny, ids, top_k=1)
    hs = _reference(tiny, ids).hidden_states
    cap = getattr(tiny.config, "final_logit_softcapping", None)
    for k in range(len(hs) - 1):
        with torch.inference_mode():
            logits = tiny.model.lm_head(tiny.parts.final_norm(hs[k][0, -1]))
            if cap:
                logits = torch.tanh(logits / cap) * cap
            probs = logits.softmax(-1)
        assert trace.layers[k].lens_id == int(probs.argmax())
        assert trace.layers[k].lens_prob == pytest.approx(float(probs.max()), rel=1e-4)


def test_attention_and_mlp_add_up_to_the_block(tiny):
    """What the block added splits exactly into the attention and MLP contributions."""
    ids = _ids(tiny, seed=4)
    cap = Capture(mask=None)
    with torch.inference_mode(), capture_stats(tiny.parts, cap):
        tiny.model(torch.tensor([ids]), use_cache=False)
    prev = cap.embed_last
    for i in range(len(tiny.parts.blocks)):
        added = cap.resid_last[i] - prev
        torch.testing.assert_close(cap.attn_last[i] + cap.mlp_last[i], added,
                                   rtol=1e-4, atol=1e-5)
        prev = cap.resid_last[i]


def test_trace_norms_and_cosines_are_consistent(tiny):
    ids = _ids(tiny, seed=5)
    d = tiny.config.hidden_size
    trace = run_trace(tiny, ids, snippet=d)
    for prev, row in zip(trace.layers, trace.layers[1:]):
        a, b = torch.tensor(prev.snippet), torch.tensor(row.snippet)
        assert row.added_norm_last == pytest.approx(float((b - a).norm()), rel=1e-4, abs=1e-5)
        cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
        assert row.cos_prev == pytest.approx(cos, abs=1e-5)


def test_hooks_are_removed(tiny):
    def count():
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
                   for m in tiny.model.modules())

    before = count()
    run_trace(tiny, _ids(tiny))
    assert count() == before


def test_batched_equals_single(tiny):
    """Prompts of very different lengths in one padded pass give each prompt's own trace."""
    prompts = [_ids(tiny, n=n, seed=n) for n in (2, 11, 5)]
    batched = run_traces(tiny, prompts, top_k=5, snippet=8)
    for ids, got in zip(prompts, batched):
        want = run_trace(tiny, ids, top_k=5, snippet=8)
        # the padded row's largest stream, where, and its channel, against the model's own
        hs = _reference(tiny, ids).hidden_states
        for k in range(len(tiny.parts.blocks)):
            _assert_peak(got.layers[k], hs[k][0])
        assert [t.id for t in got.tokens] == ids
        assert [t.id for t in got.top_k] == [t.id for t in want.top_k]
        for g, w in zip(got.layers, want.layers):
            assert g.resid_norm_last == pytest.approx(w.resid_norm_last, rel=1e-4, abs=1e-5)
            assert g.resid_norm_mean == pytest.approx(w.resid_norm_mean, rel=1e-4, abs=1e-5)
            torch.testing.assert_close(torch.tensor(g.snippet), torch.tensor(w.snippet),
                                       rtol=1e-4, atol=1e-4)
        for g, w in zip(got.top_k, want.top_k):
            assert g.prob == pytest.approx(w.prob, rel=1e-4, abs=1e-6)


def test_all_positions_logits_shape(tiny):
    ids = _ids(tiny, n=6)
    one = run_trace(tiny, ids)
    full = run_trace(tiny, ids, all_positions=True)
    assert one.shapes[-1].shape == (1, 1, tiny.config.vocab_size)
    assert full.shapes[-1].shape == (1, 6, tiny.config.vocab_size)
    assert [t.id for t in one.top_k] == [t.id for t in full.top_k]
    assert one.shapes[1].shape == (1, 6, tiny.config.hidden_size)
    assert all(s.shape == (1, 6, tiny.config.hidden_size) for s in full.shapes[2:-1])


def test_lens_metrics_match_a_direct_computation(tiny):
    """rank of the final top-1, entropy and KL(final ‖ lens) of every lens row, against the
    model's own final projection of output_hidden_states."""
    ids = _ids(tiny, seed=6)
    trace = run_trace(tiny, ids, top_k=1)
    hs = _reference(tiny, ids).hidden_states
    cap = getattr(tiny.config, "final_logit_softcapping", None)

    def logp(h):
        with torch.inference_mode():
            z = tiny.model.lm_head(tiny.parts.final_norm(h)).float()
            if cap:
                z = torch.tanh(z / cap) * cap
            return torch.log_softmax(z, dim=-1)

    final_lp = _reference(tiny, ids).logits[0, -1].float().log_softmax(-1)
    top = int(final_lp.argmax())
    for k in range(len(hs) - 1):
        lp = logp(hs[k][0, -1])
        row = trace.layers[k]
        assert row.lens_rank == int((lp > lp[top]).sum()) + 1
        assert row.lens_entropy == pytest.approx(float(-(lp.exp() * lp).sum()), rel=1e-4,
                                                 abs=1e-5)
        kl = float((final_lp.exp() * (final_lp - lp)).sum())
        assert row.lens_kl == pytest.approx(max(kl, 0.0), rel=1e-3, abs=1e-5)
    assert trace.layers[-1].lens_rank == 1
    assert trace.layers[-1].lens_kl == pytest.approx(0.0, abs=1e-5)
