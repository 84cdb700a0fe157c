"""End-to-end checks on the real bundled model, SmolLM2-135M-Instruct (GGUF, dequantized)."""

from __future__ import annotations

import pytest
import torch

from fptrace.core.trace import run_trace

pytestmark = pytest.mark.slow


def test_bundled_model_predicts_paris(smollm):
    trace = run_trace(smollm, "The capital of France is")
    assert [t.id for t in trace.tokens] == [504, 3575, 282, 4649, 314]
    assert trace.top_k[0].text == " Paris"
    assert trace.model.family == "llama"
    assert (trace.model.n_layers, trace.model.d_model) == (30, 576)
    assert (trace.model.n_heads, trace.model.n_kv_heads) == (9, 3)
    assert trace.model.vocab_size == 49152
    assert not trace.model.random_weights


def test_bundled_trace_matches_hidden_states(smollm):
    trace = run_trace(smollm, "The capital of France is", snippet=576, top_k=10)
    ids = torch.tensor([[t.id for t in trace.tokens]])
    with torch.inference_mode():
        ref = smollm.model(ids, output_hidden_states=True, use_cache=False)
    for k in range(30):
        torch.testing.assert_close(torch.tensor(trace.layers[k].snippet),
                                   ref.hidden_states[k][0, -1], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(torch.tensor(trace.final_norm.snippet),
                               ref.hidden_states[30][0, -1], rtol=1e-5, atol=1e-4)
    assert [t.id for t in trace.top_k] == ref.logits[0, -1].topk(10).indices.tolist()
