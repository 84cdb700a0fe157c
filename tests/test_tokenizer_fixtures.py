"""The offline tokenizer fixtures of tests/tokenizer_fixtures.py load like real checkpoints,
and what they show about real tokenizers (transformers 5, tokenizers 0.2x):

BOS. Only the byte-level GPT-2 style adds nothing; every other style puts its BOS first,
from tokenizer.json's TemplateProcessing post-processor. `tok.add_bos_token` reads False for
all of them (transformers 5 drops tokenizer_config's add_bos_token when a tokenizer.json is
there), so a BOS must be detected from an encoding.

Offsets (return_offsets_mapping=True). A BOS added by the post-processor has the empty span
(0, 0). A word after a space includes that space in every style: "ĠFrance" (byte-level,
trim_offsets False as GPT-2 and Llama-3 ship it) and "▁France" (SentencePiece: that "▁" IS the
text's space) both span (14, 21) of "The capital of France is", where " France" is (14, 21)
and "France" (15, 21); a subject span overlaps its tokens either way. The "▁" that Metaspace /
Prepend add in front of the first word stands for no character: "▁The" spans (0, 3). A prefix
"▁" that is a token of its own shares a span with its neighbour: Unigram "café" -> "▁" (0, 1),
"c" (0, 1); legacy " Paris" -> "▁" (0, 1), "▁Paris" (0, 6). Spans can overlap; map
characters to tokens by overlap, not by assuming a partition. The bytes of one character
(byte-level pieces, or <0xE2><0x98><0x83>) all get that character's span.

Leading spaces. Byte-level: " Paris" -> "ĠParis" but "Paris" -> another token. Metaspace
(prepend_scheme "first"): " Paris" and "Paris" both give "▁Paris" (the text's own space is the
prefix). Legacy Llama-2 normalizer: " Paris" -> "▁", "▁Paris" (two tokens: the prefix plus the
text's space). Gemma (no prefix): " Paris" -> "▁Paris", "Paris" -> pieces without "▁".

Chat templates. apply_chat_template(tokenize=True) returns a BatchEncoding (return_dict
defaults to True in transformers 5; return_dict=False gives the list) and encodes the rendered
text with add_special_tokens=False, so the template's own bos_token is the only BOS. Encoding
the rendered text again WITH special tokens (what a plain `tok(text)` does) gives two BOS.
Without a template: ValueError("Cannot use chat template functions because
tokenizer.chat_template is not set and no template argument was passed! ...").

Decoding one token: the SentencePiece decoders that Strip the prefix (Llama-2, Mistral) drop
the leading space, so decode([id of "▁France"]) == "France"; Gemma's keeps " France";
byte-level gives " France".
"""

from __future__ import annotations

import json
import time

import pytest
import tokenizer_fixtures as tf

PROMPT = "The capital of France is"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]

# name -> (BOS token or None, tokens of " Paris" without specials, first token of PROMPT)
EXPECTED = {
    "gpt2": (None, ["ĠParis"], "The"),
    "sentencepiece": ("<s>", ["▁Paris"], "▁The"),
    "sentencepiece-unigram": ("<s>", ["▁Paris"], "▁The"),
    "llama2-legacy": ("<s>", ["▁", "▁Paris"], "▁The"),
    "gemma": ("<bos>", ["▁Paris"], "T"),
    "llama3": ("<|begin_of_text|>", ["ĠParis"], "The"),
}

CHAT_TEXT = {
    "sentencepiece": "<s>[INST] What is the capital of France? [/INST]",
    "sentencepiece-unigram": "<s>[INST] What is the capital of France? [/INST]",
    "llama2-legacy": "<s>[INST] What is the capital of France? [/INST]",
    "gemma": "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
             "<start_of_turn>model\n",
    "llama3": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
              "What is the capital of France?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n",
}

