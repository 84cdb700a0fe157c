"""Modes declared once (fptrace/cli/modes.py): `diff`'s four comparisons, `steer`'s sources of
the vector, what `ablate` removes and `features`' reading or training refuse an option of
another mode in one line naming where it belongs, before anything is read or loaded; the
paragraph of each --help and the table of each docs page are the declaration's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.cli.modes import Mode, chosen, help_paragraph, markdown
from fptrace.commands.ablate.modes import MODES as ABLATE
from fptrace.commands.diff.modes import MODES
from fptrace.commands.features.modes import MODES as FEATURES
from fptrace.commands.steer.modes import MODES as STEER
from fptrace.errors import BadInput

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


DECLARED = {"ablate": ABLATE, "diff": MODES, "features": FEATURES, "steer": STEER}


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_the_docs_table_is_the_declaration(name):
    page = (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- modes:[^\n]*-->\n(.*?)<!-- /modes -->", page, re.S)
    assert found and found.group(1) == markdown(DECLARED[name]), \
        f"docs/{name}.md's modes table is stale"


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_help_carries_the_modes(name):
    r = runner.invoke(app, [name, "--help"], env={"COLUMNS": "300", "TERM": "dumb"})
    assert r.exit_code == 0
    flat = " ".join(r.stdout.split())
    assert " ".join(help_paragraph(DECLARED[name]).split()) in flat


def test_chosen_picks_the_first_mode_an_option_chooses():
    modes = (Mode("c --a", "a things", ("--a",), ("--x",)),
             Mode("c --b", "b things", ("--b",), ("--y",)),
             Mode("c", "the rest", (), ("--x", "--y")))
    assert chosen(modes, {"--a": False, "--b": False, "--x": True}) is modes[2]
    assert chosen(modes, {"--a": True, "--b": False, "--x": True}) is modes[0]
    with pytest.raises(BadInput, match=r"--y is not an option of `c --a` \(a things\); it "
                                       r"belongs to `c --b` \(b things\) or `c` \(the rest\)"):
        chosen(modes, {"--a": True, "--y": True})
    with pytest.raises(BadInput, match=r"--b is not an option of `c --a`"):
        chosen(modes, {"--a": True, "--b": True})


@pytest.mark.parametrize("args, says", [
    (["a.json", "b.json", "--stats", "--deep"],
     "--deep is not an option of `diff --stats` (two statistics files"),
    (["a.json", "b.json", "--stats", "--tolerance", "0.1"],  # it used to be ignored
     "--tolerance is not an option of `diff --stats`"),
    (["hi", "--dtype-b", "float16", "--emulate", "kv"],
     "--emulate is not an option of `diff` (two prompts, one prompt under two settings, or two "
     "saved traces, layer by layer); it belongs to `diff --engine-b ENGINE`"),
    (["hi", "--dtype-b", "float16", "--html", "x.html"],
     "--html is not an option of `diff` (two prompts"),
    (["hi", "--dtype-b", "float16", "--deep", "--emulate", "kv"],
     "--emulate is not an option of `diff --deep`"),
])
def test_diff_refuses_an_option_of_another_mode(args, says, tmp_path):
    r = runner.invoke(app, ["diff", *args, "-m", tiny_gpt2()])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("fptrace: error")]
    assert len(errors) == 1 and says in errors[0], r.stderr


def test_steer_wants_one_source_before_the_model_loads():
    """Two sources, or none, are one line before anything loads: the model named here does not
    exist, and the line is still the source's."""
    for args, says in ((["--add", " a", "--subtract", " b", "--vector", "v.npy"],
                        "--add is not an option of `steer --vector FILE` (a saved vector, one per "
                        "block or one for --layer); it belongs to `steer --add A --subtract B`"),
                       (["--layer", "1"], "give one source of the steering vector: ")):
        r = runner.invoke(app, ["steer", "hi", "-m", "no/such-model", *args])
        assert r.exit_code == 2 and says in r.stderr, r.stderr


def test_an_option_typed_at_its_default_is_still_given():
    """`--mode zero` and `--method mean` are their options' defaults, typed: refused where the
    mode does not take them, as any other value is (click's context says what was typed)."""
    r = runner.invoke(app, ["ablate", "hi", "-m", "no/such-model", "--sae", "dir", "--latent",
                            "1", "--mode", "zero"])
    assert r.exit_code == 2 and "--mode is not an option of `ablate --sae DIR --latent N`" \
        in r.stderr, r.stderr
    r = runner.invoke(app, ["steer", "hi", "-m", "no/such-model", "--vector", "v.npy",
                            "--method", "mean"])
    assert r.exit_code == 2 and "--method is not an option of `steer --vector FILE`" \
        in r.stderr, r.stderr


def test_ablate_removes_parts_or_a_latent_never_both():
    r = runner.invoke(app, ["ablate", "hi", "-m", "no/such-model", "--sae", "dir", "--latent",
                            "1", "--head", "0.1"])
    assert r.exit_code == 2 and "--head is not an option of `ablate --sae DIR --latent N`" \
        in r.stderr and "it belongs to `ablate` (heads, MLPs" in r.stderr, r.stderr


@pytest.mark.parametrize("args, says", [
    (["train", "p.txt", "--sae", "dir"], "--sae is not an option of `features train PROMPTS...` "
     "(a TopK SAE of the stream after block --layer, trained on the prompt files); it belongs "
     "to `features PROMPT`"),
    (["hi", "--latents", "64"], "--latents is not an option of `features PROMPT` (the prompt "
     "read through sparse dictionaries"),  # it used to be ignored
    (["train", "p.txt", "--layers", "all"], "--layers is an option of transcoder training "
     "(`features train --transcoder --layers ...`); an SAE trains on one block: --layer L"),
    (["train", "p.txt", "--transcoder", "p2.txt"], "features train: --transcoder is a flag "
     "there (train transcoders), not a folder ('p2.txt'); put it after the prompt files"),
    (["train", "p.txt", "--transcoder", "--layer", "1"], "features train --transcoder takes "
     "--layers SEL (all, 0-29, 3,5,7), not --layer"),
    (["train", "p.txt", "--html", "x.html"], "--html is the page of a prompt's features"),
    (["hi", "--latents", "2048"], "--latents is not an option of `features PROMPT`"),  # its
    (["train", "p.txt", "--top", "5"], "--top is not an option of `features train "  # default
     "PROMPTS...`"),
    (["hi", "--export", "circuit-tracer"], "--export is an option of `features train "
     "--transcoder`"),
    (["hi", "--transcoder"], "--transcoder DIR: give the folder of a transcoder to read"),
])
def test_features_refuses_an_option_of_another_mode_before_the_load(args, says):
    """Read or train: an option of the other is one line, before anything is read or loaded
    (the model named does not exist)."""
    r = runner.invoke(app, ["features", *args, "-m", "no/such-model"])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("fptrace: error")]
    assert len(errors) == 1 and says in errors[0], r.stderr
