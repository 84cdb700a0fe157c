"""`diff --engine-b llama.cpp --emulate`: each step of llama.cpp's numerics, reproduced on the
transformers side, checked against what llama.cpp itself computes on the bundled Q4_1 GGUF
(its own graph tensors, fed its own inputs), against the gguf package's reference quantizer, and
against the model's own K/V seen at the attention's input; the ladder's error with every step
on is measured below the error with none; bad --emulate values are one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.engines.llamacpp import binding as B
from fptrace.engines.llamacpp import emulate as E
from fptrace.errors import BadInput

runner = CliRunner()
PROMPT = "The capital of France is"
needs_lib = pytest.mark.skipif(B.installed_version() is None,
                               reason="the [llamacpp] extra (xllamacpp) is not installed")


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


# ---------------------------------------------------------------- the steps, parsed in one place

def test_steps_are_parsed_in_ladder_order():
    assert E.parse_steps("kv,act-q8") == ("kv", "act-q8")
    assert E.parse_steps(" act-q8 , kv ") == ("act-q8", "kv")
    assert E.parse_steps("all") == tuple(E.STEPS)
    assert E.ladder(("kv", "attn")) == ((), ("kv",), ("kv", "attn"))


@pytest.mark.parametrize("text, needle", [
    ("kv,fp8", "unknown step 'fp8'"), ("kv,,attn", "separated by commas"),
    ("", "separated by commas"), ("kv,kv", "'kv' is given twice"),
    ("all,kv", "'all' is every step"), ("kv,all", "give it alone")])
def test_bad_steps_name_the_value(text, needle):
    with pytest.raises(BadInput, match=needle):
        E.parse_steps(text)


def one_line_error(r, needle: str) -> None:
    assert r.exit_code == 2, (r.exit_code, r.stderr[-800:])
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("fptrace: error: ")]
    assert len(lines) == 1 and needle in lines[0], r.stderr[-800:]
    assert "Traceback" not in r.stderr


def test_a_bad_emulate_value_is_one_line():
    one_line_error(runner.invoke(app, ["diff", PROMPT, "--engine-b", "llama.cpp", "--emulate",
                                       "kv,q4"]), "unknown step 'q4'")


def test_emulate_without_llamacpp_is_one_line():
    one_line_error(runner.invoke(app, ["diff", PROMPT, "--dtype-b", "float16", "--emulate",
                                       "kv"]), "it belongs to `diff --engine-b ENGINE`")


# ---------------------------------------------------------------- the quantizers

def test_q8_0_is_the_gguf_packages_reference_quantizer():
    """Q8_0 quantized and dequantized by the gguf package (numpy, written from ggml's
    reference) gives the values q8_0 gives."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize

    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 256, generator=g) * torch.logspace(-3, 2, 256)  # blocks of many scales
    x[2, :32] = 0.0  # an all-zero block
    ref = dequantize(quantize(x.numpy(), T.Q8_0), T.Q8_0)
    ours = E.q8_0(x).numpy()
    # the reference rounds ties away from zero, ggml's SIMD code (and q8_0) to even: a tie is
    # one step of the 255 levels; anywhere else they agree exactly
    step = np.repeat(np.abs(x.numpy()).reshape(7, 8, 32).max(-1) / 127, 32, axis=-1).reshape(7, 256)
    diff = np.abs(ours - ref)
    assert (diff[diff > 0] <= step[diff > 0] * 1.001).all() and (diff > 0).mean() < 1e-3
    assert np.array_equal(ours[2, :32], np.zeros(32))


def test_q8_k_keeps_256_values_on_one_signed_scale():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 512, generator=g)
    x[1, 300] = -9.0  # the largest magnitude of its block is negative
    y = E.q8_k(x).reshape(3, 2, 256)
    b = x.reshape(3, 2, 256)
    idx = b.abs().argmax(-1, keepdim=True)
    mx = torch.gather(b, -1, idx)
    d = 1.0 / (-127.0 / mx)  # ggml keeps d = 1 / iscale in float32
    q = y / d
    assert torch.allclose(q, q.round(), atol=1e-4) and q.max() <= 127.5 and q.min() >= -128.5
    assert torch.allclose(torch.gather(y, -1, idx), mx, rtol=1e-6)  # the largest is exact
    assert (y - b).abs().max() <= (d.abs() / 2 * 1.0001).max()


