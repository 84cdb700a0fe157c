"""Run every bad input fptrace has been tried with and write docs/bad-inputs.md: the command,
the exit code and the one line the user sees. The table is real output of the current code.

Usage: python scripts/bad_inputs.py [--out docs/bad-inputs.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_folder(tmp: str) -> str:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from pathlib import Path

    from conftest import make_gpt2_folder

    return str(make_gpt2_folder(Path(tmp))[0])


def cases(tmp: str, folder: str) -> list[tuple[str, list[str], dict]]:
    """(what, argv after `fptrace`, setup notes)"""
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
    m = ["-m", folder]
    stats_files(tmp, folder)
    return [
        ("empty prompt", ["run", "  "]),
        # bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape)
        ("invalid UTF-8 bytes in the prompt", ["run", b"caf\xe9", *m]),
        ("prompt longer than the context", ["run", "word " * 100, *m]),
        ("unknown model", ["run", "hi", "--model", "gpt-3"]),
        ("missing .gguf file", ["run", "hi", "--model", p("nope.gguf")]),
        ("corrupt .gguf file", ["run", "hi", "--model", p("random.gguf")]),
        ("hub id not in the cache, offline", ["run", "hi", "--model", "nobody/nothing"]),
        ("pickle weights", ["run", "hi", "--model", pk]),
        ("model code without --trust-remote-code", ["run", "hi", "--model", p("remote")]),
        ("unknown device", ["run", "hi", *m, "--device", "tpu"]),
        ("CUDA asked for, none here", ["run", "hi", *m, "--device", "cuda"]),
        ("unknown dtype", ["run", "hi", *m, "--dtype", "float8"]),
        ("malformed --max-memory", ["run", "hi", *m, "--device-map", "auto",
                                    "--max-memory", "0=lots"]),
        ("--top-k 0", ["run", "hi", *m, "--top-k", "0"]),
        ("--snippet -1", ["run", "hi", *m, "--snippet", "-1"]),
        ("plot into a missing folder", ["run", "hi", *m, "--plot", p("no", "t.png")]),
        ("plot format the extension does not name", ["run", "hi", *m, "--plot", p("t.xyz")]),
        ("--layer out of range", ["explain", "hi", *m, "--layer", "7"]),
        ("--head out of range", ["explain", "hi", *m, "--head", "9"]),
        ("--top-p outside (0, 1]", ["explain", "hi", *m, "--top-p", "1.5"]),
        ("negative temperature", ["explain", "hi", *m, "--temperature", "-1"]),
        ("family with no walkthrough", ["explain", "hi", "--model", p("starcoder2")]),
        ("not an integer", ["run", "hi", *m, "--top-k", "many"]),
        ("missing argument", ["explain"]),
        ("unknown command", ["trace", "hi"]),
        ("-n 0", ["generate", "hi", *m, "-n", "0"]),
        ("-n beyond the context", ["generate", "hi", *m, "-n", "100"]),
        ("shapes: negative --seq-len", ["shapes", "--seq-len", "-3"]),
        ("shapes: no offline tokenizer", ["shapes", "hello", "--model", "mistral-7b"]),
        ("batch: missing input file", ["batch", p("none.txt"), "-o", p("o.jsonl"), *m]),
        ("batch: empty input", ["batch", p("empty.txt"), "-o", p("o.jsonl"), *m]),
        ("batch: --out is a folder", ["batch", p("prompts.txt"), "-o", tmp, *m]),
        ("batch: --out is someone else's file", ["batch", p("prompts.txt"), "-o",
                                                 p("notes.txt"), *m]),
        ("batch: malformed .jsonl line", ["batch", p("bad.jsonl"), "-o", p("b.jsonl"), *m]),
        ("batch: invalid UTF-8", ["batch", p("latin1.txt"), "-o", p("c.jsonl"), *m]),
        ("report: not an .html path", ["report", "hi", *m, "--out", p("r.txt")]),
        ("stats: --merge of two models' statistics", ["stats", "--merge", p("s.json"),
                                                      p("s3.json")]),
        ("stats: a statistics file of a newer fptrace", ["stats", "--merge", p("newer.json")]),
        ("stats: --out exists, without --resume", ["stats", p("prompts.txt"), *m, "--out",
                                                   p("s.json")]),
        ("stats: --out is someone else's file", ["stats", p("prompts.txt"), *m, "--out",
                                                 p("notes.json"), "--force"]),
        ("stats: a prompt longer than the context", ["stats", p("long.txt"), *m]),
        ("--chat on a model without a chat template", ["run", "--chat", "hi", *m]),
        ("--chat and --messages together", ["run", "--chat", "--messages",
                                            p("messages.json"), *m]),
        ("a messages file with a message lacking its content", ["run", "--messages",
                                                               p("messages.json"), *m]),
        ("a missing messages file", ["run", "--messages", p("nope.json"), *m]),
        ("--target of two tokens", ["attribute", "The cat sat", *m, "--target", " catsat"]),
        ("--noise not in the prompt", ["patch", "The cat sat", *m, "--noise", " dog"]),
        ("--noise occurring twice", ["patch", "the cat and the cat", *m, "--noise", " cat"]),
        ("diff: a trace file that does not exist", ["diff", p("nope.json"), p("other.json")]),
        ("attribute --qk: block out of range", ["attribute", "The cat sat", *m, "--qk", "5.0"]),
        ("attribute --qk: head out of range", ["attribute", "The cat sat", *m, "--qk", "1.2"]),
        ("attribute --qk: a key after the query", ["attribute", "The cat sat", *m, "--qk",
                                                   "1.0", "--query", "1", "--key", "2"]),
        ("attribute --qk with --versus", ["attribute", "The cat sat", *m, "--qk", "1.0",
                                          "--versus", " dog"]),
        ("diff --deep: --deep-layers out of range", ["diff", "hi", *m, "--model-b", folder,
                                                     "--deep", "--deep-layers", "2-5"]),
        ("diff --deep with two prompts", ["diff", "hi", "ho", *m, "--deep"]),
        ("diff: a quantization that does not exist", ["diff", "hi", *m, "--quantize-b", "int3"]),
        ("diff: quantizing random weights", ["diff", "hi", *m, "--random-weights",
                                             "--quantize-b", "int8"]),
        ("steer: a vector of another width", ["steer", "hi", *m, "--vector", p("wide.npy"),
                                              "--layer", "1"]),
        ("steer: a GGUF that is not a control vector", ["steer", "hi", *m, "--vector",
                                                        p("model.gguf")]),
        ("steer: --layer out of range", ["steer", "hi", *m, "--token", " cat", "--layer", "5"]),
        ("steer: a strength that is not a number", ["steer", "hi", *m, "--token", " cat",
                                                    "--layer", "1", "--scale", "0,two"]),
        ("steer: --add without --subtract", ["steer", "hi", *m, "--add", " love",
                                             "--layer", "1"]),
        ("ablate: a head out of range", ["ablate", "hi", *m, "--head", "1.9"]),
        ("ablate: nothing to remove", ["ablate", "hi", *m]),
        # ---- issue 32: hostile inputs (appended block; files made by hostile_cases) ----
        *hostile_cases(tmp, m),
        # ---- end of issue 32's block ----
    ]


def hostile_cases(tmp: str, m: list[str]) -> list[tuple[str, list[str]]]:
    """Issue 32's cases: digits that are not ASCII, deep JSON, files fptrace did not write,
    vectors that are not finite real vectors, options that name themselves."""
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
    with open(p("long-pairs.jsonl"), "w") as f:
        f.write('{"positive": "good", "negative": "' + " ".join(["word"] * 60) + '"}\n')
    return [
        ("steer: a token id in Unicode digits", ["steer", "hi", *m, "--token", "#\u00b2",
                                                 "--layer", "1"]),
        ("--max-memory: a GPU number in Unicode digits", ["run", "hi", *m, "--device-map",
                                                          "auto", "--max-memory", "\u00b2=1GiB"]),
        ("steer: a control vector's tensor named direction.\u00b2",
         ["steer", "hi", *m, "--vector", p("sup.safetensors")]),
        ("steer: a control vector holding NaN", ["steer", "hi", *m, "--vector",
                                                 p("nan.safetensors")]),
        ("steer: a .npy of strings", ["steer", "hi", *m, "--vector", p("strings.npy"),
                                      "--layer", "1"]),
        ("steer: a complex .npy", ["steer", "hi", *m, "--vector", p("complex.npy"),
                                   "--layer", "1"]),
        ("steer: a strength that overflows", ["steer", "hi", *m, "--token", " cat", "--layer",
                                              "1", "--scale", "0,1e30"]),
        ("steer: --add is empty", ["steer", "hi", *m, "--add", "", "--subtract", "x",
                                   "--layer", "1"]),
        ("steer: a --pairs line longer than the context",
         ["steer", "hi", *m, "--pairs", p("long-pairs.jsonl"), "--layer", "1"]),
        ("steer: --save-vector onto someone else's file",
         ["steer", "hi", *m, "--token", " cat", "--layer", "1", "--save-vector",
          p("mynotes.npy")]),
        ("run --messages: 100,000 nested lists", ["run", *m, "--messages", p("deep.json")]),
        ("steer --pairs: 100,000 nested lists", ["steer", "hi", *m, "--pairs",
                                                 p("deep-pairs.jsonl"), "--layer", "1"]),
        ("run --messages: an unknown role", ["run", *m, "--messages", p("robot.json")]),
        ("run: --system is empty", ["run", "hi", *m, "--system", ""]),
        ("run --plot onto someone else's file", ["run", "hi", *m, "--plot", p("notes.txt")]),
        ("diff: a negative --tolerance", ["diff", "hi", *m, "--dtype-b", "float16",
                                          "--tolerance=-1"]),
        ("diff: quantizing GPT-2's Conv1D layers", ["diff", "hi", *m, "--quantize-b", "int4"]),
    ]


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
    for what, argv in cases(tmp, folder):
        r = subprocess.run([sys.executable, "-m", "fptrace", *argv], capture_output=True,
                           text=True, errors="replace", timeout=300, cwd=ROOT)
        err = [l for l in r.stderr.splitlines() if l.strip()]
        last = err[-1] if err else ""
        if "Traceback" in r.stderr:
            last = "TRACEBACK (a bug)"
        shown = " ".join(repr(a)[1:] if isinstance(a, bytes) else
                         a if len(a) < 40 else a[:20] + "…" for a in argv)
        rows.append((what, shown.replace(tmp, "$TMP"), r.returncode,
                     last.replace(tmp, "$TMP")))
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
             "simulate running out of memory.", "",
             "| bad input | command (`fptrace …`) | exit | what the user sees (stderr) |",
             "|---|---|---:|---|"]
    for what, cmd, code, last in rows:
        esc = lambda t: t.replace("|", "\\|")  # noqa: E731
        lines.append(f"| {esc(what)} | `{esc(cmd)}` | {code} | {esc(last)} |")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
