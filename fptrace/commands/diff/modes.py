"""The four comparisons `fptrace diff` makes, declared once (cli/modes.py): the options that
choose each and those it takes; the refusals, the paragraph of `diff --help` and the table of
docs/diff.md come from here."""

from __future__ import annotations

from fptrace.cli.modes import Mode

SIDE_B = ("--model-b", "--dtype-b", "--device-b", "--quantize-b", "--random-weights-b")

MODES = (
    Mode("diff --stats", "two statistics files (`fptrace stats --out`), channel by channel",
         chosen_by=("--stats",), takes=()),
    Mode("diff --engine-b ENGINE", "one prompt on transformers and on another engine, "
         "llama.cpp on the same GGUF", chosen_by=("--engine-b",),
         takes=(*SIDE_B, "--deep", "--deep-layers", "--tolerance", "--emulate")),
    Mode("diff --deep", "one prompt on two models or settings, inside every block, down to the "
         "first operation where they part", chosen_by=("--deep", "--deep-layers"),
         takes=(*SIDE_B, "--tolerance", "--html")),
    Mode("diff", "two prompts, one prompt under two settings, or two saved traces, layer by "
         "layer", chosen_by=(), takes=(*SIDE_B, "--tolerance")),
)

__all__ = ["MODES", "SIDE_B"]
