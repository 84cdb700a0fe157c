"""The console examples of README.md and docs/*.md are the current output of their commands
(durations, rates, free memory and install paths masked): `python scripts/transcripts.py`
rewrites them after a change."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import transcripts  # noqa: E402

EXAMPLES = transcripts.all_examples()


@pytest.fixture(scope="module")
def scratch():
    """The scratch folder, and a resident server that holds the models for every example."""
    import shutil

    folder = transcripts.scratch_folder()
    with transcripts.resident_server():
        yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_there_are_examples():
    assert len(EXAMPLES) >= 10
    assert any(e.path.name == "README.md" for e in EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES,
                         ids=[f"{e.path.name}:{e.start}" for e in EXAMPLES])
def test_example_is_current(example, scratch, cache_dir):
    for command, want in example.commands:
        got = transcripts.run(command, scratch)
        assert transcripts.compared(example, got) == transcripts.compared(example, want), (
            f"{example.path.name}:{example.start} `{command.splitlines()[0]}` prints something "
            "else now; run `python scripts/transcripts.py` and review the diff")


def test_mask_hides_what_varies_only():
    a = "loaded smollm2-135m in 2.4 s; 13.5 prompts/s; 154 tokens/s; 22.9 GiB free; 0:00:03"
    b = "loaded smollm2-135m in 12.9 s; 1.5 prompts/s; 1,154 tokens/s; 2.1 GiB free; 0:01:03"
    assert transcripts.mask(a) == transcripts.mask(b)
    assert transcripts.mask("‖x‖ = 43.79") != transcripts.mask("‖x‖ = 43.78")
    # rounding residuals below 1e-5 vary with the CPU; larger differences do not
    assert transcripts.mask("difference +1.50e-06") == transcripts.mask("difference +7.46e-07")
    assert transcripts.mask("difference +1.50e-03") != transcripts.mask("difference +7.46e-03")
    # the header panel is as wide as its (folded) install path: borders and padding vary
    here = "╭─ fptrace ──────────╮\n│ model    smollm2-135m        │\n│ weights  /work/x │"
    there = "╭─ fptrace ───────╮\n│ model    smollm2-135m     │\n│ weights  /tmp/ci │"
    assert transcripts.mask(here) == transcripts.mask(there)
    step = "   1 decode  (1, 1) (1, 1, 576)   {} ␣Paris".format
    assert transcripts.mask(step("12.5  ")) == transcripts.mask(step("9.1  "))
