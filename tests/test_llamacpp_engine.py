"""The llama.cpp engine on the bundled SmolLM2 GGUF: its tokenizer against transformers', every
mapped point captured in every block, the copies out of ggml checked against what llama.cpp
itself returns (its logits, its float16 K cache), and q after RoPE against transformers' own."""

from __future__ import annotations

import numpy as np
import pytest

from fptrace.engines.llamacpp import binding as B

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(B.installed_version() is None,
                                 reason="the [llamacpp] extra (xllamacpp) is not installed")]

PROMPT = "The capital of France is"
README_PROMPTS = ("The capital of France is", "What is the capital of France?")


@pytest.fixture(scope="module")
def captured(gguf):
    from fptrace.engines.llamacpp.capture import run_pass

    return run_pass(gguf, PROMPT)


@pytest.mark.parametrize("prompt", README_PROMPTS + ("Hello, world! 1234 ünïcödé",))
def test_llamacpp_ids_equal_transformers_ids(smollm, gguf, prompt):
    from fptrace.engines.llamacpp.capture import run_pass

    got = run_pass(gguf, prompt, capture=False)
    assert list(got.ids) == smollm.encode(prompt)


def test_every_mapped_point_in_every_block(captured):
    from fptrace.families import llamacpp_names_for
    from fptrace.points import Point

    names = llamacpp_names_for(captured.architecture)
    assert captured.architecture == "llama" and captured.n_layer == 30
    stream = {Point.embed, Point.final_norm, Point.logits}
    for point, name in names.points.items():
        if point in stream:
            assert name in captured.tensors, name
        else:
            missing = [k for k in range(30) if f"{name}-{k}" not in captured.tensors]
            assert not missing, (name, missing)
    T = len(captured.ids)
    assert captured.tensors["l_out-29"].reshape(-1, 576).shape == (T, 576)
    assert captured.tensors["Qcur-0"].reshape(T, 9, 64).shape == (T, 9, 64)


def test_the_copied_output_is_llamacpps_own_logits(captured):
    # result_output, copied out of the graph with ne reversed, against llama_get_logits_ith
    out = captured.tensors["result_output"].reshape(len(captured.ids), -1)
    np.testing.assert_array_equal(out, captured.logits)
    assert captured.logits.shape == (len(captured.ids), 49152)


def test_float16_copy_is_the_k_cache(captured):
    # the K cache is float16: its first T rows are Kcur (after RoPE) rounded to float16
    T = len(captured.ids)
    cache = captured.tensors["cache_k_l3 (view)"]  # (1, n_ctx, nkv, hd), from f16
    k = captured.tensors["Kcur-3"].reshape(T, 3, 64)
    np.testing.assert_array_equal(cache.reshape(-1, 3, 64)[:T], k.astype(np.float16)
                                  .astype(np.float32))


def test_own_sums_are_exact(captured):
    for k in range(captured.n_layer):
        total = captured.tensors[f"ffn_inp-{k}"] + captured.tensors[f"ffn_out-{k}"]
        np.testing.assert_array_equal(total, captured.tensors[f"l_out-{k}"])


def test_q_after_rope_matches_transformers_at_block_0(smollm, captured):
    """Block 0 reads the same embedding on both sides: llama.cpp's q and k, put back in the
    checkpoint's order, are transformers' q and k after RoPE up to the 8-bit rounding of the
    projection's input (a wrong order would part by ~1.4)."""
    import torch

    from fptrace.engines.llamacpp.trace import block_points
    from fptrace.families import llamacpp_names_for
    from fptrace.families.ops import Steps
    from fptrace.points import Point

    fam = smollm.parts.family
    blk = smollm.parts.blocks[0]
    got = {}
    hooks = [blk.get_submodule(p).register_forward_hook(
        lambda m, a, o, i=i: got.__setitem__(i, o.detach().float()))
        for i, p in enumerate(fam.head_taps)]
    try:
        with torch.inference_mode():
            smollm.model(torch.tensor([list(captured.ids)]))
    finally:
        for h in hooks:
            h.remove()
    quiet = Steps(head=0, kv_head=0, n_heads=9, n_kv_heads=3, quiet=True)
    q, k, v = fam.heads(got[0], got[1], got[2], blk.get_submodule(fam.attn), smollm.config, 0,
                        quiet, smollm.model, fam)
    ours = block_points(captured, llamacpp_names_for("llama"), 0, 9, 3)
    for point, theirs in ((Point.q, q), (Point.k, k), (Point.v, v)):
        a = theirs[0].numpy()
        rel = np.linalg.norm(ours[point] - a) / np.linalg.norm(a)
        assert rel < 0.05, (point, rel)
