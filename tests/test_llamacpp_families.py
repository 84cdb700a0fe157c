"""`--engine llama.cpp` beyond Llama's architecture: for each family whose llama.cpp names are
mapped, a tiny GGUF written here (tests/tiny_gguf.py: a tiny random model of the family under
llama.cpp's tensor names and metadata) runs in llama.cpp through the engine, and every block's
stream, and with --deep every point llama.cpp names, is held to the stream transformers computes
from the same file (loaded through transformers' GGUF support, or fptrace's own reader for the
architectures that loader does not read: the file read back equals the original model, weight
for weight); a weight scaled in a copy of the file is named at its block and operation."""

from __future__ import annotations

import json
import os
import shutil

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
# both engines in float32 end to end: llama.cpp's K/V cache in f32 and its plain attention
EXACT = {"flash_attn": "off", "kv_cache": "f32"}
# float32 sums in another order, through a few tiny blocks: measured below 3e-6 on every family
FLOAT32 = 1e-5
# (fptrace family, GGUF architecture, the converter permutes W_Q/W_K, the tensor a fault scales,
# the block and point where it first acts). A Mistral GGUF is Llama's architecture (transformers
# loads it as a Llama): the llama row covers it. From olmo2 on they are read by fptrace's own
# reader (transformers' GGUF loader reads none of them: tests/test_gguf_reader.py; Mixtral's
# `llama` file with experts it reads as a Llama without them, a test below)
ARCHS = [
    ("llama", "llama", True, "blk.1.ffn_down.weight", 1, "mlp_out"),
    ("qwen2", "qwen2", False, "blk.1.attn_q.bias", 1, "q"),
    ("qwen3", "qwen3", False, "blk.0.attn_k_norm.weight", 0, "k"),
    ("gemma2", "gemma2", False, "blk.1.post_attention_norm.weight", 1, "ln1_post"),
    ("gemma3", "gemma3", False, "blk.2.ffn_up.weight", 2, "mlp_up"),
    ("qwen3_moe", "qwen3moe", False, "blk.1.ffn_down_exps.weight", 1, "mlp_out"),
    ("gpt2", "gpt2", False, "position_embd.weight", 0, "resid_pre"),
    ("phi3", "phi3", False, "blk.1.ffn_up.weight", 1, "mlp_gate"),
    ("qwen2_moe", "qwen2moe", False, "blk.1.ffn_gate_inp_shexp.weight", 1, "mlp_out"),
    ("olmo2", "olmo2", False, "blk.1.ffn_up.weight", 1, "mlp_up"),
    ("gpt_neox", "gptneox", False, "blk.1.attn_output.weight", 1, "attn_out"),
    ("olmoe", "olmoe", False, "blk.1.ffn_down_exps.weight", 1, "mlp_out"),
    ("gpt_oss", "gpt-oss", False, "blk.1.ffn_down_exps.bias", 1, "mlp_out"),
    ("deepseek_v3", "deepseek2", False, "blk.1.attn_k_b.weight", 1, "z"),
    ("gemma", "gemma", False, "blk.1.ffn_gate.weight", 1, "mlp_gate"),
    ("mixtral", "llama", True, "blk.1.ffn_down_exps.weight", 1, "mlp_out"),
]
# where llama.cpp's arithmetic is not float32's, the first point to part: Gemma's, GPT-2's and
# GPT-NeoX's GELU, which ggml's CPU kernel reads from a table of float16 values (3e-4 relative
# on the tiny models' MLP activation; every point before it holds to float32, and the streams
# stay within GELU_TABLE); gpt-oss's q and k after RoPE, whose YaRN correction range llama.cpp
# rounds to whole dimensions and gpt-oss's config does not (1.4e-3 and 1.9e-3 on the tiny
# model; the streams stay within float32's bound)
GELU_TABLE = 1e-3
ROUNDED = {"gemma": (0, "mlp_act"), "gemma2": (0, "mlp_act"), "gemma3": (0, "mlp_act"),
           "gpt2": (0, "mlp_act"), "gpt_neox": (0, "mlp_act"), "gpt_oss": (0, "q")}
