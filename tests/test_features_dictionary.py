"""fptrace features: dictionaries read from the folders SAELens, Gemma Scope and sparsify write,
with known weights; each format's encoding computed here in numpy from its own formula; the
place read from the config; bad folders refused in one line."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from fptrace.addresses import Site
from fptrace.core.dictionaries import check_model, check_role, read_dictionary
from fptrace.core.dictionary_sites import MLP_IN, same_tensor
from fptrace.core.dictionary_sites import dictionary_site as parse_site
from fptrace.errors import BadInput

D, N = 8, 24


def weights(seed: int = 0, d_in: int = D, n: int = N, d_out: int = D) -> dict:
    r = np.random.default_rng(seed)
    return {"W_enc": r.normal(size=(d_in, n)).astype(np.float32),
            "W_dec": r.normal(size=(n, d_out)).astype(np.float32),
            "b_enc": r.normal(size=n).astype(np.float32) * 0.5,
            "b_dec": r.normal(size=d_out).astype(np.float32),
            "threshold": np.abs(r.normal(size=n)).astype(np.float32)}


def write_saelens(folder, w, arch="standard", hook="blocks.1.hook_resid_pre", k=None, meta=False,
                  **extra):
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    cfg = {"architecture": arch, "d_in": int(w["W_enc"].shape[0]),
           "d_sae": int(w["W_enc"].shape[1]), "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": True, "normalize_activations": "none", **extra}
    if meta:
        cfg["metadata"] = {"hook_name": hook, "model_name": "tiny"}
    else:
        cfg["hook_name"] = hook
    if k is not None:
        cfg["k"] = k
    with open(os.path.join(folder, "cfg.json"), "w") as f:
        json.dump(cfg, f)
    names = ("W_enc", "W_dec", "b_enc", "b_dec") + (("threshold",) if arch in (
        "jumprelu", "batchtopk", "jumprelu_transcoder", "jumprelu_skip_transcoder") else ()) + \
        (("W_skip",) if "W_skip" in w else ())
    save_file({n: np.ascontiguousarray(w[n]) for n in names},
              os.path.join(folder, "sae_weights.safetensors"))
    return str(folder)


def write_gemmascope(folder, w, npz=True):
    os.makedirs(folder, exist_ok=True)
    if npz:
        np.savez(os.path.join(folder, "params.npz"), **w)
    else:
        from safetensors.numpy import save_file

        save_file({n: np.ascontiguousarray(v) for n, v in w.items()},
                  os.path.join(folder, "params.safetensors"))
    return str(folder)


def write_sparsify(root, w, hook="layers.1", k=4, transcode=False, skip=False):
    from safetensors.numpy import save_file

    folder = os.path.join(root, hook)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "cfg.json"), "w") as f:
        d_in, n = w["W_enc"].shape
        json.dump({"expansion_factor": n // d_in, "normalize_decoder": True, "num_latents": n,
                   "k": k, "multi_topk": False, "skip_connection": skip,
                   "transcode": transcode, "d_in": d_in}, f)
    save_file({"encoder.weight": np.ascontiguousarray(w["W_enc"].T), "encoder.bias": w["b_enc"],
               "W_dec": np.ascontiguousarray(w["W_dec"]), "b_dec": w["b_dec"],
               **({"W_skip": np.ascontiguousarray(w["W_skip"])} if "W_skip" in w else {})},
              os.path.join(folder, "sae.safetensors"))
    return folder


def stream(n=5, seed=3):
    return np.random.default_rng(seed).normal(size=(n, D)).astype(np.float32) * 2


def relu(x):
    return np.maximum(x, 0)


def encode(d, x):
    return d.encode(torch.from_numpy(x)).numpy()


def test_saelens_standard_is_relu_of_the_shifted_input(tmp_path):
    w, x = weights(), stream()
    d = read_dictionary(write_saelens(tmp_path / "s", w))
    want = relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
    np.testing.assert_allclose(encode(d, x), want, rtol=1e-5, atol=1e-5)
    assert (d.format, d.kind, d.role, d.site) == ("saelens", "relu", "sae", Site(1, "resid_pre"))
    assert (want > 0).any() and (want == 0).any()


def test_saelens_jumprelu_keeps_what_passes_its_threshold(tmp_path):
    w, x = weights(1), stream()
    d = read_dictionary(write_saelens(tmp_path / "s", w, arch="jumprelu",
                                      hook="blocks.0.hook_resid_post", meta=True))
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    want = np.where(pre > w["threshold"], relu(pre), 0)
    np.testing.assert_allclose(encode(d, x), want, rtol=1e-5, atol=1e-5)
    assert d.site == Site(0, "resid_post")
    assert ((pre > 0) & (pre <= w["threshold"])).any()  # the threshold matters in this test


def test_saelens_topk_keeps_k_per_row(tmp_path):
    w, x = weights(2), stream()
    d = read_dictionary(write_saelens(tmp_path / "s", w, arch="topk", k=3))
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    want = np.zeros_like(pre)
    for r in range(len(pre)):
        top = np.argsort(-pre[r])[:3]
        want[r, top] = relu(pre[r, top])
    np.testing.assert_allclose(encode(d, x), want, rtol=1e-5, atol=1e-5)
    assert ((encode(d, x) > 0).sum(-1) <= 3).all()


def test_saelens_batchtopk_runs_as_jumprelu_with_its_threshold(tmp_path):
    w, x = weights(3), stream()
    d = read_dictionary(write_saelens(tmp_path / "s", w, arch="batchtopk", k=3))
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    np.testing.assert_allclose(encode(d, x), np.where(pre > w["threshold"], relu(pre), 0),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("npz", [True, False])
def test_gemmascope_jumprelu_without_shift_and_place_from_the_path(tmp_path, npz):
    w, x = weights(4), stream()
    folder = tmp_path / "gemma-scope-2b-pt-res" / "layer_2" / "width_16k" / "average_l0_8"
    d = read_dictionary(write_gemmascope(folder, w, npz=npz))
    pre = x @ w["W_enc"] + w["b_enc"]
    np.testing.assert_allclose(encode(d, x), np.where(pre > w["threshold"], relu(pre), 0),
                               rtol=1e-5, atol=1e-5)
    assert (d.format, d.site, d.role) == ("gemmascope", Site(2, "resid_post"), "sae")


def test_gemmascope_transcoder_from_the_path(tmp_path):
    w = weights(5)
    folder = tmp_path / "gemma-scope-2b-pt-transcoders" / "layer_1" / "width_16k" / "l0_9"
    d = read_dictionary(write_gemmascope(folder, w))
    assert (d.role, d.site, d.out_site) == ("transcoder", Site(1, MLP_IN), Site(1, "mlp_out"))
    with pytest.raises(BadInput, match="is a transcoder"):
        check_role(d, "sae")


def test_sparsify_topk_after_relu_of_the_shifted_input(tmp_path):
    w, x = weights(6), stream()
    d = read_dictionary(write_sparsify(str(tmp_path), w, k=4))
    pre = relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
    want = np.zeros_like(pre)
    for r in range(len(pre)):
        top = np.argsort(-pre[r])[:4]
        want[r, top] = pre[r, top]
    np.testing.assert_allclose(encode(d, x), want, rtol=1e-5, atol=1e-5)
    assert d.site == Site(1, "resid_post")
    np.testing.assert_allclose(d.decode(torch.from_numpy(want)).numpy(),
                               want @ w["W_dec"] + w["b_dec"], rtol=1e-5, atol=1e-5)


def test_sparsify_transcoder_is_caught_as_an_sae(tmp_path):
    d = read_dictionary(write_sparsify(str(tmp_path), weights(7), hook="layers.0.mlp",
                                       transcode=True))
    assert (d.role, d.site, d.out_site) == ("transcoder", Site(0, MLP_IN), Site(0, "mlp_out"))
    with pytest.raises(BadInput, match="transcoder"):
        check_role(d, "sae")


def test_saelens_transcoder_is_caught_as_an_sae(tmp_path):
    d = read_dictionary(write_saelens(tmp_path / "t", weights(8), arch="transcoder",
                                      hook="blocks.1.hook_mlp_in",
                                      hook_name_out="blocks.1.hook_mlp_out"))
    with pytest.raises(BadInput, match="is a transcoder .*blocks.1.hook_mlp_in → "
                       "blocks.1.hook_mlp_out"):
        check_role(d, "sae")


def test_hook_names_of_every_format():
    assert parse_site("blocks.3.hook_resid_pre") == Site(3, "resid_pre")
    assert parse_site("blocks.3.hook_resid_post") == Site(3, "resid_post")
    assert parse_site("blocks.3.hook_mlp_out") == Site(3, "mlp_out")
    assert parse_site("blocks.3.ln2.hook_normalized") == Site(3, MLP_IN)
    assert parse_site("layers.3") == Site(3, "resid_post")
    assert parse_site("model.layers.3.output") == Site(3, "resid_post")
    assert parse_site("layers.3.mlp") == Site(3, "mlp_out")
    assert same_tensor(Site(2, "resid_post"), Site(3, "resid_pre"))
    assert not same_tensor(Site(3, "resid_post"), Site(3, "resid_pre"))
    for bad in ("blocks.².hook_resid_pre", "blocks.1.attn.hook_z", "layers.-1", ""):
        with pytest.raises(BadInput):
            parse_site(bad)


def test_the_wrong_site_is_caught(tmp_path):
    """One block off, or after the block instead of before: --site against the config, the
    config's hook_layer against its hook_name, and the block against the model."""
    folder = write_saelens(tmp_path / "s", weights(), hook="blocks.1.hook_resid_pre")
    read_dictionary(folder, site="blocks.0.hook_resid_post")  # the same tensor
    with pytest.raises(BadInput, match="was trained on blocks.1.hook_resid_pre"):
        read_dictionary(folder, site="blocks.1.hook_resid_post")  # after instead of before
    with pytest.raises(BadInput, match="was trained on"):
        read_dictionary(folder, site="blocks.2.hook_resid_pre")  # one block off
    off = write_saelens(tmp_path / "o", weights(), hook="blocks.1.hook_resid_pre", hook_layer=2)
    with pytest.raises(BadInput, match="hook_layer 2 and hook_name"):
        read_dictionary(off)
    d = read_dictionary(write_saelens(tmp_path / "f", weights(), hook="blocks.2.hook_resid_post"))
    with pytest.raises(BadInput, match="has blocks 0 to 1"):
        check_model(d, 2, D, "tiny")
    with pytest.raises(BadInput, match="width 8 .* width 16"):
        check_model(read_dictionary(folder), 2, 16, "tiny")


