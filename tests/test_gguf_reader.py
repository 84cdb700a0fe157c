"""fptrace's own GGUF reader (fptrace/models/gguf_reader.py), for the architectures transformers'
GGUF loader does not read: a tiny GGUF written here from a tiny random transformers model of the
family (tests/tiny_gguf.py, as llama.cpp's converter writes it) is read back into the same
model, weight for weight and logit for logit; llama.cpp runs it through `--engine llama.cpp`
with the run's own checks passing and every block's stream held to transformers'; a weight
scaled in a copy of the file is named at its block and operation; a file with a tensor missing
or one too many is refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_gguf import scaled, tiny_model
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.engines.llamacpp import binding as B

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(B.installed_version() is None,
                                 reason="the [llamacpp] extra (xllamacpp) is not installed")]

PROMPT = "The capital of France is"
EXACT = {"flash_attn": "off", "kv_cache": "f32"}
# float32 sums in another order through two tiny blocks: measured 4.3e-7 (olmo2), 3.3e-7
# (olmoe)
FLOAT32 = 1e-5
# ggml's GELU reads a table of float16 values (and is the tanh form, where GPT-NeoX's is the
# exact one): 3.4e-4 relative on block 0's MLP activation, the streams within 4.2e-5 (measured)
GELU_TABLE = 1e-3
# (fptrace family, GGUF architecture, the tensor a fault scales, the block and point where it
# first acts, the first point to part on the unfaulted file (None: none), the streams' bound)
FAMILIES = [
    ("olmo2", "olmo2", "blk.1.ffn_up.weight", 1, "mlp_up", None, FLOAT32),
    ("gpt_neox", "gptneox", "blk.1.attn_output.weight", 1, "attn_out", (0, "mlp_act"),
     GELU_TABLE),
    ("olmoe", "olmoe", "blk.1.ffn_down_exps.weight", 1, "mlp_out", None, FLOAT32),
]




def one_line_refusal(r, *needles: str) -> str:
    assert r.exit_code == 2, (r.exit_code, r.stderr[-800:])
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("fptrace: error: ")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-800:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f[0] for f in FAMILIES])
def tiny(request, tmp_path_factory, gguf, own_cache):
    """(the row, the GGUF's path, a faulted copy's, the original transformers model, the file
    loaded by fptrace)."""
    from tiny_gguf import write

    from fptrace.models.loading import load_model

    family, arch, tensor, *_ = request.param
    folder = tmp_path_factory.mktemp(family)
    path = str(folder / f"tiny-{family}.gguf")
    original = tiny_model(family)
    write(original, path, arch, gguf)
    faulted = scaled(path, str(folder / f"faulted-{family}.gguf"), tensor, 1.5)
    return request.param, path, faulted, original, load_model(path, device="cpu")


def logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def test_each_fix_undoes_what_the_converter_does():
    """The reader's fixes are the inverses of what tests/tiny_gguf.py does as llama.cpp's
    converter: Llama's W_Q/W_K row permutation (by the heads it is made with), GPT-NeoX's fused
    QKV written [Q; K; V]; and neither is the identity on a weight with more than one head."""
    from tiny_gguf import permute

    from fptrace.models.gguf_reader import qkv_by_head, rope_adjacent_undone

    rng = np.random.default_rng(0)
    for heads, rows in ((4, 64), (2, 32)):
        w = rng.standard_normal((rows, 24)).astype(np.float32)
        assert not np.array_equal(permute(w, heads), w)
        assert np.array_equal(rope_adjacent_undone(permute(w, heads), heads), w)
    heads, hd = 4, 8
    by_head = rng.standard_normal((3 * heads * hd, 16)).astype(np.float32)
    # the converter's order: every head's q, then every head's k, then every head's v
    stacked = by_head.reshape(heads, 3, hd, 16).swapaxes(0, 1).reshape(by_head.shape)
    assert not np.array_equal(stacked, by_head)
    assert np.array_equal(qkv_by_head(stacked, heads), by_head)
    bias = by_head[:, 0].copy()
    assert np.array_equal(qkv_by_head(stacked[:, 0].copy(), heads), bias)


def test_transformers_still_reads_neither(tiny):
    """The reader exists because transformers' GGUF loader lists neither architecture; when it
    does, check it against the reader (and drop the reader's family where it reads as well)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    (_, arch, *_), *_ = tiny
    assert arch not in GGUF_SUPPORTED_ARCHITECTURES


def test_the_file_reads_back_into_the_original_model(tiny):
    """Every weight read from the F32 file equals the original model's exactly, built directly
    and through the cache entry a run loads, and so do the logits."""
    from fptrace.models import gguf_reader
    from fptrace.models.gguf_metadata import check

    (family, *_), path, _, original, lm = tiny
    assert lm.parts.family.name == family
    want = original.state_dict()
    for model in (gguf_reader.build(path, check(path)), lm.model):
        got = model.state_dict()
        assert sorted(got) == sorted(want)
        for k, v in want.items():
            assert np.array_equal(got[k].numpy(), v.numpy()), k
    ids = lm.encode(PROMPT)
    assert np.array_equal(logits(lm.model, ids), logits(original, ids))


def test_an_undone_fix_is_caught(tiny, monkeypatch):
    """The checks above can fail: with GPT-NeoX's fused QKV left as the converter wrote it
    ([Q; K; V], not head by head), the weights and the logits differ."""
    from fptrace.models import gguf_reader
    from fptrace.models.gguf_metadata import check

    (family, *_), path, _, original, lm = tiny
    if family != "gpt_neox":
        pytest.skip("the fused QKV is GPT-NeoX's")
    monkeypatch.setattr(gguf_reader, "qkv_by_head", lambda w, heads: w)
    broken = gguf_reader.build(path, check(path))
    key = "gpt_neox.layers.0.attention.query_key_value.weight"
    assert not np.array_equal(broken.state_dict()[key].numpy(), original.state_dict()[key].numpy())
    ids = lm.encode(PROMPT)
    assert np.abs(logits(broken, ids) - logits(original, ids)).max() > 1e-3


def test_every_point_llamacpp_names_matches_transformers(tiny):
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine

    (family, _, _, _, _, rounded, bound), path, _, _, lm = tiny
    result = engine_diff(lm, engine("llama.cpp"), path, PROMPT, settings=EXACT, deep=True,
                         tolerance=FLOAT32)
    blocks = [r.rel_diff for r in result.layers if r.layer is not None]
    print(f"{family}: the streams part by {max(blocks):.2g} at most (relative)")
    assert len(blocks) == len(lm.parts.blocks) and max(blocks) < bound, blocks
    parted = result.deep.parted
    if rounded is None:
        assert parted is None, parted.sentence
        assert result.within
    else:
        assert parted is not None and (parted.layer, parted.point) == rounded, parted
    compared = {p.point for b in result.deep.blocks for p in b.points}
    assert {"resid_pre", "q", "k", "v", "z", "attn_out", "mlp_out", "resid_post"} <= compared
    if family != "olmoe":  # each position's experts are its own: not compared point by point
        assert {"mlp_up", "mlp_act"} <= compared, compared
    # OLMo 2's post-norms (what its stream receives); the pre-norms of the others
    added = {"ln1_post", "ln2_post"} if family == "olmo2" else {"ln1", "ln2"}
    assert added <= compared, compared
    if family == "olmoe":  # both engines chose the same experts everywhere
        assert result.routing is not None and result.routing.compared > 0
        assert result.routing.flipped == 0


def test_the_runs_own_checks_pass(tiny):
    (family, *_), path, _, _, _ = tiny
    r = CliRunner().invoke(app, ["run", PROMPT, "-m", path, "--engine", "llama.cpp", "--json",
                                 "--kv-cache", "f32", "--flash-attn", "off"])
    assert r.exit_code == 0, r.stderr[-800:]
    trace = json.loads(r.stdout)
    assert trace["engine"] == "llama.cpp" and trace["model"]["family"] == family
    assert not any(n.startswith("logit lens withheld") for n in trace["notes"])
    assert all(row["lens_id"] is not None for row in trace["layers"])


def test_a_scaled_weight_is_named_at_its_block_and_operation(tiny):
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine

    (family, _, tensor, block, point, *_), _, faulted, _, lm = tiny
    result = engine_diff(lm, engine("llama.cpp"), faulted, PROMPT, settings=EXACT, deep=True,
                         tolerance=1e-3)
    parted = result.deep.parted
    assert parted is not None, f"{family}: {tensor} scaled, nothing parted"
    assert (parted.layer, parted.point) == (block, point), parted.sentence


def test_olmoes_routing_is_checked_and_flips_are_named(tiny, tmp_path):
    """llama.cpp's olmoe router nodes make the trace's routing, checked against OLMoE's rule
    (a softmax over all experts, the top k, not renormalised) recomputed from llama.cpp's own
    logits; a router weight reversed in a copy of the file flips the choice at its block."""
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine

    (family, *_), path, _, _, lm = tiny
    if family != "olmoe":
        pytest.skip("a dense family: no router")
    r = CliRunner().invoke(app, ["run", PROMPT, "-m", path, "--engine", "llama.cpp", "--json"])
    assert r.exit_code == 0, r.stderr[-800:]
    routing = json.loads(r.stdout)["routing"]
    assert routing["checked"] and routing["mismatched"] == 0
    assert [b["layer"] for b in routing["blocks"]] == list(range(len(lm.parts.blocks)))
    flipped = scaled(path, str(tmp_path / "router.gguf"), "blk.1.ffn_gate_inp.weight", -1.0)
    result = engine_diff(lm, engine("llama.cpp"), flipped, PROMPT, settings=EXACT)
    assert result.routing.flipped > 0 and result.routing.first.layer == 1


def without(model, gone: str):
    """The model as tiny_gguf.write reads it, less one weight."""
    from types import SimpleNamespace

    kept = {k: v for k, v in model.state_dict().items() if k != gone}
    return SimpleNamespace(config=model.config, state_dict=lambda: kept,
                           named_modules=model.named_modules)


@pytest.mark.parametrize("family,arch,gone,tensor", [
    ("olmo2", "olmo2", "model.layers.1.self_attn.k_norm.weight", "blk.1.attn_k_norm.weight"),
    ("gpt_neox", "gptneox", "gpt_neox.layers.0.attention.query_key_value.bias",
     "blk.0.attn_qkv.bias")])
def test_a_file_missing_a_tensor_is_one_line(family, arch, gone, tensor, tmp_path, gguf,
                                             own_cache):
    from tiny_gguf import write

    path = str(tmp_path / f"no-{tensor}.gguf")
    write(without(tiny_model(family), gone), path, arch, gguf)
    r = CliRunner().invoke(app, ["run", PROMPT, "-m", path])
    one_line_refusal(r, "1 of the", f"{gone} ({tensor})", "no tensor", "random value")


def test_a_key_the_reader_does_not_read_is_one_line(tmp_path, gguf, own_cache):
    """An olmo2 file with a sliding window (OLMo 3's) is refused, not read as OLMo 2 without
    one."""
    from gguf import GGUFValueType
    from tiny_gguf import write

    path = str(tmp_path / "windowed.gguf")
    write(tiny_model("olmo2"), path, "olmo2", gguf,
          extra={"olmo2.attention.sliding_window": (4, GGUFValueType.UINT32)})
    r = CliRunner().invoke(app, ["run", PROMPT, "-m", path])
    one_line_refusal(r, "olmo2.attention.sliding_window (4)", "does not read")


def test_a_tensor_no_weight_takes_is_one_line(tmp_path, gguf, own_cache):
    """A tensor the family's model has no weight for (an OLMo 2 file with a bias its
    attention has none of) is refused, not dropped."""
    import torch
    from tiny_gguf import write

    model = tiny_model("olmo2")
    state = dict(model.state_dict())
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    path = str(tmp_path / "extra.gguf")
    from types import SimpleNamespace

    write(SimpleNamespace(config=model.config, state_dict=lambda: state,
                          named_modules=model.named_modules), path, "olmo2", gguf)
    r = CliRunner().invoke(app, ["run", PROMPT, "-m", path])
    one_line_refusal(r, "1 of its tensors are no weight", "blk.0.attn_q.bias")


@pytest.mark.parametrize("family", ["olmo2", "olmoe"])
def test_emulate_brings_each_family_to_llamacpps_numbers(family, tmp_path, gguf, own_cache):
    """A Q4_1 file of the family (ggml's own quantizer) read by fptrace's reader: with every
    step of --emulate on, one of the two blocks fed llama.cpp's own input gives llama.cpp's
    numbers to float32's summation order and both are far closer than with no step (measured:
    olmo2 2.1e-7 and 2.0e-3 against 9.3e-3 and 9.0e-3 with none; olmoe 1.3e-7 and 1.7e-7
    against 6.7e-3 and 5.0e-3), as the mapped families' test asks."""
    from tiny_gguf import assert_emulation_closes_the_gap, emulated_q4_1

    lm, em = emulated_q4_1(tiny_model(family), tmp_path, family, gguf, PROMPT)
    assert_emulation_closes_the_gap(lm, em)


def test_emulate_on_gpt_neox_is_one_line_saying_why(tiny):
    (family, *_), path, _, _, _ = tiny
    if family != "gpt_neox":
        pytest.skip("--emulate covers the family")
    r = CliRunner().invoke(app, ["diff", PROMPT, "-m", path, "--engine-b", "llama.cpp",
                                 "--emulate", "kv"])
    one_line_refusal(r, "--emulate does not cover the gpt_neox family",
                     "GELU comes from ggml's float16 table")