# the tolerance under which a scaled weight must be the first point to part: above gpt-oss's
# RoPE gap
FAULT_TOLERANCE = {"gpt_oss": 1e-2}
# what llama.cpp's converter does to a family's weights besides renaming them: Gemma's norm
# weights stored with the 1 its RMSNorm adds
NORM_OFFSET = {"gemma": 1.0, "gemma2": 1.0, "gemma3": 1.0}
# what a family's tiny model holds here besides its tiny config: DeepSeek's YaRN, as the
# published DeepSeek files have it (its attention scale from mscale_all_dim; a factor of 4 over
# an original context of 4 tokens, shorter than the prompt)
MODEL = {"deepseek_v3": {"rope_parameters": {
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
    "original_max_position_embeddings": 4, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
    "mscale_all_dim": 1.0}}}
# the families whose stream receives post-norms (ln1_post, ln2_post), and those with no norm
# before attention and the MLP (OLMo 2's) or no stream between them (GPT-NeoX's parallel block)
POST_NORMS = ("gemma2", "gemma3", "olmo2")


@pytest.fixture(scope="module", params=ARCHS, ids=[a[0] for a in ARCHS])
def tiny(request, tmp_path_factory, gguf, own_cache):
    """(the row, the GGUF's path, a faulted copy's, the original transformers model, the file
    loaded by fptrace)."""
    from tiny_gguf import write

    from fptrace.models.loading import load_model

    family, arch, adjacent, tensor, _, _ = request.param
    folder = tmp_path_factory.mktemp(family)
    path = str(folder / f"tiny-{family}.gguf")
    original = tiny_model(family, **MODEL.get(family, {}))
    offset = NORM_OFFSET.get(family, 0.0)
    if offset:  # the norm weights the file holds: 1 + w in float32, read back as (1 + w) - 1
        as_stored(original, offset)
    write(original, path, arch, gguf, rope_adjacent=adjacent, norm_offset=offset)
    faulted = scaled(path, str(folder / f"faulted-{family}.gguf"), tensor, 1.5)
    return request.param, path, faulted, original, load_model(path, device="cpu")