def _line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_bad_folders_are_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadInput, match="no config") as e:
        read_dictionary(str(empty))
    _line(e)
    with pytest.raises(BadInput, match="no such folder"):
        read_dictionary(str(tmp_path / "nowhere"))
    w = weights()
    w["W_dec"] = w["W_dec"][:, :6]
    with pytest.raises(BadInput, match="another width") as e:
        read_dictionary(write_saelens(tmp_path / "w", w))
    _line(e)
    folder = write_saelens(tmp_path / "t", weights())
    path = os.path.join(folder, "sae_weights.safetensors")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])
    with pytest.raises(BadInput, match="truncated") as e:
        read_dictionary(folder)
    _line(e)
    cfg = os.path.join(write_saelens(tmp_path / "j", weights()), "cfg.json")
    with open(cfg, "w") as f:
        f.write("{not json")
    with pytest.raises(BadInput, match="as JSON"):
        read_dictionary(os.path.dirname(cfg))
    with pytest.raises(BadInput, match="architecture 'gated'"):
        read_dictionary(write_saelens(tmp_path / "g", weights(), arch="gated"))
    with pytest.raises(BadInput, match="k '³'"):
        read_dictionary(write_saelens(tmp_path / "k", weights(), arch="topk", k="³"))


@pytest.mark.parametrize("kind, role, site", [
    ("resid_post_all", "sae", Site(7, "resid_post")),
    ("resid_post", "sae", Site(7, "resid_post")),
    ("mlp_out_all", "sae", Site(7, "mlp_out")),
    ("transcoder_all", "transcoder", Site(7, MLP_IN)),
])
def test_gemma_scope_2_places_from_its_layout(tmp_path, kind, role, site):
    """Gemma Scope 2 names a dictionary kind_all/layer_L_width_W_l0_S/params.safetensors."""
    folder = tmp_path / kind / "layer_7_width_16k_l0_big"
    d = read_dictionary(write_gemmascope(folder, weights(9), npz=False))
    assert (d.format, d.role, d.site) == ("gemmascope", role, site)


