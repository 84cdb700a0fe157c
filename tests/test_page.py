"""The report's interactive page: the data it shows (the lens grid's cells, checked against the
model's own hidden states, module outputs and logits), the page itself (one file, its data
embedded as JSON from the typed results), `--html` on the analysis commands, and a real
browser that hovers, clicks and presses keys with every network request refused."""

from __future__ import annotations

import json
import re

import pytest
import torch

from fptrace.core.trace import run_trace


def _ids(lm, n=6, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, lm.config.vocab_size, (n,), generator=g).tolist()


def _own_streams(lm, ids):
    """The model's own numbers: hidden states, logits at every position, and the outputs of
    the modules whose outputs the stream receives (hooks of this test, not fptrace's)."""
    outs: dict[tuple[str, int], torch.Tensor] = {}
    handles = []
    for name, mods in (("attn", lm.parts.attn_adds), ("mlp", lm.parts.mlp_adds),
                       ("block", lm.parts.blocks)):
        for i, m in enumerate(mods):
            def grab(_m, _a, out, key=(name, i)):
                outs[key] = (out[0] if isinstance(out, tuple) else out).detach().float()
            handles.append(m.register_forward_hook(grab))
    try:
        with torch.inference_mode():
            ref = lm.model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return ref, outs


def test_lens_grid_cells_are_what_the_model_computed(tiny):
    ids = _ids(tiny)
    t = run_trace(tiny, ids, lens_grid=True)
    ref, outs = _own_streams(tiny, ids)
    L = len(tiny.parts.blocks)
    T = len(ids)
    assert t.lens_positions == tuple(range(T)) and len(t.lens_grid) == L + 1
    # the streams: the embedding and each block's output (hidden_states[L] has the final norm)
    streams = [ref.hidden_states[0][0]] + [outs[("block", i)][0] for i in range(L)]
    cap = getattr(tiny.config, "final_logit_softcapping", None)
    for k, row in enumerate(t.lens_grid):
        assert len(row) == T
        with torch.inference_mode():
            logits = tiny.model.lm_head(tiny.parts.final_norm(streams[k])).float()  # (T, V)
            if cap:
                logits = torch.tanh(logits / cap) * cap
        probs = logits.softmax(-1)
        for j, c in enumerate(row):
            assert c.resid_norm == pytest.approx(float(streams[k][j].norm()), rel=1e-5)
            p, idx = probs[j].topk(len(c.top_k))
            assert [x.prob for x in c.top_k] == pytest.approx(p.tolist(), rel=1e-4, abs=1e-7)
            assert c.top_k[0].id == int(idx[0]) and (c.id, c.prob) == (c.top_k[0].id,
                                                                      c.top_k[0].prob)
            for x in c.top_k:
                assert x.logit == pytest.approx(float(logits[j, x.id]), rel=1e-4, abs=1e-5)
            if k == 0:
                assert c.added_norm is c.attn_norm is c.mlp_norm is None
                continue
            added = streams[k][j] - streams[k - 1][j]
            assert c.added_norm == pytest.approx(float(added.norm()), rel=1e-4, abs=1e-6)
            if c.attn_norm is None:  # withheld only where the split does not add up
                parts = outs[("attn", k - 1)][0, j] + outs[("mlp", k - 1)][0, j]
                assert float((added - parts).norm()) > 1e-4 * float(added.norm())
                continue
            assert c.attn_norm == pytest.approx(float(outs[("attn", k - 1)][0, j].norm()),
                                                rel=1e-5)
            assert c.mlp_norm == pytest.approx(float(outs[("mlp", k - 1)][0, j].norm()),
                                               rel=1e-5)
    # the last row's lens is the model's own prediction at every position
    own = ref.logits[0].float().softmax(-1)
    for j, c in enumerate(t.lens_grid[-1]):
        assert c.id == int(own[j].argmax()) and c.prob == pytest.approx(float(own[j].max()),
                                                                         rel=1e-4)
    # and the grid agrees with the last-position rows of the table
    for k, layer in enumerate(t.layers):
        assert t.lens_grid[k][-1].resid_norm == pytest.approx(layer.resid_norm_last, rel=1e-5)
        if layer.attn_norm_last is not None and t.lens_grid[k][-1].attn_norm is not None:
            assert t.lens_grid[k][-1].attn_norm == pytest.approx(layer.attn_norm_last, rel=1e-5)
