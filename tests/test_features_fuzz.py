"""fptrace features fuzzed like the other commands (test_hardening.py's rules): prompts of every
plane, latents, sites, targets and tops; success with valid JSON, or one error line, never a
traceback."""

from __future__ import annotations

import pytest
from conftest import make_gpt2_folder
from hypothesis import given
from hypothesis import strategies as st
from test_hardening import FUZZ, check, prompts

from fptrace.commands.features.examples import write_seeded


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_gpt2_folder(tmp_path_factory.mktemp("fuzz-features"))[0])


@pytest.fixture(scope="module")
def sae(tmp_path_factory):
    return write_seeded(str(tmp_path_factory.mktemp("fuzz-sae") / "s"), 32, 64)


@FUZZ
@given(prompt=prompts, latent=st.integers(-3, 70), top=st.integers(-1, 6),
       site=st.one_of(st.none(), st.sampled_from(["blocks.1.hook_resid_pre",
                                                  "blocks.0.hook_resid_post", "layers.0",
                                                  "blocks.9.hook_resid_pre", "blocks.².x"]),
                      prompts),
       target=st.one_of(st.none(), prompts))
def test_fuzz_features(folder, sae, prompt, latent, top, site, target):
    args = ["features", "-m", folder, "--sae", sae, "--latent", str(latent), "--top", str(top),
            "--json"]
    if site is not None:
        args += ["--site", site]
    if target is not None:
        args += ["--target", target]
    check(args + ["--", prompt])
