"""Issue 41 (hardening), llama.cpp and GGUF loading: a copy of the bundled GGUF with one metadata
field patched. llama.cpp asserts on some values and aborts the process (exit 134, a server with
it): every such file is refused in one line (exit 2) before either engine reads it, by the one
check of models/gguf_metadata.py. Each case runs through the command line in a subprocess, so an
abort can never take pytest down; the abort case also through a server, which stays up."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_llamacpp_faults import seeded
from test_serve import stop_server
from typer.testing import CliRunner

from fptrace import serving
from fptrace.cli.main import app
from fptrace.engines.llamacpp import binding as B

pytestmark = pytest.mark.skipif(B.installed_version() is None,
                                reason="the [llamacpp] extra (xllamacpp) is not installed")

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The capital of France is"
runner = CliRunner()


def fptrace(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """`fptrace ARGS` in its own process, with no server unless `env` names one."""
    full = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **{serving.SWITCH_ENV: "off"})
    full.update(env)
    return subprocess.run([sys.executable, "-m", "fptrace", *args], capture_output=True,
                          text=True, timeout=timeout, env=full, check=False)


def one_line(r: subprocess.CompletedProcess, needle: str, code: int = 2) -> str:
    """The one error line of a run that exited `code`; no traceback, no abort."""
    assert r.returncode == code, (r.returncode, r.stderr[-1500:])
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("fptrace: error: ")]
    assert len(lines) == 1 and needle in lines[0], r.stderr[-1500:]
    assert "Traceback" not in r.stderr and "GGML_ASSERT" not in r.stderr
    return lines[0]


# the values llama.cpp aborts on (measured on the pinned build: exit 134, GGML_ASSERT
# `n_layer_all > 0 && n_layer_all <= LLAMA_MAX_LAYERS` when loading, `eps >= 0.0f` in the first
# pass)
ABORTS = [
    ("llama.block_count", 0, "llama.block_count is 0"),
    ("llama.block_count", 600, "llama.block_count is 600"),
    ("llama.attention.layer_norm_rms_epsilon", math.nan, "layer_norm_rms_epsilon is nan"),
    ("llama.attention.layer_norm_rms_epsilon", -1e-5, "layer_norm_rms_epsilon is -1e-05"),
]
# values llama.cpp refused with a reason nobody saw ("architecture 'llama' is unknown") or ran
# into non-finite logits
REFUSED = [
    ("llama.attention.head_count", 0, "head_count is 0"),
    ("llama.attention.head_count_kv", 2, "head_count is 9 and llama.attention.head_count_kv 2"),
    ("llama.embedding_length", 577, "embedding_length is 577"),
    ("llama.context_length", 0, "context_length is 0"),
    ("llama.vocab_size", 100, "vocab_size is 100 but token_embd.weight has 49152 rows"),
    ("llama.rope.freq_base", math.nan, "rope.freq_base is nan"),
]


@pytest.fixture(scope="module")
def where(gguf):
    """key -> (byte offset, dtype) of each scalar value in the bundled GGUF: GGUFReader parses
    the file once (~7 s), each case then writes its value into a copy directly."""
    import numpy as np
    from gguf import GGUFReader

    reader = GGUFReader(gguf)
    base = reader.data.__array_interface__["data"][0]
    out = {}
    for key, f in reader.fields.items():
        if len(f.types) == 1 and f.data:
            part = f.parts[f.data[0]]
            out[key] = (part.__array_interface__["data"][0] - base, np.dtype(part.dtype))
    return out


def patched(gguf: str, folder: Path, key: str, value: float, where: dict) -> str:
    """A copy of the bundled GGUF with `key` set to `value`, in place."""
    import numpy as np

    path = folder / f"{key.split('.')[-1]}-{value}.gguf"
    shutil.copyfile(gguf, path)
    at, dtype = where[key]
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(np.array([value], dtype=dtype).tobytes())
    return str(path)


@pytest.mark.system
@pytest.mark.parametrize("key,value,needle", ABORTS + REFUSED)
def test_metadata_llamacpp_cannot_run_is_one_line(gguf, where, tmp_path, key, value, needle):
    path = patched(gguf, tmp_path, key, value, where)
    line = one_line(fptrace("run", PROMPT, "-m", path, "--engine", "llama.cpp"), needle)
    assert "unknown" not in line


@pytest.mark.system
def test_transformers_refuses_no_blocks_in_the_same_words(gguf, where, tmp_path):
    """transformers read block_count 0 into an IndexError (exit 70)."""
    path = patched(gguf, tmp_path, "llama.block_count", 0, where)
    one_line(fptrace("run", PROMPT, "-m", path, FPTRACE_CACHE_DIR=str(tmp_path / "cache")),
             "llama.block_count is 0: it must be from 1 to 512")


@pytest.mark.system
def test_diff_model_b_that_would_abort_is_one_line(gguf, where, tmp_path):
    """The seeded-fault workflow of docs/llamacpp.md: the fault refused before any load."""
    path = patched(gguf, tmp_path, "llama.attention.layer_norm_rms_epsilon", math.nan, where)
    start = time.perf_counter()
    r = fptrace("diff", PROMPT, "-m", gguf, "--model-b", path, "--engine-b", "llama.cpp",
                FPTRACE_CACHE_DIR=str(tmp_path / "cache"))
    one_line(r, "layer_norm_rms_epsilon is nan")
    assert time.perf_counter() - start < 60  # nothing was dequantized


@pytest.mark.system
def test_a_server_refuses_it_and_stays_up(gguf, where, tmp_path):
    path = patched(gguf, tmp_path, "llama.block_count", 0, where)
    sock = tmp_path / "serve" / "s.sock"
    env = {serving.SOCKET_ENV: str(sock), serving.SWITCH_ENV: "on"}
    started = fptrace("serve", "--idle-timeout", "120", **env)
    assert started.returncode == 0, started.stderr
    try:
        pid = serving.request({"op": "status"}, str(sock))["pid"]
        one_line(fptrace("run", PROMPT, "-m", path, "--engine", "llama.cpp", **env),
                 "llama.block_count is 0")
        status = fptrace("serve", "--status", "--json", **env)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["pid"] == pid  # the same server, alive
    finally:
        stop_server(sock)


@pytest.mark.system
def test_a_known_architecture_that_fails_to_load_says_why(gguf, where, tmp_path):
    """block_count 31 on a file of 30 blocks: llama.cpp knows 'llama' and says what it missed."""
    path = patched(gguf, tmp_path, "llama.block_count", 31, where)
    line = one_line(fptrace("run", PROMPT, "-m", path, "--engine", "llama.cpp"),
                    "(architecture 'llama', which this build knows)")
    assert "'blk.30.attn_norm.weight' not found" in line and "unknown" not in line


@pytest.mark.system
def test_a_prompt_beyond_the_context_is_refused_as_transformers_does(gguf, where, tmp_path):
    """llama.cpp traced it silently: a context_length of 4 and a 5-token prompt."""
    path = patched(gguf, tmp_path, "llama.context_length", 4, where)
    line = one_line(fptrace("run", PROMPT, "-m", path, "--engine", "llama.cpp"),
                    "the prompt is 5 tokens but context_length-4.gguf reads at most 4; "
                    "shorten it")
    from fptrace.models.prompts import too_long

    assert line.endswith(str(too_long(5, 4, "context_length-4.gguf", truncate=False)))


@pytest.mark.system
@pytest.mark.slow
def test_a_prompt_beyond_the_bundled_context_is_refused_before_the_pass(gguf):
    """8,300 words: llama.cpp failed after ~96 s with an allocation error."""
    start = time.perf_counter()
    one_line(fptrace("run", "word " * 8300, "-m", gguf, "--engine", "llama.cpp", timeout=60),
             "the prompt is 8301 tokens but SmolLM2-135M-Instruct.Q4_1.gguf reads at most 8192")
    assert time.perf_counter() - start < 30


@pytest.mark.slow
def test_an_inf_weight_is_named_not_a_wrong_mapping(smollm, gguf, tmp_path):
    """One Inf in block 3's attention norm: llama.cpp's stream is NaN from block 3 on, which
    the stream check read as 'the graph's names are not mapped as fptrace assumes' (exit 5)."""

    def inf_weight(reader):
        t = next(t for t in reader.tensors if t.name == "blk.3.attn_norm.weight")
        t.data.reshape(-1)[5] = math.inf

    path = seeded(gguf, tmp_path, "inf", inf_weight)
    r = runner.invoke(app, ["diff", PROMPT, "-m", gguf, "--model-b", path, "--engine-b",
                            "llama.cpp"])
    assert r.exit_code == 1, (r.exit_code, r.stderr[-800:])  # not comparable: diff's own code
    assert "not mapped" not in r.stderr + r.stdout
    text = " ".join(r.stdout.split())
    assert "llama.cpp's stream holds NaN or Inf from block 3 on" in text
    assert "--snippet D" not in text


def test_emulate_all_with_another_step_is_its_own_line():
    r = runner.invoke(app, ["diff", PROMPT, "--engine-b", "llama.cpp", "--emulate", "all,kv"])
    assert r.exit_code == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("fptrace: error: ")]
    assert len(lines) == 1 and "'all' is every step" in lines[0], r.stderr
    assert "unknown" not in lines[0]


def test_the_header_reader_agrees_with_gguf(gguf):
    """models/gguf_metadata.py's parser against the gguf package's GGUFReader (~7 s)."""
    from gguf import GGUFReader

    from fptrace.models.gguf_metadata import read

    meta = read(gguf)
    reader = GGUFReader(gguf)
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if len(f.types) == 1:
            want = f.contents()
            got = meta.values[key]
            assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
        else:
            assert meta.array_lengths[key] == len(f.data), key
    assert meta.shapes == {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
