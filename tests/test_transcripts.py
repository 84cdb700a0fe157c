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


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES,
                         ids=[f"{e.path.name}:{e.start}" for e in EXAMPLES])
def test_example_is_current(example, scratch, cache_dir):
    for command, want in example.commands:
        got = transcripts.run(command, scratch)
        assert transcripts.same(example, got, want), (
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


def test_a_last_digit_may_move_by_one_and_no_more():
    """Another CPU adds a float32 sum in another order: a number near a rounding boundary prints
    one unit off in its last digit (the ablate grid's +0.527 is +0.528 on an AVX-512 machine).
    That passes; two units, another word or another layout of lines does not."""
    plain = transcripts.Example(Path("x.md"), 0, 0, [])
    loose = transcripts.Example(Path("x.md"), 0, 0, [], loose=True)
    row = "     22    {}    -0.098    -0.666    -0.220".format
    assert transcripts.same(plain, row("+0.528"), row("+0.527"))
    assert transcripts.same(plain, row("-0.000"), row("+0.000"))
    assert transcripts.same(plain, "logit 9.999 (p 0.1)", "logit 10.000 (p 0.1)")
    assert transcripts.same(plain, "gap 1.5e-03", "gap 1.6e-03")
    assert not transcripts.same(plain, row("+0.529"), row("+0.527"))
    assert not transcripts.same(plain, row("+0.527"), row("-0.527"))
    assert not transcripts.same(plain, "gap 1.5e-03", "gap 1.5e-02")
    assert not transcripts.same(plain, "top-1 Paris 0.527", "top-1 Lyon 0.527")
    # a version is a name: no unit of tolerance
    assert not transcripts.same(plain, "schema version 1.9", "schema version 1.8")
    assert not transcripts.same(plain, '{"schema_version": "1.9", "id": 1}',
                                '{"schema_version": "1.8", "id": 1}')
    assert transcripts.same(plain, '{"schema_version": "1.9", "p": 0.528}',
                            '{"schema_version": "1.9", "p": 0.527}')
    assert not transcripts.same(plain, "a 0.527\nb", "a 0.527 b")
    # a loose page compares the words only; a residual masked on one side and printed on the
    # other (1.00e-04 is past the mask) is a number on both
    assert transcripts.same(loose, "gap 1.57e-05 ≤ 0.0004", "gap 1.00e-04 ≤ 0.0004")
    assert not transcripts.same(loose, "gap 1.57e-05 ≤ 0.0004", "gap 1.00e-04 > 0.0004")


def test_rows_that_vary_are_compared_by_count_and_shape():
    """Under bfloat16 another CPU's kernels round otherwise, and the channels that moved most are
    other channels: a page that says its rows vary compares the text around the table, how many
    rows it has and how many fields each row has; a missing row, a row with a field more or less,
    or another header still fails."""
    rows = transcripts.Example(Path("x.md"), 0, 0, [], loose=True, rows_vary=True)
    loose = transcripts.Example(Path("x.md"), 0, 0, [], loose=True)
    table = "a: stats.json\n  layer   site   change\n ─────────────\n{}".format
    here = table("     13   mlp_act   35.4%\n     29   z   33.6%")
    there = table("     20   z   28.9%\n     13   mlp_act   26.4%")
    assert transcripts.same(rows, here, there)
    assert not transcripts.same(loose, here, there)
    assert not transcripts.same(rows, here, table("     13   mlp_act   35.4%"))
    assert not transcripts.same(rows, here, table("     13   mlp_act   35.4%\n     29   z"))
    assert not transcripts.same(rows, here, here.replace("site", "place"))
