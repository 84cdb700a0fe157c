"""The pinned llama.cpp binding: the declared structures against the library's own defaults, and
the refusal of a missing or different build (one line, exit 2, never a crash)."""

from __future__ import annotations

import ctypes

import pytest

from fptrace.engines.llamacpp import binding as B
from fptrace.errors import BadInput

needs_lib = pytest.mark.skipif(B.installed_version() is None,
                               reason="the [llamacpp] extra (xllamacpp) is not installed")


def test_layout_facts():
    # the issue measured cb_eval at byte 88 in this build; sizes measured from its defaults
    assert B.ContextParams.cb_eval.offset == 88
    assert ctypes.sizeof(B.ContextParams) == 168
    assert B.layout_problems() == []


@needs_lib
def test_defaults_match_the_declared_structure():
    lib = B.load().lib
    params = lib.llama_context_default_params()
    assert B.default_problems(params, B.DEFAULTS) == []
    assert params.cb_eval is None and params.type_k == B.GGML_TYPE_F16
    # a value that is not the default is named
    params.n_batch = 7
    assert B.default_problems(params, B.DEFAULTS) == ["n_batch=7 (expected 2048)"]


def test_missing_package_is_one_line(monkeypatch):
    monkeypatch.setattr(B, "installed_version", lambda: None)
    B.load.cache_clear()
    try:
        with pytest.raises(BadInput, match=r"xllamacpp, which is not installed.*llamacpp\]"):
            B.load()
    finally:
        B.load.cache_clear()


def test_other_build_is_refused(monkeypatch):
    monkeypatch.setattr(B, "installed_version", lambda: "0.0.1")
    B.load.cache_clear()
    try:
        with pytest.raises(BadInput) as info:
            B.load()
        assert "0.0.1" in str(info.value) and B.PINNED_VERSION in str(info.value)
        assert "\n" not in str(info.value)
    finally:
        B.load.cache_clear()


@needs_lib
def test_a_layout_that_disagrees_is_refused(monkeypatch):
    # a build whose defaults differ (here: the declared default changed) is refused by name
    monkeypatch.setitem(B.DEFAULTS, "n_ubatch", 4096)
    B.load.cache_clear()
    try:
        with pytest.raises(BadInput, match=r"not laid out as the build.*n_ubatch=512"):
            B.load()
    finally:
        B.load.cache_clear()


def test_the_engines_settings_are_the_bindings_words():
    """--flash-attn and --kv-cache offer exactly the words the binding turns into llama.cpp's
    values (engines/llamacpp/engine.py declares them; binding.py maps them)."""
    from fptrace.engines.llamacpp.engine import SETTINGS

    words = {s.flag: set(s.choices) for s in SETTINGS}
    assert words == {"--flash-attn": set(B.FLASH_ATTN), "--kv-cache": set(B.CACHE_TYPES)}
    assert {s.default for s in SETTINGS} <= set(B.FLASH_ATTN) | set(B.CACHE_TYPES)