def as_stored(model, offset: float) -> None:
    """The model's norm weights rounded as the file stores them (w + offset in float32) and
    read back, so the file holds the model itself."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((p + offset) - offset)


def reads_itself(lm) -> bool:
    return lm.parts.family.gguf_weights is not None


def test_every_point_llamacpp_names_matches_transformers(tiny):
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine

    (family, *_), path, _, _, lm = tiny
    assert lm.parts.family.name == family
    result = engine_diff(lm, engine("llama.cpp"), path, PROMPT, settings=EXACT, deep=True,
                         tolerance=FLOAT32)
    blocks = [r.rel_diff for r in result.layers if r.layer is not None]
    print(f"{family}: the streams part by {max(blocks):.2g} at most (relative)")
    bound = GELU_TABLE if family in ROUNDED else FLOAT32
    assert len(blocks) == len(lm.parts.blocks) and max(blocks) < bound, blocks
    parted = result.deep.parted
    if family in ROUNDED:
        assert parted is not None and (parted.layer, parted.point) == ROUNDED[family], parted
    else:
        assert parted is None, parted.sentence
    compared = {p.point for b in result.deep.blocks for p in b.points}
    assert {"resid_pre", "z", "mlp_out", "resid_post"} <= compared, compared
    if family != "deepseek_v3":  # latent attention: q, k, v formed by neither engine's modules
        assert {"q", "k", "v"} <= compared, compared
    if family != "olmo2":  # OLMo 2 has no norm before attention or the MLP
        assert {"ln1", "ln2"} <= compared, compared
    if family != "gpt_neox":  # a parallel block has no stream between attention and the MLP
        assert "resid_mid" in compared, compared
    # what the stream receives: the attention output itself, and the post-norms where the
    # family has them (Gemma's graph names no attention output before its post-norm)
    if family in POST_NORMS:
        assert {"ln1_post", "ln2_post"} <= compared, compared
    if not family.startswith("gemma"):
        assert "attn_out" in compared, compared
    if family in ("olmo2", "gpt_neox"):  # dense MLPs llama.cpp names inside
        assert {"mlp_up", "mlp_act"} <= compared, compared
    assert result.within == (family not in ROUNDED)
    if lm.parts.family.llamacpp_names.routing:  # both engines chose the same experts everywhere
        assert result.routing is not None and result.routing.compared > 0
        assert result.routing.flipped == 0


def test_the_file_fptrace_reads_itself_reads_back_into_the_original_model(tiny):
    """Every weight fptrace's reader reads from the F32 file equals the original model's
    exactly, built directly and through the cache entry a run loads, and so do the logits."""
    import torch

    from fptrace.models import gguf_reader
    from fptrace.models.gguf_metadata import check

    _, path, _, original, lm = tiny
    if not reads_itself(lm):
        pytest.skip("transformers' GGUF loader reads the file")
    want = original.state_dict()
    for model in (gguf_reader.build(path, check(path)), lm.model):
        got = model.state_dict()
        assert sorted(got) == sorted(want)
        for k, v in want.items():
            assert np.array_equal(got[k].numpy(), v.numpy()), k
    ids = torch.tensor([lm.encode(PROMPT)])
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, original(ids).logits)


# a weight each family's fixes change (GGUFWeights.fixes): Gemma's norm, stored as 1 + w;
# Mixtral's W_Q, permuted for llama.cpp's rotation of adjacent pairs
UNDONE = {"gemma": "model.layers.0.input_layernorm.weight",
          "mixtral": "model.layers.0.self_attn.q_proj.weight"}


def test_an_undone_fix_is_caught(tiny, monkeypatch):
    """The check above can fail: with GPT-NeoX's fused QKV left as the converter wrote it
    ([Q; K; V], not head by head), gpt-oss's experts' gate and up stacked rather than
    interleaved, Gemma's norms read with the converter's 1 left in or Mixtral's W_Q and W_K
    left permuted, the weights and the logits differ."""
    from dataclasses import replace

    import torch

    from fptrace.models import gguf_reader
    from fptrace.models.gguf_metadata import check

    (family, *_), path, _, original, lm = tiny
    if family == "gpt_neox":
        monkeypatch.setattr(gguf_reader, "qkv_by_head", lambda w, heads: w)
        key = "gpt_neox.layers.0.attention.query_key_value.weight"
    elif family == "gpt_oss":
        monkeypatch.setattr(gguf_reader, "interleaved", lambda w, transposed: w.swapaxes(
            -1, -2) if transposed else w.reshape(-1, w.shape[-1] * 2))
        key = "model.layers.0.mlp.experts.gate_up_proj"
    elif family in UNDONE:  # the family's fixes dropped: its weights as the file stores them
        spec = gguf_reader.spec
        monkeypatch.setattr(gguf_reader, "spec", lambda meta: replace(spec(meta), fixes={}))
        key = UNDONE[family]
    else:
        pytest.skip("the fused QKV is GPT-NeoX's, the interleaved experts gpt-oss's, the norms "
                    "stored 1 + w Gemma's, W_Q and W_K permuted Mixtral's")
    broken = gguf_reader.build(path, check(path))
    assert not np.array_equal(broken.state_dict()[key].numpy(), original.state_dict()[key].numpy())
    ids = torch.tensor([lm.encode(PROMPT)])
    with torch.no_grad():
        assert (broken(ids).logits - original(ids).logits).abs().max() > 1e-3


def test_gpt_oss_q_and_k_part_by_yarns_rounded_correction_range_only(tiny, monkeypatch,
                                                                     tmp_path):
    """gpt-oss's q and k are the first points to part (ROUNDED): read with YaRN's correction
    range rounded to whole dimensions, as llama.cpp's ggml_rope_yarn_corr_dims does, every point
    holds to float32."""
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine
    from fptrace.families import gpt_oss
    from fptrace.models.loading import load_model

    (family, *_), path, _, _, _ = tiny
    if family != "gpt_oss":
        pytest.skip("gpt-oss's YaRN")
    monkeypatch.setattr(gpt_oss, "TRUNCATE", True)
    monkeypatch.setenv("FPTRACE_CACHE_DIR", str(tmp_path))  # read again, not from the cache
    lm = load_model(path, device="cpu")
    assert lm.model.config.rope_parameters["truncate"] is True
    result = engine_diff(lm, engine("llama.cpp"), path, PROMPT, settings=EXACT, deep=True,
                         tolerance=FLOAT32)
    assert result.deep.parted is None, result.deep.parted.sentence
    assert result.within


def test_llamacpps_routing_is_checked_and_flips_are_named(tiny, tmp_path):
    """llama.cpp's router nodes make the trace's routing, checked against the family's rule
    recomputed from llama.cpp's own logits; a router weight reversed in a copy of the file
    flips the choice, and diff names the first flip."""
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.core.routing import routers
    from fptrace.engines import engine

    _, path, _, _, lm = tiny
    if not lm.parts.family.llamacpp_names.routing:
        pytest.skip("a dense family: no router")
    r = CliRunner().invoke(app, ["run", PROMPT, "-m", path, "--engine", "llama.cpp", "--json"])
    assert r.exit_code == 0, r.stderr[-800:]
    routing = json.loads(r.stdout)["routing"]
    assert routing["checked"] and routing["mismatched"] == 0
    # every MoE block (DeepSeek-V3's first is dense)
    assert [b["layer"] for b in routing["blocks"]] == [i for i, _ in routers(lm.parts)]
    assert len(routing["blocks"]) >= 2
    flipped = scaled(path, str(tmp_path / "router.gguf"), "blk.1.ffn_gate_inp.weight", -1.0)
    result = engine_diff(lm, engine("llama.cpp"), flipped, PROMPT, settings=EXACT)
    assert result.routing.flipped > 0 and result.routing.first.layer == 1


def test_qwen2_moes_shared_expert_and_its_gate_beside_the_routed_experts(tiny):
    """Qwen2-MoE's MLP output (compared as mlp_out) is the routed experts' sum plus the shared
    expert's output times σ(its own gate): llama.cpp's nodes for each part (`ffn_moe_out`,
    `ffn_shexp`, `ffn_shexp_gate`, which ggml computes as SiLU(x)/x) hold to transformers'
    modules within float32."""
    import torch

    from fptrace.engines.llamacpp.capture import EngineOptions, run_pass

    (family, *_), path, _, _, lm = tiny
    if family != "qwen2_moe":
        pytest.skip("Qwen2-MoE's shared expert")
    ids = lm.encode(PROMPT)
    names = ("ffn_moe_out", "ffn_shexp", "ffn_shexp_gate")
    p = run_pass(path, "", EngineOptions(flash_attn="off", cache_type="f32"), ids=ids,
                 wanted=frozenset(names))
    seen: dict = {}
    hooks = []
    for k, blk in enumerate(lm.parts.blocks):
        for part in ("", "shared_expert", "shared_expert_gate"):
            module = blk.mlp.get_submodule(part)
            hooks.append(module.register_forward_hook(
                lambda m, a, out, key=(k, part): seen.__setitem__(
                    key, (out[0] if isinstance(out, tuple) else out).detach().numpy()
                    .reshape(len(ids), -1))))  # the sparse block flattens (B, T) inside
    try:
        with torch.no_grad():
            lm.model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()

    def rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    for k in range(len(lm.parts.blocks)):
        ours = {n: p.tensors[f"{n}-{k}"].reshape(len(ids), -1) for n in names}
        gate = 1 / (1 + np.exp(-seen[k, "shared_expert_gate"]))  # (T, 1)
        shared = seen[k, "shared_expert"]
        assert rel(ours["ffn_shexp_gate"], gate) < FLOAT32, k
        assert rel(ours["ffn_shexp"], shared) < FLOAT32, k
        assert rel(ours["ffn_moe_out"], seen[k, ""] - gate * shared) < FLOAT32, k


def test_a_file_named_phi3_without_phi3s_tokens_fails_with_the_reason(tiny, tmp_path):
    """llama.cpp's vocabulary loader looks Phi-3's special tokens up by their text in a file
    whose general.name says Phi-3 (whatever its architecture) and fails with `_Map_base::at`
    on a vocabulary without them: the tiny files are named otherwise, and the one line says
    why when the name is the cause."""
    from gguf import GGUFReader

    from fptrace.engines.llamacpp.trace import run_llamacpp
    from fptrace.errors import ModelLoadError

    (family, *_), path, _, _, _ = tiny
    if family != "phi3":
        pytest.skip("the name's rule is shown on the phi3 file")
    renamed = str(tmp_path / "named-phi3.gguf")
    shutil.copyfile(path, renamed)
    reader = GGUFReader(renamed, "r+")
    field = reader.fields["general.name"]
    old = bytes(field.parts[field.data[0]])
    new = b"fptrace tiny Phi-3"
    assert len(new) == len(old), old  # rewritten in place: the same length
    field.parts[field.data[0]][:] = np.frombuffer(new, dtype=np.uint8)
    reader.data.flush()
    del reader
    with pytest.raises(ModelLoadError, match=r"_Map_base::at \(its general.name, 'fptrace "
                       r"tiny Phi-3', makes llama.cpp look up Phi-3's special tokens"):
        run_llamacpp(renamed, PROMPT)


def test_the_runs_own_checks_pass(tiny):
    (family, *_), path, *_ = tiny
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

    (family, _, _, tensor, block, point), _, faulted, _, lm = tiny
    result = engine_diff(lm, engine("llama.cpp"), faulted, PROMPT, settings=EXACT, deep=True,
                         tolerance=FAULT_TOLERANCE.get(family, 1e-3))
    parted = result.deep.parted
    assert parted is not None, f"{family}: {tensor} scaled, nothing parted"
    assert (parted.layer, parted.point) == (block, point), parted.sentence


# `--emulate` beyond Llama: the families whose weights map onto llama.cpp's names, each written
# as Q4_1 (the bundled model's type) by ggml's own quantizer. Qwen2-MoE's shared expert and
# Mixtral's experts are made 64 wide here: their tiny configs' 48 cannot be cut into Q4_1's
# blocks of 32.
EMULATED = {"qwen2": {}, "qwen3": {}, "qwen3_moe": {},
            "phi3": {"num_attention_heads": 2, "num_key_value_heads": 2},
            "qwen2_moe": {"shared_expert_intermediate_size": 64}, "olmo2": {}, "olmoe": {},
            "mixtral": {"intermediate_size": 64}}


@pytest.mark.parametrize("family", sorted(EMULATED))
def test_emulate_brings_each_family_to_llamacpps_numbers(family, tmp_path, gguf, own_cache):
    """With every step of --emulate on, a Q4_1 file of the family gives llama.cpp's numbers to
    float32's summation order where both engines read the same input, against 3e-3 to 7e-3
    with none (measured, each block fed llama.cpp's own input: 1e-7 to 3e-7, but where a
    difference of float32's last bits moves a value of a product's input across an 8-bit
    rounding boundary, 4e-4 to 8e-4: in 4 of 40 blocks measured; which values sit on a
    boundary depends on the CPU's summation order, so one of the two blocks is asked to be
    exact and both far closer than with no step); act-q8 on its own already closes part of the
    gap. On the MoE families this needs the chosen experts' products quantized as llama.cpp's
    mul_mat_id does (without them every block parts at its MLP output by 1e-3 or more).
    OLMo 2's, OLMoE's and Mixtral's files are read by fptrace's reader (measured: olmo2 2.1e-7
    and 2.0e-3 against 9.3e-3 and 9.0e-3 with none; olmoe 1.3e-7 and 1.7e-7 against 6.7e-3 and
    5.0e-3; mixtral 1.2e-7 and 1.9e-7 against 5.4e-3 and 4.0e-3)."""
    from tiny_gguf import assert_emulation_closes_the_gap, emulated_q4_1

    _, arch, adjacent, *_ = next(a for a in ARCHS if a[0] == family)
    lm, em = emulated_q4_1(tiny_model(family, **EMULATED[family]), tmp_path, arch, gguf, PROMPT,
                           rope_adjacent=adjacent)
    assert_emulation_closes_the_gap(lm, em)


# why --emulate does not cover a family, in its one line
NOT_EMULATED = {"gemma": "GELU comes from ggml's float16 table",
                "gemma2": "GELU comes from ggml's float16 table",
                "gemma3": "GELU comes from ggml's float16 table",
                "gpt2": "GELU comes from ggml's float16 table",
                "gpt_neox": "GELU comes from ggml's float16 table",
                "gpt_oss": "gate and up interleaved",
                "deepseek_v3": "absorbs each head's key into the query"}


def test_emulate_on_a_family_it_does_not_cover_is_one_line_saying_why(tiny):
    (family, *_), path, _, _, _ = tiny
    if family not in NOT_EMULATED:
        pytest.skip("--emulate covers the family")
    r = CliRunner().invoke(app, ["diff", PROMPT, "-m", path, "--engine-b", "llama.cpp",
                                 "--emulate", "kv"])
    one_line_refusal(r, f"--emulate does not cover the {family} family", NOT_EMULATED[family])


def test_emulated_attention_rounds_phi3s_query_after_its_scale(tmp_path, gguf):
    """Phi-3's graph multiplies q by 1/√head_dim before attention (whose own scale is then 1),
    so llama.cpp's flash kernel rounds the scaled q to f16: from llama.cpp's own q, k, v the
    emulated kernel gives its z (measured: bit for bit) when it scales q first, and not when it
    rounds q unscaled (4e-5 to 6e-5) at a head width whose scale is no power of 2 (32 here; the
    family's tiny 16 has 1/4, which commutes with the rounding)."""
    import torch
    from tiny_gguf import write

    from fptrace.engines.llamacpp import emulate as E
    from fptrace.engines.llamacpp.capture import EngineOptions, run_pass
    from fptrace.engines.llamacpp.trace import block_points, names_for
    from fptrace.points import Point

    path = str(tmp_path / "phi3-hd32.gguf")
    write(tiny_model("phi3", **EMULATED["phi3"]), path, "phi3", gguf)
    p = run_pass(path, PROMPT, EngineOptions(flash_attn="on"))
    names = names_for(p)
    for layer in range(2):
        pts = block_points(p, names, layer, 2, 2)
        q, k, v = (torch.from_numpy(pts[x].copy())[None] for x in (Point.q, Point.k, Point.v))
        want = pts[Point.z]

        def z(q_scaled: bool, q=q, k=k, v=v, want=want) -> float:
            attend = E.attention_function("f16", True, "flash", q_scaled)
            out, _ = attend(None, q, k, v, None, scaling=32 ** -0.5)
            got = out[0].reshape(want.shape).numpy()
            return float(np.linalg.norm(got - want) / np.linalg.norm(want))

        scaled, unscaled = z(True), z(False)
        assert scaled < 1e-5 and scaled * 5 < unscaled, (layer, scaled, unscaled)


# ---------------------------------------------------------------- what transformers cannot load

def one_line_refusal(r, *needles: str) -> str:
    assert r.exit_code == 2, (r.exit_code, r.stderr[-800:])
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("fptrace: error: ")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-800:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# a GGUF architecture llama.cpp runs which transformers' GGUF loader does not read and
# fptrace's own reader does not either (Cohere's Command R: fptrace has no family for it): the
# engine loads the same file in transformers (token texts, the lens), so it is one line naming
# the loader. GPT-NeoX's, OLMo 2's, OLMoE's, gpt-oss's and DeepSeek's fptrace reads itself
# (ARCHS above).
UNREAD = ["command-r"]


def header_only(path: str, arch: str, bundled: str) -> str:
    """A GGUF of `arch` with the keys every architecture has, the bundled tokenizer cut to
    VOCAB tokens and a token embedding: enough for either loader to say whether it reads the
    architecture."""
    import gguf as G
    from tiny_gguf import VOCAB, tokenizer_fields

    w = G.GGUFWriter(path, arch)
    w.add_name("fptrace tiny model")
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(G.LlamaFileType.ALL_F32)
    for key, kind, value in tokenizer_fields(bundled):
        if isinstance(kind, tuple):
            w.add_key_value(key, value, kind[0], sub_type=kind[1])
        else:
            w.add_key_value(key, value, kind)
    w.add_tensor("token_embd.weight", np.zeros((VOCAB, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", UNREAD)
def test_an_architecture_transformers_does_not_read_is_one_line(arch, tmp_path, gguf, own_cache):
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # when transformers reads one of them, its family can be mapped (and this row goes)
    assert arch not in GGUF_SUPPORTED_ARCHITECTURES
    path = header_only(str(tmp_path / f"{arch}.gguf"), arch, gguf)
    r = CliRunner().invoke(app, ["run", PROMPT, "-m", path])
    one_line_refusal(r, f"GGUF loader reads no {arch!r} file", "--engine llama.cpp too")


def test_transformers_still_cannot_load_a_gpt_oss_file(tiny, tmp_path, gguf):
    """transformers' GGUF loader lists gpt-oss but fails on the tiny file's YaRN keys (as
    llama.cpp's converter writes them), and without them loads neither the experts nor the
    sinks: why fptrace reads gpt-oss files itself. When this fails, transformers has changed:
    check its loader against fptrace's reader."""
    from tiny_gguf import write
    from transformers import AutoConfig, AutoModelForCausalLM

    (family, *_), path, _, original, _ = tiny
    if family != "gpt_oss":
        pytest.skip("gpt-oss's loader gap")
    with pytest.raises(TypeError):
        AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    no_yarn = str(tmp_path / "no-yarn.gguf")
    write(original, no_yarn, "gpt-oss", gguf, rope_scaling=False)
    _, info = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="no-yarn.gguf", ignore_mismatched_sizes=True,
        output_loading_info=True)
    missing = set(info["missing_keys"])
    for k in range(2):
        assert {f"model.layers.{k}.mlp.experts.gate_up_proj",
                f"model.layers.{k}.self_attn.sinks"} <= missing, missing


def test_transformers_reads_a_mixtral_file_as_a_llama_without_its_experts(tiny):
    """transformers' GGUF loader builds a `llama` file with experts (Mixtral's, as llama.cpp's
    converter writes it) as a Llama whose dense MLP no tensor fills, dropping the router and
    the experts: why fptrace reads Mixtral files itself. When this fails, transformers has
    changed: check its loader against fptrace's reader."""
    from transformers import AutoModelForCausalLM

    (family, *_), path, _, _, lm = tiny
    if family != "mixtral":
        pytest.skip("Mixtral's loader gap")
    assert type(lm.model).__name__ == "MixtralForCausalLM"
    model, info = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), output_loading_info=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert "model.layers.0.mlp.gate_proj.weight" in set(info["missing_keys"])


def test_a_file_missing_a_weight_is_refused_not_filled_at_random(tmp_path, gguf, own_cache):
    """transformers' GGUF loader leaves a weight it finds no tensor for at its random initial
    value with a warning only; fptrace refuses such a file in one line naming the weight."""
    from types import SimpleNamespace

    from tiny_gguf import write

    model = tiny_model("llama")
    gone = "model.layers.1.mlp.down_proj.weight"
    kept = {k: v for k, v in model.state_dict().items() if k != gone}
    path = str(tmp_path / "no-down.gguf")
    write(SimpleNamespace(config=model.config, state_dict=lambda: kept,
                          named_modules=model.named_modules), path, "llama", gguf,
          rope_adjacent=True)
    r = CliRunner().invoke(app, ["run", PROMPT, "-m", path])
    one_line_refusal(r, "found no tensor for 1 of the model's weights", gone, "random values")
