"""Run every bad input fptrace has been tried with and write docs/bad-inputs.md: the command,
the exit code and the one line the user sees. The table is real output of the current code.

Usage: python scripts/bad_inputs.py [--out docs/bad-inputs.md]

Each command declares its cases in its folder (fptrace/commands/<name>/examples.py, a function
`bad_inputs` of the Setup returning Cases, each with its row in its folder's table: engine
folders likewise); this script makes the files they read and collects them, a table a folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fptrace.examples import Case  # noqa: E402

# the cases that belong to no command's folder
SHARED = (Case(1, "unknown command", ("trace", "hi")),)
# the heading of their table
ANY = "any command"


def tiny_folder(tmp: str) -> str:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from pathlib import Path

    from conftest import make_gpt2_folder

    return str(make_gpt2_folder(Path(tmp))[0])


def cases(tmp: str, folder: str) -> list[tuple[str, str, list[str | bytes]]]:
    """(folder, what, argv after `fptrace`) of every case, folder by folder, in the order of
    their rows: the files the cases read are made here; the cases are declared by the command
    and engine folders (`bad_inputs` in their examples.py) and by SHARED, those of no
    command."""
    p = lambda *a: os.path.join(tmp, *a)  # noqa: E731
    with open(p("notes.txt"), "w") as f:
        f.write("my notes\n")
    with open(p("prompts.txt"), "w") as f:
        f.write("The cat sat\n")
    with open(p("bad.jsonl"), "wb") as f:
        f.write(b'{"prompt": "ok"}\n{"prompt": broken\n')
    with open(p("latin1.txt"), "wb") as f:
        f.write(b"caf\xe9\n")
    with open(p("empty.txt"), "w") as f:
        f.write("\n\n")
    with open(p("random.gguf"), "wb") as f:
        f.write(b"GGUF" + os.urandom(4096))
    os.makedirs(p("pickle"), exist_ok=True)
    pk = p("pickle")
    shutil.copy(os.path.join(folder, "config.json"), pk)
    with open(os.path.join(pk, "pytorch_model.bin"), "wb") as f:
        f.write(b"\x80\x04not really")
    os.makedirs(p("remote"), exist_ok=True)
    with open(p("remote", "config.json"), "w") as f:
        json.dump({"model_type": "custom", "auto_map": {"AutoModelForCausalLM": "m.Custom"}}, f)
    open(p("remote", "model.safetensors"), "wb").close()
    from conftest import build_tiny

    build_tiny("starcoder2").save_pretrained(p("starcoder2"))
    with open(p("messages.json"), "w") as f:
        f.write('[\n  {"role": "user", "content": "hi"},\n  {"role": "user"}\n]\n')
    import gguf
    import numpy as np

    np.save(p("wide.npy"), np.zeros(7, dtype=np.float32))  # tiny-gpt2's d_model is 64
    w = gguf.GGUFWriter(p("model.gguf"), arch="llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    stats_files(tmp, folder)
    hostile_files(tmp)
    gguf_files(tmp)
    from fptrace.examples import Setup

    return [(where, c.what, list(c.argv)) for where, found in collected(Setup(tmp, folder))
            for c in found]


def collected(setup: Any) -> list[tuple[str, list[Case]]]:
    """(folder, its cases in the order of their rows) for SHARED, then each command folder,
    then each engine folder (fptrace/extensions.py's order): a folder numbers its own rows,
    so that two branches adding cases to two folders never take one number."""
    from fptrace.extensions import parts

    out = [(ANY, list(SHARED))]
    for _, module in parts("examples"):
        if hasattr(module, "bad_inputs"):
            where = module.__name__.removeprefix("fptrace.").rsplit(".", 1)[0]
            out.append((where.replace(".", "/") + "/", list(module.bad_inputs(setup))))
    for where, found in out:
        found.sort(key=lambda c: c.row)
        rows = [c.row for c in found]
        twice = sorted({r for r in rows if rows.count(r) > 1})
        if twice:
            raise SystemExit(f"two bad-input cases of {where} share row {twice[0]}: give one "
                             "the next free row")
    return out


def hostile_files(tmp: str) -> None:
    """The files of the hostile cases (issue 32): JSON nested 100,000 deep, control vectors
    with a tensor named direction.² or holding NaN, .npy files of text and of complex numbers,
    a user's file where a vector would be saved, an unknown chat role, an over-long pair, a
    million token ids."""
    import numpy as np
    from safetensors.numpy import save_file

    p = lambda *a: os.path.join(tmp, *a)  # noqa: E731
    deep = "[" * 100_000 + "]" * 100_000
    with open(p("deep.json"), "w") as f:
        f.write(deep)
    with open(p("deep-pairs.jsonl"), "w") as f:
        f.write('{"positive": "good", "negative": "bad"}\n' + deep + "\n")
    save_file({"direction.\u00b2": np.ones(32, np.float32)}, p("sup.safetensors"))
    v = np.ones(32, np.float32)
    v[3] = np.nan
    save_file({"direction.1": v}, p("nan.safetensors"))
    np.save(p("strings.npy"), np.array(["1", "2"]))
    np.save(p("complex.npy"), np.ones(32, np.complex64))
    with open(p("mynotes.npy"), "w") as f:
        f.write("my notes\n")
    with open(p("robot.json"), "w") as f:
        f.write('[{"role": "robot", "content": "hi"}]')
    with open(p("ids-1e6.txt"), "w") as f:  # a million token ids, one a line
        f.write("11\n" * 1_000_000)
    with open(p("long-pairs.jsonl"), "w") as f:
        f.write('{"positive": "good", "negative": "' + " ".join(["word"] * 60) + '"}\n')


def gguf_files(tmp: str) -> None:
    """GGUF files whose metadata llama.cpp would abort on (issue 41): no blocks, a NaN and a
    negative RMS epsilon."""
    import gguf
    import numpy as np

    for name, edit in (("blocks0", lambda w: w.add_block_count(0)),
                       ("eps-nan", lambda w: w.add_layer_norm_rms_eps(float("nan"))),
                       ("eps-negative", lambda w: w.add_layer_norm_rms_eps(-1e-5))):
        w = gguf.GGUFWriter(os.path.join(tmp, f"{name}.gguf"), arch="llama")
        edit(w)
        w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def stats_files(tmp: str, folder: str) -> None:
    """Two statistics files of two models, one claiming a newer schema, a prompt too long."""
    from pathlib import Path

    from conftest import make_gpt2_folder

    p = lambda *a: os.path.join(tmp, *a)  # noqa: E731
    other = str(make_gpt2_folder(Path(p("three")), n_layer=3)[0])
    for model, out in ((folder, "s.json"), (other, "s3.json")):
        subprocess.run([sys.executable, "-m", "fptrace", "stats", p("prompts.txt"), "-m", model,
                        "--out", p(out)], capture_output=True, check=True, cwd=ROOT)
    with open(p("s.json"), encoding="utf-8") as f:
        doc = json.load(f)
    doc["schema_version"] = "9.0"
    with open(p("newer.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    with open(p("notes.json"), "w") as f:
        f.write('{"my": "notes"}\n')
    with open(p("long.txt"), "w") as f:
        f.write("The cat sat\n" + "word " * 100 + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bad-inputs.md"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fptrace-bad-")
    folder = tiny_folder(tmp)
    rows = []
    for where, what, argv in cases(tmp, folder):
        r = subprocess.run([sys.executable, "-m", "fptrace", *argv], capture_output=True,
                           text=True, errors="replace", timeout=300, cwd=ROOT)
        err = [l for l in r.stderr.splitlines() if l.strip()]
        last = err[-1] if err else ""
        if "Traceback" in r.stderr:
            last = "TRACEBACK (a bug)"
        # the temporary folder named as $TMP before a long argument is cut (cut first, a
        # machine's path showed in the page)
        words = (repr(a)[1:] if isinstance(a, bytes) else a.replace(tmp, "$TMP") for a in argv)
        shown = " ".join(a if len(a) < 40 else a[:20] + "…" for a in words)
        rows.append((where, what, shown, r.returncode, last.replace(tmp, "$TMP")))
        print(f"{r.returncode:>3}  {what}", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    lines = ["# Bad input, tried on purpose", "",
             "Generated by `python scripts/bad_inputs.py` from real runs of the current code "
             "(`$TMP` is the script's temporary folder; `tiny-gpt2` a 2-block GPT-2 saved "
             "there). Each row is what a user sees: the exit code and the one line on stderr. "
             "Exit codes: 1 some batch prompts failed (their records say why), 2 bad input, "
             "3 the forward pass failed or ran out of memory, 4 NaN/Inf in the trace, 5 explain "
             "does not match the model, 74 an output could not be written (a full disk), 130 "
             "interrupted. The tests in `tests/test_hardening.py` also fuzz every command with "
             "generated prompts and options, corrupt weights with NaN/Inf, truncate and falsify "
             "safetensors and GGUF files, fill the disk during `batch` and `report`, and "
             "simulate running out of memory. A table a folder: each command or engine "
             "folder declares its cases in its examples.py, its rows numbered on their own."]
    esc = lambda t: t.replace("|", "\\|")  # noqa: E731
    for k, (where, what, cmd, code, last) in enumerate(rows):
        if k == 0 or rows[k - 1][0] != where:
            title = where if where == ANY else f"`fptrace/{where}`"
            lines += ["", f"## {title}", "",
                      "| bad input | command (`fptrace …`) | exit | what the user sees (stderr) |",
                      "|---|---|---:|---|"]
        lines.append(f"| {esc(what)} | `{esc(cmd)}` | {code} | {esc(last)} |")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
