"""The family registry: every family is tested, the stream's decomposition is checked on every
trace, and a family module cannot be half-added."""

from __future__ import annotations

import types

import pytest
import torch
from conftest import TINY_CONFIGS, build_tiny, forward_then_remove

from fptrace.core.trace import run_trace
from fptrace.families import FAMILIES, Family, FamilyDefinitionError, check_family, load_families
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311, 12]

# The module of each block whose output the stream receives, by model type, written down here
# from the transformers sources (not read from the registry): the registry must agree.
ADDED = {
    "gemma2": ("post_attention_layernorm", "post_feedforward_layernorm"),
    "gemma3_text": ("post_attention_layernorm", "post_feedforward_layernorm"),
    "olmo2": ("post_attention_layernorm", "post_feedforward_layernorm"),
}


def test_every_family_has_a_tiny_config():
    tiny_types = {c["model_type"] for c in TINY_CONFIGS.values()}
    missing = [f.name for f in FAMILIES if not set(f.model_types) & tiny_types]
    assert not missing, f"families without a tiny config: {missing}"


def test_nothing_outside_the_registry_names_a_family():
    """No `family.name == "..."` branch outside fptrace/families/."""
    import pathlib
    import re

    root = pathlib.Path(__file__).parent.parent / "fptrace"
    names = "|".join(re.escape(f.name) for f in FAMILIES)
    pattern = re.compile(rf"""(name|family)\s*(==|!=|in)\s*\(?["']({names})["']""")
    hits = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
            if "families" not in p.parts
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits


def _full_capture(lm, ids):
    """Hooks on every block and on the modules the test table names: (in, out, attn, mlp) of
    each block at every position, without fptrace's hooks."""
    got: dict = {}
    handles = []
    mt = lm.config.model_type
    attn_name, mlp_name = ADDED.get(mt, (lm.parts.family.attn, lm.parts.family.mlp))
    for i, b in enumerate(lm.parts.blocks):
        handles.append(b.register_forward_pre_hook(
            lambda m, a, k, i=i: got.__setitem__(("in", i), (a[0] if a else k["hidden_states"])
                                                 .clone()), with_kwargs=True))
        handles.append(b.register_forward_hook(
            lambda m, a, o, i=i: got.__setitem__(("out", i), (o[0] if isinstance(o, tuple)
                                                              else o).clone())))
        for key, name in (("attn", attn_name), ("mlp", mlp_name)):
            handles.append(b.get_submodule(name).register_forward_hook(
                lambda m, a, o, i=i, key=key: got.__setitem__(
                    (key, i), (o[0] if isinstance(o, tuple) else o).clone())))
    forward_then_remove(lm, ids, handles)
    return got


@pytest.mark.parametrize("name", sorted(n for n in TINY_CONFIGS if n != "starcoder2"))
def test_attn_and_mlp_are_what_the_stream_receives(name):
    """At every position of every block, what the named modules output adds up to what the
    block added; fptrace's ‖attn‖ and ‖mlp‖ are the norms of those outputs."""
    lm = wrap_model(build_tiny(name), name=f"tiny-{name}", random_weights=True)
    got = _full_capture(lm, IDS)
    trace = run_trace(lm, IDS)
    assert trace.decomposition.holds and trace.decomposition.withheld == ()
    for i in range(len(lm.parts.blocks)):
        added = got[("out", i)] - got[("in", i)]
        torch.testing.assert_close(got[("attn", i)] + got[("mlp", i)], added, rtol=1e-5,
                                   atol=1e-5)
        row = trace.layers[i + 1]
        assert row.attn_norm_last == pytest.approx(float(got[("attn", i)][0, -1].norm()),
                                                   rel=1e-5)
        assert row.mlp_norm_last == pytest.approx(float(got[("mlp", i)][0, -1].norm()), rel=1e-5)
    assert trace.decomposition.max_mismatch < 1e-5


@pytest.mark.parametrize("name", sorted(ADDED))
def test_post_norm_families_would_fail_with_the_raw_outputs(name):
    """The check is not vacuous: the raw self_attn / mlp outputs of a post-norm family do not
    add up, so a registry that pointed at them would have the columns withheld."""
    from dataclasses import replace

    lm = wrap_model(build_tiny(name), name=f"tiny-{name}", random_weights=True)
    lm.parts = replace(lm.parts, attn_adds=lm.parts.attns, mlp_adds=lm.parts.mlps)
    trace = run_trace(lm, IDS)
    check = trace.decomposition
    assert not check.holds and check.withheld == tuple(range(len(lm.parts.blocks)))
    assert check.max_mismatch > 0.01
    assert all(r.attn_norm_last is None and r.mlp_norm_last is None for r in trace.layers)
    assert all(r.added_norm_last is not None for r in trace.layers[1:])
    assert any("withheld for blocks 0–" in n for n in trace.notes)


def _scaled_blocks(lm, blocks):
    """A custom block: it adds a fifth of its input again on top of attention and the MLP (a
    'layer scale' the registry knows nothing of)."""
    def hook(module, args, kwargs, output):
        x = args[0] if args else kwargs["hidden_states"]
        if isinstance(output, tuple):
            return (output[0] + 0.2 * x, *output[1:])
        return output + 0.2 * x
    return [lm.parts.blocks[i].register_forward_hook(hook, with_kwargs=True) for i in blocks]