def test_a_row_that_does_not_cut_into_blocks_is_refused():
    with pytest.raises(BadInput, match="blocks of 32"):
        E.q8_0(torch.ones(2, 40))


# ---------------------------------------------------------------- against llama.cpp itself

@pytest.fixture(scope="module")
def passes(gguf, smollm):
    from fptrace.engines.llamacpp.capture import EngineOptions, run_pass

    ids = smollm.encode(PROMPT)
    return {fa: run_pass(gguf, PROMPT, EngineOptions(flash_attn=fa, threads=1), ids=ids)
            for fa in ("on", "off")}


def flat(p, name):
    return p.tensors[name].reshape(p.ids.__len__(), -1)


@pytest.mark.slow
@needs_lib
def test_act_q8_gives_llamacpps_own_products(smollm, gguf, passes):
    """Each quantized product of block 0, fed llama.cpp's own input, gives llama.cpp's own output
    with act-q8 on (to float32 summation order) and differs by 8-bit rounding without it."""
    from fptrace.engines.llamacpp.emulation import emulating

    p = passes["on"]
    blk = smollm.parts.blocks[0]
    cases = [("ffn_norm-0", "ffn_gate-0", blk.mlp.gate_proj),
             ("ffn_norm-0", "ffn_up-0", blk.mlp.up_proj),
             ("ffn_swiglu-0", "ffn_out-0", blk.mlp.down_proj),
             ("kqv_out-0", "attn_out-0", blk.self_attn.o_proj),
             ("attn_norm-0", "Vcur-0", blk.self_attn.v_proj)]
    for src, dst, module in cases:
        x = torch.from_numpy(flat(p, src).copy())[None]
        want = flat(p, dst)
        with torch.inference_mode():
            plain = module(x)[0].numpy()
            with emulating(smollm, gguf, ("act-q8",), cache="f16", flash=True):
                emulated = module(x)[0].numpy()
        assert rel(want, emulated) < 2e-6, (dst, rel(want, emulated))
        assert rel(want, plain) > 1e-4, dst


@pytest.mark.slow
@needs_lib
def test_norm_gives_llamacpps_own_rms_norm(smollm, gguf, passes):
    """The emulated RMSNorm gives llama.cpp's own attn_norm to a few float32 ulps, and torch's
    plain one does not. Not bit for bit: ggml's vector kernel adds the squares in an order that
    depends on the CPU's instruction set (bit-equal on AVX2, not on AVX-512), so one rounding of
    the mean may fall the other way; an eps, weight or scale applied wrongly moves every element
    by far more than 4 ulps."""
    p = passes["on"]
    norm = smollm.parts.blocks[0].input_layernorm
    x = torch.from_numpy(flat(p, "embd").copy())[None]
    want = flat(p, "attn_norm-0")
    with torch.inference_mode():
        plain = norm(x)[0].numpy()
        with emulating_steps(smollm, gguf, ("norm",)):
            emulated = norm(x)[0].numpy()
    np.testing.assert_array_max_ulp(emulated, want, maxulp=4)
    assert not np.array_equal(plain, want)
    with pytest.raises(AssertionError):  # a real fault: eps ten times larger
        with torch.inference_mode():
            wrong = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 10 * norm.variance_epsilon)
                     * norm.weight)[0].numpy()
        np.testing.assert_array_max_ulp(wrong, want, maxulp=4)


def emulating_steps(lm, path, steps, flash=True):
    from fptrace.engines.llamacpp.emulation import emulating

    return emulating(lm, path, steps, cache="f16", flash=flash)


@pytest.mark.slow
@needs_lib
@pytest.mark.parametrize("fa, kernel", [("on", "flash"), ("off", "plain")])
def test_attn_gives_llamacpps_own_attention(smollm, passes, fa, kernel):
    """llama.cpp's own q, k, v of the first blocks through the emulated kernel give its own z
    (kqv_out) far closer than float32 attention does."""
    from fptrace.engines.llamacpp.trace import block_points, names_for
    from fptrace.points import Point

    p = passes[fa]
    names = names_for(p)
    for layer in range(3):
        pts = block_points(p, names, layer, 9, 3)
        q, k, v = (torch.from_numpy(pts[x])[None] for x in (Point.q, Point.k, Point.v))
        k16, v16 = E.round_to(k, "f16"), E.round_to(v, "f16")
        ours, _ = E.attention(q, k16, v16, None, 0.125, cache="f16", kernel=kernel)
        f32, _ = E.attention(q, k16, v16, None, 0.125, cache="f16", kernel=None)
        want = pts[Point.z]
        T = want.shape[0]
        e, e32 = rel(want, ours[0].reshape(T, -1)), rel(want, f32[0].reshape(T, -1))
        assert e < 3e-5 and e * 10 < e32, (layer, e, e32)