def test_only_the_folder_above_the_layer_names_the_site(tmp_path):
    """A user's folder further up that happens to say mlp or res changes nothing."""
    mine = tmp_path / "mlp-experiments" / "gemma-scope-2b-pt-res" / "layer_3" / "width_16k" / "x"
    assert read_dictionary(write_gemmascope(mine, weights(10))).site == Site(3, "resid_post")
    vague = tmp_path / "results" / "mine" / "layer_3"
    with pytest.raises(BadInput, match=r"give site$"):
        read_dictionary(write_gemmascope(vague, weights(10)))


# ---- skip (affine) transcoders: W_skip read in each format's own orientation ----------------

D_OUT = 6  # a transcoder's output width other than its input's: W_skip's orientation shows


def skip_weights(seed: int, d_out: int = D_OUT) -> dict:
    w = weights(seed, d_out=d_out)
    w["W_skip"] = np.random.default_rng(seed + 100).normal(size=(d_out, D)).astype(np.float32)
    return w  # W_skip (d_out, d_in): SAELens's and sparsify's layout, applied as x @ W_skip.T


def reconstruct(d, x):
    return d.reconstruct(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("arch", ["skip_transcoder", "jumprelu_skip_transcoder"])
def test_saelens_skip_transcoder_adds_x_times_w_skip_transposed(tmp_path, arch):
    """SAELens's SkipTranscoder: W_dec·f(x) + b_dec + x @ W_skip.T, W_skip (d_out, d_in)."""
    w, x = skip_weights(20), stream()
    d = read_dictionary(write_saelens(tmp_path / "s", w, arch=arch,
                                      hook="blocks.1.ln2.hook_normalized",
                                      hook_name_out="blocks.1.hook_mlp_out", d_out=D_OUT))
    pre = x @ w["W_enc"] + w["b_enc"]  # a transcoder's input is not shifted
    a = relu(pre) if arch == "skip_transcoder" else np.where(pre > w["threshold"], relu(pre), 0)
    want = a @ w["W_dec"] + w["b_dec"] + x @ w["W_skip"].T
    np.testing.assert_allclose(reconstruct(d, x), want, rtol=1e-5, atol=1e-4)
    assert d.role == "transcoder" and d.W_skip is not None and tuple(d.W_skip.shape) == (D, D_OUT)
    assert np.abs(x @ w["W_skip"].T).max() > 1  # the skip term matters in this test


def test_sparsify_skip_connection_adds_x_times_w_skip_transposed(tmp_path):
    """sparsify's `skip_connection`: sae_out += x @ W_skip.mT, W_skip square (d, d)."""
    w, x = skip_weights(21, d_out=D), stream()
    folder = write_sparsify(tmp_path, w, hook="layers.1.mlp", k=5, transcode=True, skip=True)
    d = read_dictionary(folder)
    pre = x @ w["W_enc"] + w["b_enc"]
    a = np.zeros_like(pre)
    for r in range(len(pre)):
        top = np.argsort(-pre[r])[:5]
        a[r, top] = relu(pre[r, top])
    want = a @ w["W_dec"] + w["b_dec"] + x @ w["W_skip"].T
    np.testing.assert_allclose(reconstruct(d, x), want, rtol=1e-5, atol=1e-4)
    assert not np.allclose(x @ w["W_skip"].T, x @ w["W_skip"])  # the orientation matters


def test_gemmascope_affine_transcoder_adds_x_times_w_skip(tmp_path):
    """Gemma Scope 2's affine transcoders: x @ W_skip, W_skip (d_in, d_out) as W_enc is."""
    w, x = skip_weights(22), stream()
    w["W_skip"] = np.ascontiguousarray(w["W_skip"].T)  # (d_in, d_out)
    folder = tmp_path / "transcoder_all" / "layer_2_width_16k_l0_small_affine"
    d = read_dictionary(write_gemmascope(folder, w, npz=False))
    pre = x @ w["W_enc"] + w["b_enc"]
    want = np.where(pre > w["threshold"], relu(pre), 0) @ w["W_dec"] + w["b_dec"] + \
        x @ w["W_skip"]
    np.testing.assert_allclose(reconstruct(d, x), want, rtol=1e-5, atol=1e-4)
    assert d.role == "transcoder" and d.site == Site(2, MLP_IN)


def test_a_dictionary_without_a_skip_reconstructs_without_one(tmp_path):
    w, x = weights(23), stream()
    d = read_dictionary(write_saelens(tmp_path / "s", w))
    assert d.W_skip is None
    np.testing.assert_allclose(reconstruct(d, x), encode(d, x) @ w["W_dec"] + w["b_dec"],
                               rtol=1e-5, atol=1e-4)


def test_w_skip_in_an_sae_is_refused_in_every_format(tmp_path):
    w = weights(24)
    w["W_skip"] = np.eye(D, dtype=np.float32)
    with pytest.raises(BadInput, match="W_skip only in a transcoder") as e:
        read_dictionary(write_saelens(tmp_path / "s", w))
    _line(e)
    with pytest.raises(BadInput, match="W_skip only in a transcoder"):
        read_dictionary(write_gemmascope(tmp_path / "gemma-scope-2b-pt-res" / "layer_1", w))
    with pytest.raises(BadInput, match="skip_connection in an SAE"):
        read_dictionary(write_sparsify(tmp_path / "sp", w, skip=True))


def test_w_skip_undeclared_missing_transposed_or_not_finite_is_refused(tmp_path):
    place = {"hook": "blocks.1.ln2.hook_normalized", "hook_name_out": "blocks.1.hook_mlp_out",
             "d_out": D_OUT}
    w = skip_weights(25)
    with pytest.raises(BadInput, match="does not declare a skip transcoder"):
        read_dictionary(write_saelens(tmp_path / "a", w, arch="transcoder", **place))
    bare = {n: v for n, v in w.items() if n != "W_skip"}
    with pytest.raises(BadInput, match="lacks the tensor W_skip"):
        read_dictionary(write_saelens(tmp_path / "b", bare, arch="skip_transcoder", **place))
    flipped = {**w, "W_skip": np.ascontiguousarray(w["W_skip"].T)}
    with pytest.raises(BadInput, match=r"W_skip .*looks transposed"):
        read_dictionary(write_saelens(tmp_path / "c", flipped, arch="skip_transcoder", **place))
    bad = {**w, "W_skip": w["W_skip"].copy()}
    bad["W_skip"][0, 0] = np.nan
    with pytest.raises(BadInput, match=r"W_skip.*NaN") as e:
        read_dictionary(write_saelens(tmp_path / "d", bad, arch="skip_transcoder", **place))
    _line(e)


# ---- hostile files (issue 41): sizes checked before use, only regular files, honest answers --

@pytest.mark.parametrize("shape", [(D * N,), (D, N, 1)])
def test_gemmascope_w_enc_of_another_rank_is_refused_before_use(tmp_path, shape):
    """W_enc of one or three dimensions: its sizes were unpacked before any check (exit 70)."""
    w = weights(12)
    w["W_enc"] = w["W_enc"].reshape(shape)
    folder = tmp_path / "gemma-scope-2b-pt-res" / "layer_1" / "width_16k" / "l0_8"
    with pytest.raises(BadInput, match=f"W_enc has {len(shape)} dimension") as e:
        read_dictionary(write_gemmascope(folder, w))
    _line(e)


def test_every_tensor_is_checked_against_the_others(tmp_path):
    """Gemma Scope has no config: each width is read from a vector and every tensor checked
    against it (a b_dec of a 2-D shape, a threshold of another width)."""
    folder = tmp_path / "gemma-scope-2b-pt-res" / "layer_1" / "width_16k"
    w = weights(13)
    w["b_dec"] = w["b_dec"][None]
    with pytest.raises(BadInput, match="b_dec has 2 dimensions"):
        read_dictionary(write_gemmascope(folder / "a", w))
    w = weights(13)
    w["threshold"] = w["threshold"][:5]
    with pytest.raises(BadInput, match="threshold has shape"):
        read_dictionary(write_gemmascope(folder / "b", w))
    w = weights(13)
    w["encoder.weight"] = w["W_enc"].T[None]  # sparsify's encoder of three dimensions
    with pytest.raises(BadInput, match="encoder.weight has 3 dimensions"):
        from safetensors.numpy import save_file

        path = write_sparsify(str(tmp_path / "s"), weights(13))
        save_file({"encoder.weight": np.ascontiguousarray(w["encoder.weight"]),
                   "encoder.bias": w["b_enc"], "W_dec": w["W_dec"], "b_dec": w["b_dec"]},
                  os.path.join(path, "sae.safetensors"))
        read_dictionary(path)


def test_a_gemmascope_file_of_zero_latents_is_refused(tmp_path):
    w = {n: (v[:, :0] if n == "W_enc" else v[:0] if n in ("W_dec", "b_enc", "threshold") else v)
         for n, v in weights(14).items()}
    folder = tmp_path / "gemma-scope-2b-pt-res" / "layer_1" / "width_0"
    with pytest.raises(BadInput, match="0 latents") as e:
        read_dictionary(write_gemmascope(folder, w))
    _line(e)


def test_k_larger_than_the_latents_is_refused(tmp_path):
    with pytest.raises(BadInput, match=f"k {N + 1} is larger than the dictionary's {N} latents"):
        read_dictionary(write_saelens(tmp_path / "s", weights(), arch="topk", k=N + 1))
    with pytest.raises(BadInput, match=f"k {N + 6} is larger"):
        read_dictionary(write_sparsify(str(tmp_path / "p"), weights(), k=N + 6))
    assert read_dictionary(write_saelens(tmp_path / "e", weights(), arch="topk", k=N)).k == N


@pytest.mark.parametrize("value", ["false", "true", 0, 1])
def test_a_switch_that_is_not_a_json_boolean_is_refused(tmp_path, value):
    """"false" (a string) was read as true: the input shifted by b_dec when the config said
    not to."""
    folder = write_saelens(tmp_path / "s", weights(), apply_b_dec_to_input=value)
    with pytest.raises(BadInput, match="apply_b_dec_to_input .* is not a JSON boolean") as e:
        read_dictionary(folder)
    _line(e)
    assert not read_dictionary(write_saelens(tmp_path / "f", weights(),
                                             apply_b_dec_to_input=False)).shift_input
    sp = write_sparsify(str(tmp_path / "p"), weights(), transcode=value)
    with pytest.raises(BadInput, match="transcode .* is not a JSON boolean"):
        read_dictionary(sp)


def test_a_transposed_decoder_is_called_transposed(tmp_path):
    w = weights()
    w["W_dec"] = np.ascontiguousarray(w["W_dec"].T)  # (d_model, d_sae)
    with pytest.raises(BadInput, match=rf"W_dec has shape \({D}, {N}\) where \({N}, {D}\) was "
                       "expected .*looks transposed") as e:
        read_dictionary(write_saelens(tmp_path / "s", w))
    _line(e)
    w = weights()
    w["W_enc"] = np.ascontiguousarray(w["W_enc"].T)
    folder = tmp_path / "gemma-scope-2b-pt-res" / "layer_1" / "width_16k"
    with pytest.raises(BadInput, match="W_enc has shape .* looks transposed"):
        read_dictionary(write_gemmascope(folder, w))


def test_a_symlink_loop_is_not_called_a_missing_folder(tmp_path):
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    with pytest.raises(BadInput, match="symbolic link loop") as e:
        read_dictionary(str(loop))
    _line(e)
    gone = tmp_path / "gone"
    os.symlink(tmp_path / "elsewhere", gone)
    with pytest.raises(BadInput, match="a symbolic link to .*elsewhere.*which does not exist"):
        read_dictionary(str(gone))
    with pytest.raises(BadInput, match="no such folder"):
        read_dictionary(str(tmp_path / "nowhere"))
