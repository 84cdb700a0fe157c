"""fptrace batch: inputs, records equal to single runs, resume after a kill, bad input."""

from __future__ import annotations

import io
import json
import math
import signal
import subprocess
import sys
import time

import pytest
from conftest import make_gpt2_folder
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.batch.core import OutFile, record_line
from fptrace.core.inputs import PromptItem, read_inputs
from fptrace.errors import BadInput

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder, _ = make_gpt2_folder(tmp_path_factory.mktemp("batch-model"))
    return str(folder)


def lines_of(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ---- inputs ----

def test_txt_and_jsonl_inputs(tmp_path):
    (tmp_path / "a.txt").write_text("The cat sat\n\n  \nThe capital of France is\n")
    (tmp_path / "b.jsonl").write_text(
        '{"id": "q1", "prompt": "Rome is in", "answer": " Italy", "tags": ["geo"]}\n'
        '{"prompt": "no id here"}\n')
    items = read_inputs([str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")])
    assert [(i.id, i.prompt) for i in items] == [
        ("a:1", "The cat sat"), ("a:4", "The capital of France is"), ("q1", "Rome is in"),
        ("b:2", "no id here")]
    assert items[2].extra == {"answer": " Italy", "tags": ["geo"]}
    assert items[1].source.endswith("a.txt:4")
    # a folder holds both files, sorted
    assert [i.id for i in read_inputs([str(tmp_path)])] == [i.id for i in items]


def test_bad_lines_become_error_items(tmp_path):
    (tmp_path / "p.jsonl").write_bytes(
        b'{"prompt": "fine"}\n{"prompt": broken\n["not", "an object"]\n'
        b'{"prompt": "caf\xe9 latin-1"}\n{"prompt": 3}\n')
    items = read_inputs([str(tmp_path / "p.jsonl")])
    assert items[0].error is None
    assert "p.jsonl:2" in items[1].error and "malformed JSON" in items[1].error
    assert "p.jsonl:3" in items[2].error and '"prompt"' in items[2].error
    assert "p.jsonl:4" in items[3].error and "UTF-8" in items[3].error
    assert "p.jsonl:5" in items[4].error
    (tmp_path / "t.txt").write_bytes(b"ok\n\xff\xfe bad\n")
    bad = read_inputs([str(tmp_path / "t.txt")])
    assert bad[0].error is None and "t.txt:2" in bad[1].error


def test_stdin_text_and_jsonl():
    items = read_inputs(["-"], stdin=io.BytesIO(b"one\ntwo\n"))
    assert [i.prompt for i in items] == ["one", "two"] and items[0].id == "stdin:1"
    items = read_inputs(["-"], stdin=io.BytesIO(b'\n{"id": 7, "prompt": "x"}\n'))
    assert items[0].id == "7" and items[0].prompt == "x"


def test_input_errors(tmp_path):
    with pytest.raises(BadInput, match="no such input file"):
        read_inputs([str(tmp_path / "missing.txt")])
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(BadInput, match="no prompts"):
        read_inputs([str(tmp_path / "blank.txt")])
    (tmp_path / "in.txt").write_text("a\n")
    (tmp_path / "dup.jsonl").write_text('{"id": "in:1", "prompt": "b"}\n')
    with pytest.raises(BadInput, match="duplicate id 'in:1' at .*dup.jsonl:1"):
        read_inputs([str(tmp_path / "in.txt"), str(tmp_path / "dup.jsonl")])
    with pytest.raises(BadInput, match="no inputs"):
        read_inputs([])


def test_wrong_input_suffix(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(BadInput, match=".txt"):
        read_inputs([str(tmp_path / "x.csv")])


# ---- the output file ----

def _record(i):
    return record_line(PromptItem(f"p{i}", "x", "f:1"), error="boom", error_type="BadInput")


def test_out_file_repairs_a_partial_last_line(tmp_path):
    out = tmp_path / "o.jsonl"
    full = _record(1) + "\n" + _record(2) + "\n"
    out.write_text(full + _record(3)[:25])  # a kill in the middle of the third line
    f = OutFile(str(out)).open()
    assert f.done == {"p1", "p2"}
    f.append([_record(3)])
    f.close()
    assert [r["id"] for r in lines_of(out)] == ["p1", "p2", "p3"]


def test_out_file_refuses_other_files(tmp_path):
    other = tmp_path / "notes.jsonl"
    other.write_text('{"name": "my data"}\n')
    with pytest.raises(BadInput, match="not fptrace batch output"):
        OutFile(str(other)).open()
    with pytest.raises(BadInput, match="not fptrace batch output"):
        OutFile(str(other), force=True).open()  # --force never overwrites a foreign file
    assert other.read_text() == '{"name": "my data"}\n'
    text = tmp_path / "essay.txt"
    text.write_text("no newline at all")
    with pytest.raises(BadInput, match="not fptrace batch output"):
        OutFile(str(text)).open()
    with pytest.raises(BadInput, match="is a folder"):
        OutFile(str(tmp_path)).open()
    with pytest.raises(BadInput, match="does not exist"):
        OutFile(str(tmp_path / "no" / "o.jsonl")).open()


def test_out_file_is_locked(tmp_path):
    out = tmp_path / "o.jsonl"
    first = OutFile(str(out)).open()
    try:
        with pytest.raises(BadInput, match="another fptrace batch"):
            OutFile(str(out)).open()
    finally:
        first.close()
    OutFile(str(out)).open().close()  # free again once closed


# ---- through the command ----

def test_batch_records_equal_single_runs(tmp_path, smollm):
    """Prompts of very different lengths in one padded batch give the records that
    `fptrace run --json` gives for each alone."""
    prompts = ["Hi", "The capital of France is",
               "Once upon a time, in a small village at the edge of a dark forest, there lived "
               "an old clockmaker who had never once left the valley where he was born, and"]
    src = tmp_path / "p.txt"
    src.write_text("\n".join(prompts) + "\n")
    out = tmp_path / "o.jsonl"
    r = invoke("batch", str(src), "--out", str(out), "--batch-size", "3")
    assert r.exit_code == 0, r.stderr
    assert "traced 3, failed 0, skipped 0" in r.stderr
    recs = lines_of(out)
    assert [len(x["tokens"]) for x in recs][0] < 5 < 30 < len(recs[2]["tokens"])
    for rec, prompt in zip(recs, prompts):
        single = json.loads(invoke("run", prompt, "--json").stdout)
        assert rec["prompt"] == prompt
        assert rec["tokens"] == single["tokens"]
        assert [t["id"] for t in rec["top_k"]] == [t["id"] for t in single["top_k"]]
        for a, b in zip(rec["top_k"], single["top_k"]):
            assert math.isclose(a["prob"], b["prob"], rel_tol=1e-4, abs_tol=1e-6)
        for la, lb in zip(rec["layers"], single["layers"]):
            for key in ("resid_norm_last", "resid_norm_mean", "added_norm_last", "cos_prev"):
                if la[key] is not None:
                    assert math.isclose(la[key], lb[key], rel_tol=1e-4, abs_tol=1e-4), key
            assert la["lens_id"] == lb["lens_id"]
        assert rec["shapes"] == single["shapes"]


def test_failed_prompt_is_a_record_and_the_batch_goes_on(tmp_path, tiny_folder):
    src = tmp_path / "p.jsonl"
    src.write_text('{"id": "ok1", "prompt": "The cat sat"}\n'
                   '{"id": "long", "prompt": "' + "word " * 60 + '"}\n'
                   '{"id": "bad", "prompt": oops}\n'
                   '{"id": "ok2", "prompt": "Another short one", "answer": 4}\n')
    out = tmp_path / "o.jsonl"
    r = invoke("batch", str(src), "--model", tiny_folder, "--out", str(out), "-b", "2")
    assert r.exit_code == 1  # some prompts failed
    assert "traced 2, failed 2" in r.stderr
    recs = {x["id"]: x for x in lines_of(out)}
    assert set(recs) == {"ok1", "long", "p:3", "ok2"}  # a line that does not parse: file:line
    assert recs["long"]["kind"] == "error" and "32" in recs["long"]["error"]
    assert recs["p:3"]["kind"] == "error" and "p.jsonl:3" in recs["p:3"]["error"]
    assert recs["ok2"]["kind"] == "trace" and recs["ok2"]["extra"] == {"answer": 4}
    # --truncate turns the long prompt into a trace of its last 32 tokens
    out2 = tmp_path / "o2.jsonl"
    invoke("batch", str(src), "--model", tiny_folder, "--out", str(out2), "--truncate")
    long = {x["id"]: x for x in lines_of(out2)}["long"]
    assert long["kind"] == "trace" and len(long["tokens"]) == 32 and long["truncated"] > 0


def test_resume_force_and_options(tmp_path, tiny_folder):
    src = tmp_path / "p.txt"
    src.write_text("one\ntwo\nthree\n")
    out = tmp_path / "o.jsonl"
    assert invoke("batch", str(src), "-m", tiny_folder, "-o", str(out)).exit_code == 0
    src.write_text("one\ntwo\nthree\nfour\n")
    r = invoke("batch", str(src), "-m", tiny_folder, "-o", str(out))
    assert r.exit_code == 0 and "traced 1, failed 0, skipped 3" in r.stderr
    assert [x["id"] for x in lines_of(out)] == ["p:1", "p:2", "p:3", "p:4"]
    r = invoke("batch", str(src), "-m", tiny_folder, "-o", str(out), "--top-k", "3")
    assert r.exit_code == 2 and "--top-k 10" in r.stderr and "--force" in r.stderr
    r = invoke("batch", str(src), "-m", tiny_folder, "-o", str(out), "--top-k", "3", "--force")
    assert r.exit_code == 0 and "traced 4" in r.stderr
    assert all(len(x["top_k"]) == 3 for x in lines_of(out))


def test_out_to_stdout_and_bad_out(tmp_path, tiny_folder):
    src = tmp_path / "p.txt"
    src.write_text("one\ntwo\n")
    r = invoke("batch", str(src), "-m", tiny_folder, "-o", "-")
    assert r.exit_code == 0
    assert [json.loads(l)["id"] for l in r.stdout.splitlines()] == ["p:1", "p:2"]
    mine = tmp_path / "mine.txt"
    mine.write_text("precious notes\n")
    r = invoke("batch", str(src), "-m", tiny_folder, "-o", str(mine))
    assert r.exit_code == 2 and "refusing to overwrite" in r.stderr
    assert mine.read_text() == "precious notes\n"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = invoke("batch", str(empty), "-m", tiny_folder, "-o", str(tmp_path / "o.jsonl"))
    assert r.exit_code == 2 and "no prompts" in r.stderr and "Traceback" not in r.output


@pytest.mark.system
def test_killed_batch_resumes_without_duplicates(tmp_path, tiny_folder):
    """A real process, killed with SIGKILL mid-way, then run again to the end."""
    n = 400
    src = tmp_path / "many.txt"
    src.write_text("".join(f"Prompt number {i} about a cat on a mat\n" for i in range(n)))
    out = tmp_path / "o.jsonl"
    cmd = [sys.executable, "-m", "fptrace", "batch", str(src), "--model", tiny_folder,
           "--out", str(out), "--batch-size", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 40:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the batch ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = out.read_bytes().count(b"\n")
    assert 40 <= written < n
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"skipped {written}" in done.stderr
    ids = [r["id"] for r in lines_of(out)]  # every line is complete JSON
    assert sorted(ids) == sorted(f"many:{i + 1}" for i in range(n))  # each exactly once


@pytest.mark.system
def test_sigterm_stops_cleanly(tmp_path, tiny_folder):
    src = tmp_path / "many.txt"
    src.write_text("".join(f"Prompt {i}\n" for i in range(400)))
    out = tmp_path / "o.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "fptrace", "batch", str(src), "--model",
                             tiny_folder, "--out", str(out), "-b", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out.exists() and out.stat().st_size > 0):
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "run the same command again to resume" in err
    assert out.read_bytes().endswith(b"\n")  # stopped between records
    lines_of(out)


def test_resume_refuses_random_weights_mixed_with_real(tmp_path, tiny_folder):
    src = tmp_path / "p.txt"
    src.write_text("one\n")
    out = tmp_path / "o.jsonl"
    assert invoke("batch", str(src), "-m", tiny_folder, "-o", str(out)).exit_code == 0
    src.write_text("one\ntwo\n")
    r = invoke("batch", str(src), "-m", tiny_folder, "-o", str(out), "--random-weights")
    assert r.exit_code == 2 and "--force" in r.stderr
    assert len(lines_of(out)) == 1


def test_ray_without_the_extra_says_how_to_install(tmp_path, monkeypatch):
    import sys

    from conftest import tiny_gpt2

    monkeypatch.setitem(sys.modules, "ray", None)  # as if `pip install "fptrace[ray]"` had not run
    p = tmp_path / "p.txt"
    p.write_text("The cat sat\n")
    r = CliRunner().invoke(app, ["batch", str(p), "--out", str(tmp_path / "o.jsonl"), "-m",
                                 tiny_gpt2(), "--random-weights", "--ray", "auto"])
    assert r.exit_code == 2
    assert 'pip install "fptrace[ray]"' in r.stderr.strip().splitlines()[-1]
