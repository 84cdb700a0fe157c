"""Devices, dtypes and device maps: the trace does not change (within the dtype's precision)
when the model is spread over CPU and disk, or run in half precision."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import build_tiny, make_gpt2_folder, tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.core.trace import run_trace
from fptrace.errors import BadInput
from fptrace.models.devices import parse_max_memory
from fptrace.models.loading import load_model

IDS = [5, 17, 42, 7, 99, 3]
runner = CliRunner()


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-folder")
    build_tiny("llama").save_pretrained(folder)
    return str(folder)


def same_trace(a, b, rel=1e-5):
    assert [t.id for t in a.top_k] == [t.id for t in b.top_k]
    for x, y in zip(a.top_k, b.top_k):
        assert math.isclose(x.logit, y.logit, rel_tol=rel, abs_tol=rel)
    for la, lb in zip(a.layers, b.layers):
        for key in ("resid_norm_last", "resid_norm_mean", "attn_norm_last", "mlp_norm_last"):
            va, vb = getattr(la, key), getattr(lb, key)
            if va is not None:
                assert math.isclose(va, vb, rel_tol=rel, abs_tol=rel), key
        assert la.snippet == pytest.approx(lb.snippet, rel=rel, abs=rel)
        assert la.lens_id == lb.lens_id


def test_disk_offload_gives_the_same_trace(llama_folder, tmp_path):
    whole = load_model(llama_folder)
    # 700 KB of CPU for an 862 KiB model: the embedding and block 0 stay in RAM, the rest is
    # offloaded to disk and streamed in by Accelerate's hooks during the forward
    spread = load_model(llama_folder, device_map="auto", max_memory="cpu=700KB",
                        offload_folder=str(tmp_path / "offload"))
    dm = spread.model.hf_device_map
    assert "disk" in dm.values() and "cpu" in dm.values()
    assert any(p.startswith("block") and p.endswith("disk") for p in spread.placement)
    # offloaded weights are not in memory (Accelerate reads them from the safetensors file)
    assert any(p.device.type == "meta" for p in spread.model.parameters())
    a, b = run_trace(whole, IDS), run_trace(spread, IDS)
    same_trace(b, a)
    assert b.model.placement == spread.placement and not a.model.placement
    # and the generic generate / batch paths run on it too
    from fptrace.commands.generate.core import generate

    g1 = generate(whole, IDS, max_new_tokens=3)
    g2 = generate(spread, IDS, max_new_tokens=3)
    assert [t.id for t in g1.generated] == [t.id for t in g2.generated]


def test_no_hub_kernels_replace_the_traced_modules(llama_folder, smollm):
    """transformers with `kernels` installed marks a loaded model for Hub kernels by default and,
    on CUDA with a device map, swaps RMSNorm, SiLU and RoPE for code fetched from the Hub
    (gpu_check met it: offline, the load failed asking for kernels-community/rotary). fptrace
    loads with the kernels off, whatever the path: a folder, a device map, the bundled GGUF."""
    assert load_model(llama_folder).model.use_kernels is False
    assert load_model(llama_folder, device_map="auto").model.use_kernels is False
    assert smollm.model.use_kernels is False


def test_cli_device_map_header_and_json(tmp_path):
    # 6 blocks of width 64 beside a 12.9 MB tied embedding: 13.5 MB of CPU keeps the
    # embedding and blocks 0-1 in RAM and offloads blocks 2-5 and ln_f to disk
    folder, _ = make_gpt2_folder(tmp_path, n_positions=32, n_layer=6, n_embd=64)
    plain = json.loads(runner.invoke(app, ["run", "The cat sat", "-m", str(folder),
                                           "--json"]).stdout)
    r = runner.invoke(app, ["run", "The cat sat", "-m", str(folder), "--device-map", "auto",
                            "--max-memory", "cpu=13.5MB", "--offload-folder",
                            str(tmp_path / "off"), "--json"])
    assert r.exit_code == 0, r.stderr
    spread = json.loads(r.stdout)
    assert any("disk" in p for p in spread["model"]["placement"])
    assert [t["id"] for t in spread["top_k"]] == [t["id"] for t in plain["top_k"]]
    for la, lb in zip(spread["layers"], plain["layers"]):
        assert math.isclose(la["resid_norm_last"], lb["resid_norm_last"], rel_tol=1e-5)
    table = runner.invoke(app, ["run", "The cat sat", "-m", str(folder), "--device-map", "auto",
                                "--max-memory", "cpu=13.5MB"])
    assert "placement" in table.stdout and "disk" in table.stdout


@pytest.mark.slow
@pytest.mark.parametrize("dtype,rel,prob", [("bfloat16", 3e-2, 3e-2), ("float16", 5e-3, 5e-3)])
def test_half_precision_agrees_with_float32(smollm, dtype, rel, prob):
    """bfloat16 keeps 8 significant bits (unit roundoff 2^-8 ≈ 0.4 %), float16 11 bits (2^-11 ≈
    0.05 %); over 30 blocks the errors add up to a few units of roundoff, so the norms must agree
    within ~8 units: 3 % for bfloat16, 0.5 % for float16 (measured: 0.6 % / 1.1 % mean and
    0.04 % / 0.17 %). Statistics are accumulated in float32 either way."""
    prompt = "The capital of France is"
    ref = run_trace(smollm, prompt)
    lm = load_model("smollm2-135m", device="cpu", dtype=dtype)
    assert lm.dtype == getattr(torch, dtype)
    t = run_trace(lm, prompt)
    assert t.model.dtype == dtype
    assert t.top_k[0].id == ref.top_k[0].id
    assert abs(t.top_k[0].prob - ref.top_k[0].prob) < prob
    for a, b in zip(t.layers, ref.layers):
        assert math.isclose(a.resid_norm_last, b.resid_norm_last, rel_tol=rel)
        assert math.isclose(a.resid_norm_mean, b.resid_norm_mean, rel_tol=rel)
    assert isinstance(t.layers[3].resid_norm_last, float)


def test_parse_max_memory():
    assert parse_max_memory("0=70GiB, 1=70GiB,cpu=200GiB") == {0: "70GiB", 1: "70GiB",
                                                                "cpu": "200GiB"}
    assert parse_max_memory("cpu=1000000") == {"cpu": 1000000}
    for bad in ("70GiB", "gpu0=3GB", "0=lots", "0=", "=3GB", "cpu=3 parsecs", "²=1GiB",
                "٣=1GiB", "-1=1GiB", "0=١GiB", "0=²GB"):
        with pytest.raises(BadInput, match=r"^max_memory"):
            parse_max_memory(bad)


@pytest.mark.parametrize("args,needle", [
    (["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "cuda:99"],
     "--device cuda"),
    (["--device", "tpu"], "unknown device"),
    (["--dtype", "float8"], "unknown dtype"),
    (["--device-map", "auto", "--max-memory", "0=many"], "--max-memory"),
    (["--max-memory", "cpu=1GB"], "--device-map"),
    (["--device-map", "everywhere"], "--device-map"),
])
def test_bad_device_options(llama_folder, args, needle):
    r = runner.invoke(app, ["run", "hi", "-m", tiny_gpt2(), "--random-weights", *args])
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("fptrace: error:") and needle in line and "Traceback" not in r.output


@pytest.mark.parametrize("stored", ["embedding", "lm_head"])
def test_tied_weights_offloaded_to_disk(tmp_path, stored):
    """A tied embedding / LM head placed on disk: Accelerate's offload index knows the weight
    under the one name the checkpoint stored (save_pretrained keeps the embedding's name,
    safetensors' save_model, as the GGUF cache does, the LM head's). Both must load, and the
    trace must equal the whole model's."""
    from safetensors.torch import save_model

    folder, model = make_gpt2_folder(tmp_path, n_positions=32, n_layer=2, n_embd=64)
    if stored == "lm_head":
        import os

        os.remove(folder / "model.safetensors")
        save_model(model, str(folder / "model.safetensors"))  # keeps lm_head.weight
    plain = json.loads(runner.invoke(app, ["run", "The cat sat", "-m", str(folder),
                                           "--json"]).stdout)
    r = runner.invoke(app, ["run", "The cat sat", "-m", str(folder), "--device-map", "auto",
                            "--max-memory", "cpu=1MB", "--offload-folder",
                            str(tmp_path / "off"), "--json"])
    assert r.exit_code == 0, r.stderr
    spread = json.loads(r.stdout)
    assert any(("wte" in p or "everything" in p) and "disk" in p
               for p in spread["model"]["placement"]), spread["model"]["placement"]
    assert [t["id"] for t in spread["top_k"]] == [t["id"] for t in plain["top_k"]]
    for la, lb in zip(spread["layers"], plain["layers"]):
        assert math.isclose(la["resid_norm_last"], lb["resid_norm_last"], rel_tol=1e-5)
    for ta, tb in zip(spread["top_k"], plain["top_k"]):
        assert math.isclose(ta["logit"], tb["logit"], rel_tol=1e-5, abs_tol=1e-5)