@pytest.mark.slow
def test_kv_rounds_what_attention_reads(smollm, monkeypatch):
    """With kv on, the K (after RoPE) and V the attention reads are torch's float16 rounding of
    the model's own: in block 0 bit for bit the K and V it reads without the step; in every
    block, V is the rounding of the V projection's output (hooked in the same pass) and K of
    the family's K after RoPE recomputed from the hooked K projection."""
    import torch.nn.functional as F

    from fptrace.core.hooks import Hook, hooked
    from fptrace.families.ops import Steps
    from fptrace.families.parts import dims

    real = F.scaled_dot_product_attention
    seen: list = []

    def spy(q, k, v, *args, **kwargs):
        seen.append((k.clone(), v.clone()))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    lm, fam = smollm, smollm.parts.family
    dm = dims(lm.config, fam)
    projections: dict = {}
    hooks = [Hook.after(blk.get_submodule(path), lambda m, a, o, key=(layer, i):
                        projections.__setitem__(key, o.detach().clone()))
             for layer, blk in enumerate(lm.parts.blocks)
             for i, path in enumerate(fam.head_taps)]
    ids = torch.tensor([lm.encode(PROMPT)])
    previous = lm.config._attn_implementation
    lm.model.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            lm.model(ids)
            own = list(seen)
            seen.clear()
            with emulating_steps(lm, "unused.gguf", ("kv",)), hooked(hooks):
                lm.model(ids)
    finally:
        lm.model.set_attn_implementation(previous)
    assert lm.config._attn_implementation == previous
    assert len(seen) == len(own) == len(lm.parts.blocks)
    (k, v), (k0, v0) = seen[0], own[0]
    assert torch.equal(k, k0.half().float()) and torch.equal(v, v0.half().float())
    assert not torch.equal(k, k0) and not torch.equal(v, v0)
    quiet = Steps(head=0, kv_head=0, n_heads=dm.n_heads, n_kv_heads=dm.n_kv_heads, quiet=True)
    for layer, (k, v) in enumerate(seen):
        n = k.shape[1] // dm.n_kv_heads  # the attention may read the K/V heads repeated
        k, v = k[:, ::n], v[:, ::n]
        blk = lm.parts.blocks[layer]
        with torch.inference_mode():
            _, k_own, v_own = fam.heads(*(projections[(layer, i)] for i in range(3)),
                                        blk.get_submodule(fam.attn), lm.config, layer, quiet,
                                        lm.model, fam)
        assert torch.equal(v, v_own.half().float()), layer
        assert torch.equal(k, k.half().float())  # every value an f16 value
        assert (k == k_own.half().float()).float().mean() > 0.999, layer


# ---------------------------------------------------------------- the ladder

@pytest.fixture(scope="module")
def ladder(cache_dir, gguf):
    r = runner.invoke(app, ["diff", PROMPT, "--engine-b", "llama.cpp", "--emulate", "all",
                            "--json"])
    assert r.exit_code == 1, r.stderr[-800:]
    return json.loads(r.stdout)


@pytest.mark.slow
@needs_lib
def test_every_step_on_comes_closer_than_none(ladder, smollm, gguf):
    em = ladder["emulation"]
    assert em["steps"] == list(E.STEPS) and em["cache"] == "f16" and em["kernel"] == "flash"
    rungs = em["rungs"]
    assert [r["label"] for r in rungs] == ["off"] + [f"+{s}" for s in E.STEPS]
    off, full = rungs[0], rungs[-1]
    assert full["rel"] == [row["rel_diff"] for row in ladder["layers"]]  # the main comparison
    # the first block: llama.cpp's numbers to float32 summation order with every step on
    assert full["rel"][1] < 1e-5 and full["rel"][1] * 1000 < off["rel"][1]
    assert full["median"] < off["median"]
    assert em["fall"] == pytest.approx(off["worst"] / full["worst"])
    # each block fed llama.cpp's own input: the error it adds on its own falls tenfold (measured
    # 20× for the largest, 46× for the median on this prompt)
    n = len(ladder["layers"]) - 1
    assert len(off["alone"]) == len(full["alone"]) == n
    assert full["alone_median"] * 10 < off["alone_median"]
    assert full["alone_worst"] < off["alone_worst"]
    assert full["alone"][0] < 1e-5  # block 0: llama.cpp's numbers, to float32 summation order
    assert em["fall_alone"] == pytest.approx(off["alone_worst"] / full["alone_worst"])


