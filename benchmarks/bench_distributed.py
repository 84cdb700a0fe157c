"""Ray and tensor parallelism on one 2-core CPU machine, as ratios against one process.

Method (figures in benchmarks/README.md):
- Ray: the bundled model on 64 prompts of prompts/ (the capital and fact sets, repeated), in
  fresh processes: the local `fptrace batch` against `--ray auto --workers 1` and `--workers 2`,
  each inside a private network and PID namespace (`unshare --net --pid --fork --mount-proc`,
  loopback only) so that the local Ray cluster it starts ends with it. Wall time of the whole
  command (start-up, Ray's cluster, the model load per actor, the tracing); median of 3.
- Tensor parallelism: a random Llama (d = 512, 8 heads, 4 KV heads, 8 blocks, vocab 50,257)
  saved once; `fptrace run` of a 128-token prompt in one process against `--tp 2` (two gloo
  ranks through torch's launcher); wall time of the command, median of 3.

Usage: python benchmarks/bench_distributed.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _wall(cmd: list[str], namespace: bool = False) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               RAY_USAGE_STATS_ENABLED="0")
    if namespace:
        cmd = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "bash", "-c",
               "ip link set lo up\n" + " ".join(f"'{c}'" for c in cmd)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{cmd} failed: {r.stderr[-1500:]}")
    return time.perf_counter() - t0


def ray(tmp: Path) -> None:
    lines = []
    for name in ("capitals.txt", "facts.jsonl"):
        path = ROOT / "prompts" / name
        for line in path.read_text().splitlines():
            if line.strip():
                lines.append(line if name.endswith(".txt") else
                             __import__("json").loads(line)["prompt"])
    prompts = tmp / "p.txt"
    prompts.write_text("\n".join((lines * 8)[:64]) + "\n")
    runs = {"local": [], "ray, 1 worker": [], "ray, 2 workers": []}
    for k in range(3):
        for label in runs:
            out = tmp / f"{label.replace(' ', '_').replace(',', '')}-{k}.jsonl"
            cmd = [PY, "-m", "fptrace", "batch", str(prompts), "--out", str(out)]
            if label != "local":
                cmd += ["--ray", "auto", "--workers", label.split(", ")[1][0]]
            runs[label].append(_wall(cmd, namespace=label != "local"))
    base = statistics.median(runs["local"])
    for label, ts in runs.items():
        t = statistics.median(ts)
        print(f"batch {label:>15}: {t:6.1f} s  ({t / base:.2f}× the local batch)")


def tp(tmp: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_llama_folder  # the tokenizer files

    folder = make_llama_folder(tmp)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(num_hidden_layers=8, hidden_size=512, intermediate_size=1376,
                                 num_attention_heads=8, num_key_value_heads=4, vocab_size=50257,
                                 max_position_embeddings=256, bos_token_id=50256,
                                 eos_token_id=50256)).save_pretrained(folder)
    prompt = " ".join(["word"] * 127)
    runs = {"one process": [], "--tp 2": []}
    for _ in range(3):
        for label in runs:
            cmd = [PY, "-m", "fptrace", "run", prompt, "-m", str(folder), "--json"]
            runs[label].append(_wall(cmd + (["--tp", "2"] if label != "one process" else [])))
    base = statistics.median(runs["one process"])
    for label, ts in runs.items():
        t = statistics.median(ts)
        print(f"run {label:>12}: {t:6.1f} s  ({t / base:.2f}× one process)")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        ray(Path(d))
        tp(Path(d))