SENTENCEPIECE = ["sentencepiece", "sentencepiece-unigram", "llama2-legacy", "gemma"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tf.build_all(tmp_path_factory.mktemp("tokenizer-fixtures"))


@pytest.fixture(scope="module")
def toks(folders):
    from transformers import AutoTokenizer

    return {name: AutoTokenizer.from_pretrained(folder) for name, folder in folders.items()}


def test_every_style_is_built(folders):
    assert set(folders) == set(EXPECTED)
    for name, folder in folders.items():
        files = {p.name for p in folder.iterdir()}
        assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "config.json", "model.safetensors"} <= files, name
        config = json.loads((folder / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
        assert ("chat_template" in config) == (name != "gpt2")


def test_builds_are_fast_and_byte_identical(folders, tmp_path):
    for name, build in tf.BUILDERS.items():
        start = time.perf_counter()
        again = build(tmp_path / name)
        took = time.perf_counter() - start
        assert took < 5, f"{name} took {took:.2f} s"  # ~0.03-0.1 s on 2 shared cores
        for f in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
            assert (again / f).read_bytes() == (folders[name] / f).read_bytes(), (name, f)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bos_first_or_not(toks, name):
    tok = toks[name]
    bos, _, first = EXPECTED[name]
    ids = tok(PROMPT)["input_ids"]
    tokens = tok.convert_ids_to_tokens(ids)
    if bos is None:
        assert ids[0] != tok.bos_token_id and tok.bos_token_id not in ids
        assert tokens[0] == first
    else:
        assert tok.bos_token == bos and ids[0] == tok.bos_token_id
        assert ids.count(tok.bos_token_id) == 1
        assert tokens[1] == first
    # transformers 5: the attribute says nothing about what the post-processor adds
    assert tok.add_bos_token is False


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_offsets_locate_the_subject(toks, name):
    tok = toks[name]
    enc = tok(PROMPT, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    assert len(offsets) == len(ids)
    if EXPECTED[name][0] is not None:
        assert offsets[0] == (0, 0)  # the BOS covers no character
    for subject in ("France", " France"):
        lo = PROMPT.index(subject)
        hi = lo + len(subject)
        hit = [i for i, (a, b) in enumerate(offsets) if a < hi and b > lo]
        assert hit, (name, subject)
        assert tok.decode([ids[i] for i in hit]).strip() == "France"
        # the word's token(s) span the space before it too: (14, 21), not (15, 21)
        assert offsets[hit[0]][0] == PROMPT.index(" France")
        assert offsets[hit[-1]][1] == hi


def test_offsets_of_a_lone_prefix(toks):
    def spans(name, text):
        enc = toks[name](text, add_special_tokens=False, return_offsets_mapping=True)
        return list(zip(toks[name].convert_ids_to_tokens(enc["input_ids"]),
                        enc["offset_mapping"]))

    assert spans("sentencepiece-unigram", "café")[:2] == [("▁", (0, 1)), ("c", (0, 1))]
    assert spans("llama2-legacy", " Paris") == [("▁", (0, 1)), ("▁Paris", (0, 6))]
    assert spans("sentencepiece", " Paris") == [("▁Paris", (0, 6))]
    assert spans("sentencepiece", "Paris") == [("▁Paris", (0, 5))]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_leading_space_with_and_without_specials(toks, name):
    tok = toks[name]
    bos, paris, _ = EXPECTED[name]
    bare = tok(" Paris", add_special_tokens=False)["input_ids"]
    full = tok(" Paris")["input_ids"]
    assert tok.convert_ids_to_tokens(bare) == paris
    assert full == ([tok.bos_token_id] if bos else []) + bare
    no_space = tok("Paris", add_special_tokens=False)["input_ids"]
    if name in ("sentencepiece", "sentencepiece-unigram", "llama2-legacy"):
        # the prefix "▁" makes "Paris" and " Paris" (at the start) the same token
        assert tok.convert_ids_to_tokens(no_space) == ["▁Paris"]
    else:
        assert no_space != bare


@pytest.mark.parametrize("name", sorted(CHAT_TEXT))
def test_chat_template(toks, name):
    tok = toks[name]
    text = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert text == CHAT_TEXT[name]
    enc = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    ids = enc["input_ids"]  # a BatchEncoding: return_dict is True by default
    assert ids == tok.apply_chat_template(QUESTION, add_generation_prompt=True,
                                          tokenize=True, return_dict=False)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    # encoding the rendered text as a prompt adds a second BOS
    assert tok(text)["input_ids"][:2] == [tok.bos_token_id] * 2


def test_no_chat_template_for_gpt2(toks):
    with pytest.raises(ValueError, match="chat_template is not set"):
        toks["gpt2"].apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)


@pytest.mark.parametrize("name", SENTENCEPIECE)
def test_byte_fallback(toks, name):
    tok = toks[name]
    enc = tok("a ☃", add_special_tokens=False, return_offsets_mapping=True)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    assert tokens[-3:] == ["<0xE2>", "<0x98>", "<0x83>"]
    assert enc["offset_mapping"][-3:] == [(2, 3)] * 3
    assert tok.decode(enc["input_ids"]) == "a ☃"
    assert tok.unk_token_id not in enc["input_ids"]


def test_single_token_decoding(toks):
    """What a per-token display shows for the subject token of each style."""
    shown = {}
    for name, tok in toks.items():
        ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
        france = next(i for i in ids if "France" in tok.convert_ids_to_tokens(i))
        shown[name] = tok.decode([france])
    assert shown == {"gpt2": " France", "llama3": " France", "gemma": " France",
                     "sentencepiece": "France", "sentencepiece-unigram": "France",
                     "llama2-legacy": "France"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tiny_model_runs(folders, toks, name):
    import torch
    from transformers import AutoModelForCausalLM

    tok = toks[name]
    model = AutoModelForCausalLM.from_pretrained(folders[name]).eval()
    cfg = model.config
    assert cfg.model_type == "llama" and cfg.num_hidden_layers == 2
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size) == (64, 4, 2, 96)
    assert cfg.tie_word_embeddings is False
    assert cfg.vocab_size == len(tok)
    assert (cfg.bos_token_id, cfg.eos_token_id) == (tok.bos_token_id, tok.eos_token_id)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert torch.isfinite(logits).all()
    if name in CHAT_TEXT:
        chat = tok.apply_chat_template(QUESTION, add_generation_prompt=True,
                                       return_tensors="pt")["input_ids"]
        with torch.no_grad():
            assert model(chat).logits.shape[1] == chat.shape[1]
