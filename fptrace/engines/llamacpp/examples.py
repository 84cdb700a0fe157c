"""Examples of the llama.cpp engine: its bad inputs, in `run --engine llama.cpp` and `diff
--engine-b llama.cpp` (rows of docs/bad-inputs.md; scripts/bad_inputs.py collects them and makes
the files they read)."""

from __future__ import annotations

from fptrace.examples import Case, Setup


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    m = at.model
    p = at.path
    return (
        Case(3, "run --engine llama.cpp: a GGUF with block_count 0 (llama.cpp would abort)",
             ("run", "hi", "-m", p("blocks0.gguf"), "--engine", "llama.cpp")),
        Case(4, "run --engine llama.cpp: a GGUF whose RMS epsilon is NaN (llama.cpp would abort)",
             ("run", "hi", "-m", p("eps-nan.gguf"), "--engine", "llama.cpp")),
        Case(5, "run --engine llama.cpp: a GGUF of a known architecture llama.cpp cannot load",
             ("run", "hi", "-m", p("model.gguf"), "--engine", "llama.cpp")),
        Case(6, "run --engine llama.cpp: a prompt longer than the context (bundled model)",
             ("run", "word " * 8300, "--engine", "llama.cpp")),
        Case(9, "--ids with --engine llama.cpp beyond the vocabulary",
             ("run", "--ids", "5,50257", "--engine", "llama.cpp", *m)),
        Case(1, "diff --engine-b llama.cpp: an --emulate step that does not exist",
             ("diff", "hi", *m, "--engine-b", "llama.cpp", "--emulate", "kv,q4")),
        Case(2, "diff: --emulate without --engine-b llama.cpp",
             ("diff", "hi", *m, "--dtype-b", "float16", "--emulate", "kv")),
        Case(7, "diff --engine-b llama.cpp: --model-b a GGUF whose RMS epsilon is negative",
             ("diff", "hi", "-m", p("model.gguf"), "--model-b", p("eps-negative.gguf"),
              "--engine-b", "llama.cpp")),
        Case(8, "diff --engine-b llama.cpp: --emulate all with another step",
             ("diff", "hi", *m, "--engine-b", "llama.cpp", "--emulate", "all,kv")),
        Case(10, "run: llama.cpp's --kv-cache without --engine llama.cpp",
             ("run", "hi", *m, "--kv-cache", "f32")),
        Case(11, "diff: llama.cpp's --flash-attn without --engine-b llama.cpp",
             ("diff", "hi", *m, "--dtype-b", "float16", "--flash-attn", "off")),
    )