def test_custom_block_gets_its_columns_withheld():
    lm = wrap_model(build_tiny("starcoder2"), name="tiny-starcoder2", random_weights=True)
    handles = _scaled_blocks(lm, [1])
    try:
        trace = run_trace(lm, IDS)
    finally:
        for h in handles:
            h.remove()
    plain = run_trace(lm, IDS)
    check = trace.decomposition
    assert not check.holds and check.withheld == (1,) and check.worst_block == 1
    assert trace.layers[1].attn_norm_last is not None  # block 0 is untouched
    assert trace.layers[2].attn_norm_last is None and trace.layers[2].mlp_norm_last is None
    assert trace.layers[2].added_norm_last is not None
    note = next(n for n in trace.notes if "withheld" in n)
    assert "block 1" in note and "of ‖Δ‖" in note
    assert plain.decomposition.holds


def test_withheld_columns_in_table_and_json():
    import io
    import json

    from rich.console import Console

    from fptrace.render.json import to_json
    from fptrace.render.tables import layers

    lm = wrap_model(build_tiny("starcoder2"), name="tiny-starcoder2", random_weights=True)
    handles = _scaled_blocks(lm, [0, 1])
    try:
        trace = run_trace(lm, IDS)
    finally:
        for h in handles:
            h.remove()
    data = json.loads(to_json(trace))
    assert data["decomposition"]["withheld"] == [0, 1]
    assert [r["attn_norm_last"] for r in data["layers"]] == [None, None, None]
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(layers(trace, 200))
    text = out.getvalue()
    assert "withheld for blocks 0–1" in text


def test_generic_header_says_what_was_inferred():
    from fptrace.core.trace import model_info

    lm = wrap_model(build_tiny("starcoder2"), name="tiny-starcoder2", random_weights=True)
    info = model_info(lm)
    assert info.family == "generic:starcoder2"
    assert any("layernorm" in f and "LayerNorm" in f for f in info.inferred)
    assert any(f.startswith("positions: rope") for f in info.inferred)
    assert any("what attention and the MLP add" in u for u in info.unknown)
    known = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    assert model_info(known).inferred == () and model_info(known).unknown == ()


def test_incomplete_family_module_is_refused():
    with pytest.raises(FamilyDefinitionError, match="defines no FAMILY"):
        check_family("broken", types.SimpleNamespace())
    base = next(f for f in FAMILIES if f.name == "gpt2")
    from dataclasses import replace

    with pytest.raises(FamilyDefinitionError, match="incomplete: no final_norm"):
        check_family("broken", types.SimpleNamespace(FAMILY=replace(base, final_norm="")))
    with pytest.raises(ValueError, match="'batchnorm' is not a valid NormKind"):
        replace(base, norm_type="batchnorm")  # a kind is a member of its enum, or no Family
    with pytest.raises(FamilyDefinitionError, match="norm_type is 'unknown'"):
        check_family("broken", types.SimpleNamespace(FAMILY=replace(base, norm_type="unknown")))
    with pytest.raises(FamilyDefinitionError, match="tiny config has model_type 'gpt2'"):
        check_family("broken", types.SimpleNamespace(FAMILY=replace(
            FAMILIES[-1], tiny=dict(FAMILIES[-1].tiny, model_type="gpt2"))))
    with pytest.raises(FamilyDefinitionError, match="needs both"):
        check_family("broken", types.SimpleNamespace(FAMILY=replace(base,
                                                                    recompute_final_norm=None)))


def test_a_model_type_claimed_twice_is_refused(monkeypatch):
    import sys
    from dataclasses import replace

    clash = types.ModuleType("fptrace.families.clash")
    clash.FAMILY = replace(next(f for f in FAMILIES if f.name == "llama"), name="clash")
    monkeypatch.setitem(sys.modules, "fptrace.families.clash", clash)
    with pytest.raises(FamilyDefinitionError, match="claimed by both"):
        load_families(("llama", "clash"))


def test_family_facts_are_shown():
    assert isinstance(FAMILIES[0], Family)
    by = {f.name: f for f in FAMILIES}
    assert by["mistral"].model_types == ("mistral",)
    assert by["gemma2"].post_norms and not by["gemma"].post_norms
    lm = wrap_model(build_tiny("gemma2"), name="tiny-gemma2", random_weights=True)
    assert lm.parts.final_softcap == 3.0
    diffs = by["gemma2"].differences(4, 2, lm.config)
    assert any("soft-capped at 2" in d for d in diffs)
    assert any("final logits soft-capped at 3" in d for d in diffs)
    assert by["gpt2"].differences(4, 4, build_tiny("gpt2").config) == []


def test_the_docs_list_every_family():
    """docs/models.md and the README name every family of the registry, by its title."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    models = (root / "docs" / "models.md").read_text(encoding="utf-8")
    readme = " ".join((root / "README.md").read_text(encoding="utf-8").split())
    for f in FAMILIES:
        assert f.title in models, f"docs/models.md does not list {f.title}"
        assert f.title in readme, f"README.md does not list {f.title}"
