"""`--engine llama.cpp` beyond Llama's architecture: for each family whose llama.cpp names are
mapped, a tiny GGUF written here (tests/tiny_gguf.py: a tiny random model of the family under
llama.cpp's tensor names and metadata) runs in llama.cpp through the engine, and every block's
stream, and with --deep every point llama.cpp names, is held to the stream transformers computes
from the same file (loaded through transformers' GGUF support); a weight scaled in a copy of the
file is named at its block and operation."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fptrace.engines.llamacpp import binding as B

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(B.installed_version() is None,
                                 reason="the [llamacpp] extra (xllamacpp) is not installed")]

PROMPT = "The capital of France is"
# both engines in float32 end to end: llama.cpp's K/V cache in f32 and its plain attention
EXACT = {"flash_attn": "off", "kv_cache": "f32"}
# float32 sums in another order, through a few tiny blocks: measured below 2e-6 on every family
FLOAT32 = 1e-5
# (fptrace family, GGUF architecture, the converter permutes W_Q/W_K, the tensor a fault scales,
# the block and point where it first acts). A Mistral GGUF is Llama's architecture (transformers
# loads it as a Llama): the llama row covers it.
ARCHS = [
    ("llama", "llama", True, "blk.1.ffn_down.weight", 1, "mlp_out"),
    ("qwen2", "qwen2", False, "blk.1.attn_q.bias", 1, "q"),
    ("qwen3", "qwen3", False, "blk.0.attn_k_norm.weight", 0, "k"),
]
# what transformers' GGUF loader assumes of a family and does not read from the file: Qwen3's
# head_dim (its config's default, 128, whatever the file's key_length says)
CONFIG = {"qwen3": {"head_dim": 128}}


def tiny_model(family: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from fptrace.families import FAMILIES
    from tiny_gguf import VOCAB

    cfg = dict(next(f for f in FAMILIES if f.name == family).tiny)
    config = AutoConfig.for_model(cfg.pop("model_type"), **{
        **cfg, "vocab_size": VOCAB, "tie_word_embeddings": False, **CONFIG.get(family, {})})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():  # biases and norm weights away from their initial 0 and 1
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def scaled(path: str, out: str, tensor: str, factor: float) -> str:
    """A copy of the GGUF at `path` with one float32 tensor scaled where it lies."""
    from gguf import GGUFReader

    shutil.copyfile(path, out)
    reader = GGUFReader(out, "r+")
    t = next(t for t in reader.tensors if t.name == tensor)
    t.data[...] = (np.asarray(t.data) * np.float32(factor)).astype(t.data.dtype)
    reader.data.flush()
    del reader
    return out


@pytest.fixture(scope="module", params=ARCHS, ids=[a[0] for a in ARCHS])
def tiny(request, tmp_path_factory, gguf, cache_dir):
    from fptrace.models.loading import load_model
    from tiny_gguf import write

    family, arch, adjacent, tensor, _, _ = request.param
    folder = tmp_path_factory.mktemp(family)
    path = str(folder / f"tiny-{family}.gguf")
    write(tiny_model(family), path, arch, gguf, rope_adjacent=adjacent)
    faulted = scaled(path, str(folder / f"faulted-{family}.gguf"), tensor, 1.5)
    return request.param, path, faulted, load_model(path, device="cpu")


def test_every_point_llamacpp_names_matches_transformers(tiny):
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine

    (family, arch, *_), path, _, lm = tiny
    assert lm.parts.family.name == family
    result = engine_diff(lm, engine("llama.cpp"), path, PROMPT, settings=EXACT, deep=True,
                         tolerance=FLOAT32)
    blocks = [r.rel_diff for r in result.layers if r.layer is not None]
    assert len(blocks) == len(lm.parts.blocks) and max(blocks) < FLOAT32, blocks
    assert result.deep.parted is None, result.deep.parted.sentence
    compared = {p.point for b in result.deep.blocks for p in b.points}
    assert {"resid_pre", "ln1", "q", "k", "v", "z", "attn_out", "resid_mid", "ln2",
            "mlp_out", "resid_post"} <= compared, compared
    assert result.within


def test_the_runs_own_checks_pass(tiny):
    from typer.testing import CliRunner

    from fptrace.cli.main import app

    (family, *_), path, _, lm = tiny
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

    (family, _, _, tensor, block, point), _, faulted, lm = tiny
    result = engine_diff(lm, engine("llama.cpp"), faulted, PROMPT, settings=EXACT, deep=True,
                         tolerance=1e-3)
    parted = result.deep.parted
    assert parted is not None, f"{family}: {tensor} scaled, nothing parted"
    assert (parted.layer, parted.point) == (block, point), parted.sentence