@pytest.mark.slow
@needs_lib
def test_the_off_rung_is_the_plain_comparison(ladder, smollm, gguf):
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine

    plain = engine_diff(smollm, engine("llama.cpp"), gguf, PROMPT)
    off = ladder["emulation"]["rungs"][0]["rel"]
    assert off == pytest.approx([r.rel_diff for r in plain.layers], rel=1e-6, abs=1e-9)
    assert plain.emulation is None


# ---------------------------------------------------------------- a Q4_K_M file, made offline

def test_q4_k_m_types_follow_llamacpps_rule():
    from fptrace.engines.llamacpp.quantize import more_bits, q4_k_m_type

    assert [k for k in range(30) if more_bits(k, 30)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23,
                                                          26, 27, 28, 29]
    assert q4_k_m_type("blk.4.ffn_down.weight", (576, 1536), 30, False) == "Q4_K"
    assert q4_k_m_type("blk.5.ffn_down.weight", (576, 1536), 30, False) == "Q6_K"
    assert q4_k_m_type("blk.5.attn_v.weight", (192, 576), 30, False) == "Q8_0"  # 576: no K
    assert q4_k_m_type("blk.4.attn_q.weight", (576, 576), 30, False) == "Q5_0"
    assert q4_k_m_type("token_embd.weight", (49152, 576), 30, False) == "Q8_0"  # the tied head
    assert q4_k_m_type("token_embd.weight", (49152, 512), 30, True) == "Q4_K"
    assert q4_k_m_type("output_norm.weight", (576,), 30, False) == "F32"


@pytest.fixture(scope="module")
def q4_k_m(gguf, tmp_path_factory):
    from fptrace.engines.llamacpp.quantize import write_q4_k_m

    path = str(tmp_path_factory.mktemp("q4km") / "smollm2-q4_k_m.gguf")
    return path, write_q4_k_m(gguf, path)


