"""End-to-end checks on the real bundled model, SmolLM2-135M-Instruct (GGUF, dequantized)."""

from __future__ import annotations

import json
import os

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


def test_cache_entry_is_reused_and_a_corrupt_one_rebuilt(smollm, cache_dir):
    from fptrace.models.gguf_cache import entry_ok
    from fptrace.models.loading import load_model

    entries = [os.path.join(r, "model.safetensors") for r, _, f in os.walk(cache_dir)
               if "model.safetensors" in f]
    assert len(entries) == 1
    messages = []
    load_model("smollm2-135m", progress=messages.append)
    assert not any("dequantizing" in m for m in messages)  # warm: read from the cache

    # same size, garbage header: the manifest check passes, loading fails, the entry is rebuilt
    with open(entries[0], "r+b") as f:
        f.write(b"\xff" * 64)
    messages.clear()
    lm = load_model("smollm2-135m", progress=messages.append)
    assert any("rebuilding" in m for m in messages)
    assert run_trace(lm, "The capital of France is").top_k[0].text == " Paris"
    # the run that dequantizes computes what a run from the cache computes, bit for bit: both
    # read the cache entry (on an AVX-512 machine, the GGUF reader's in-memory model printed
    # " Paris" 17.371265 where every later run printed 17.371264; this CPU gave equal digits
    # either way, so here the test guards the one path rather than reproducing the gap)
    ids = torch.tensor([[504, 3575, 282, 4649, 314]])
    with torch.inference_mode():
        assert torch.equal(lm.model(ids).logits, smollm.model(ids).logits)

    # another size (a truncated or overlong file): the manifest's size check refuses the entry
    # before loading, so it is rebuilt (the rebuild itself is the case above; the entry is
    # restored here rather than rebuilt a second time, ~25 s)
    folder = os.path.dirname(entries[0])
    with open(os.path.join(folder, "fptrace-cache.json")) as f:
        manifest = json.load(f)
    size = os.path.getsize(entries[0])
    assert manifest["files"]["model.safetensors"] == size and entry_ok(folder)
    with open(entries[0], "ab") as f:
        f.write(b"\0")
    assert not entry_ok(folder)
    os.truncate(entries[0], size)
    assert entry_ok(folder)