@pytest.mark.slow
@needs_lib
def test_act_q8_gives_llamacpps_products_on_k_quants(q4_k_m):
    """On the Q4_K_M file: a Q6_K and a Q4_K product (Q8_K input blocks of 256) and a Q5_0 and
    Q8_0 one (Q8_0 blocks of 32), fed llama.cpp's own inputs, give llama.cpp's own outputs."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from fptrace.engines.llamacpp.capture import EngineOptions, run_pass

    path, types = q4_k_m
    p = run_pass(path, PROMPT, EngineOptions(threads=1))
    weights = {t.name: (t.tensor_type.name, dequantize(t.data, t.tensor_type))
               for t in GGUFReader(path).tensors if t.name.startswith(("blk.0.", "blk.3."))}
    cases = [("ffn_swiglu-0", "ffn_out-0", "blk.0.ffn_down.weight", "Q6_K"),
             ("ffn_swiglu-3", "ffn_out-3", "blk.3.ffn_down.weight", "Q4_K"),
             ("ffn_norm-0", "ffn_up-0", "blk.0.ffn_up.weight", "Q5_0"),
             ("attn_norm-0", "Vcur-0", "blk.0.attn_v.weight", "Q8_0")]
    for src, dst, name, kind in cases:
        got_kind, w = weights[name]
        assert got_kind == kind == types[name]
        x = torch.from_numpy(flat(p, src).copy())
        W = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
        emulated = E.quantized_product(x, W, None, kind).numpy()
        plain = torch.nn.functional.linear(x, W).numpy()
        want = flat(p, dst)
        assert rel(want, emulated) < 2e-6, (dst, kind, rel(want, emulated))
        assert rel(want, plain) > 1e-4, dst


@pytest.mark.slow
@needs_lib
def test_act_q8_scales_by_one_over_d_as_ggml_does(smollm, gguf):
    """ggml multiplies a block by 1 / d, not by 127 / max|x|: on this prompt one value of token
    2's row rounds the other way with the second, and the whole row's products part by 4e-3."""
    from fptrace.engines.llamacpp.capture import EngineOptions, run_pass

    prompt = "What is the capital of France?"
    p = run_pass(gguf, prompt, EngineOptions(threads=1), ids=smollm.encode(prompt))
    W = smollm.parts.blocks[0].self_attn.v_proj.weight.detach().float()
    x = torch.from_numpy(flat(p, "attn_norm-0").copy())
    out = E.quantized_product(x, W, None, "Q4_1", E.block_minimums(W)).numpy()
    want = flat(p, "Vcur-0")
    assert max(rel(want[t], out[t]) for t in range(len(want))) < 2e-6


@pytest.mark.slow
@needs_lib
@pytest.mark.parametrize("T", [63, 64])
def test_flash_attention_takes_its_tiled_kernel_from_64_rows(gguf, T, monkeypatch):
    """Below 64 query rows llama.cpp's flash attention rounds Q and its accumulator to f16; from
    64 rows on it takes its tiled kernel (f32): the emulated kernel switches at the same row
    count, and the one it picks is the one that gives llama.cpp's own z."""
    from fptrace.engines.llamacpp.capture import EngineOptions, run_pass
    from fptrace.engines.llamacpp.trace import block_points, names_for
    from fptrace.points import Point

    ids = [(7 * i + 11) % 49000 + 100 for i in range(T)]
    p = run_pass(gguf, "", EngineOptions(threads=1), ids=ids)
    pts = block_points(p, names_for(p), 1, 9, 3)
    q, k, v = (torch.from_numpy(pts[x])[None] for x in (Point.q, Point.k, Point.v))
    k16, v16 = E.round_to(k, "f16"), E.round_to(v, "f16")

    def z(rows: int) -> float:
        monkeypatch.setattr(E, "TILED_ROWS", rows)
        out, _ = E.attention(q, k16, v16, None, 0.125, cache="f16", kernel="flash")
        return rel(pts[Point.z], out[0].reshape(T, -1).numpy())

    picked, one_chunk, tiled = z(64), z(10**9), z(0)
    assert picked == (tiled if T >= 64 else one_chunk)
    assert picked * 10 < max(one_chunk, tiled) and picked < 1e-4


@pytest.mark.slow
@needs_lib
def test_a_block_alone_is_the_deep_diffs_block_output(ladder, smollm, gguf):
    """Block 0 reads the same embedding on both engines, so its error alone is what --deep
    measures at its output (the model's own pass, hooked); and an eager attention gives the same
    figures (the causal mask is given, not assumed)."""
    from fptrace.commands.diff.engine import blocks_alone, engine_diff
    from fptrace.engines import engine

    llamacpp = engine("llama.cpp")
    deep = engine_diff(smollm, llamacpp, gguf, PROMPT, deep=True, layers=[0]).deep
    out = next(p for p in deep.blocks[0].points if p.point == "resid_post")
    off = ladder["emulation"]["rungs"][0]["alone"]
    assert off[0] == pytest.approx(out.rel, rel=1e-4)
    p = llamacpp.compare.run_pass(smollm, gguf, PROMPT, {})
    previous = smollm.config._attn_implementation
    smollm.model.set_attn_implementation("eager")
    try:
        eager = blocks_alone(smollm, p)
    finally:
        smollm.model.set_attn_implementation(previous)
    assert eager == pytest.approx(off, rel=1e-4)


@needs_lib
def test_a_row_that_does_not_fit_the_types_blocks_is_not_quantized():
    """ggml_quantize_chunk writes whole blocks: a row of 48 values for Q4_1's blocks of 32 would
    be written past its buffer (the process aborted in free()); it is refused first."""
    from fptrace.engines.llamacpp.binding import load
    from fptrace.engines.llamacpp.quantize import quantize_rows

    lib = load().lib
    assert quantize_rows(lib, "Q4_1", np.ones((2, 64), np.float32)).shape == (2, 2 * 20)
    with pytest.raises(BadInput, match="a row of 48 values cannot be cut into Q4_1's blocks"):
        quantize_rows(lib, "Q4_1", np.ones((2, 48), np.float32))
