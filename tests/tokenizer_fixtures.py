"""Offline model folders whose tokenizers are built the way real model families ship them.

The suite's other tokenizers (GPT-2's BPE, the bundled SmolLM2) add no begin-of-text token.
The folders made here differ the way real checkpoints do:

- `gpt2_style`: byte-level BPE ("Ġ" marks a leading space), no BOS added, no chat template.
- `sentencepiece_style`: Llama-2 as transformers converts it today (Mistral and TinyLlama
  alike): Metaspace ("▁" for a space, prepended to the first word only), BPE with byte
  fallback (<0x00>..<0xFF>), `<s>` added in front of every encoding, `<unk>`, `</s>`, the
  Llama-2 `[INST]` chat template.
- `sentencepiece_unigram_style`: the same with a Unigram model (the T5 / ALBERT / XLNet kind).
- `llama2_legacy_style`: the same with the normalizer of meta-llama/Llama-2-*-hf's
  tokenizer.json (Prepend "▁" + Replace): " Paris" on its own is "▁", "▁Paris".
- `gemma_style`: spaces become "▁" with no prefix at all, `<bos>`, Gemma's turn template.
- `llama3_style`: byte-level BPE with Llama-3's split regex, `<|begin_of_text|>` added by a
  TemplateProcessing post-processor, `<|end_of_text|>`, the Llama-3 chat special tokens
  and the Llama-3 header chat template.

Each folder holds tokenizer.json, tokenizer_config.json (tokenizer_class
PreTrainedTokenizerFast, special tokens, chat_template but for GPT-2),
special_tokens_map.json and a tiny random-weight Llama (2 blocks, hidden 64, 4 heads, 2 KV
heads, intermediate 96, untied head, vocab_size = the tokenizer's full size with its added
tokens, bos/eos ids of the tokenizer, torch.manual_seed(0)) saved as safetensors:
`AutoTokenizer.from_pretrained(folder)` and `AutoModelForCausalLM.from_pretrained(folder)`
load it. The tokenizers are trained here on the few dozen lines of CORPUS, offline, in tens
of milliseconds; every build writes the same bytes.

`build_all(path)` makes every style under `path` and returns {name: folder}.

What transformers 5 does with these files (see tests/test_tokenizer_fixtures.py):
- With a tokenizer.json present, tokenizer_config.json's add_bos_token / add_eos_token are
  dropped on loading: tokenizer.json's post-processor alone decides whether a BOS is added,
  and `tok.add_bos_token` then reads False even where every encoding starts with BOS. Read
  BOS-ness from an encoding, never from that attribute. (Setting `tok.add_bos_token = ...`
  does replace the post-processor with transformers' own TemplateProcessing.)
- tokenizer_class matters: LlamaTokenizer / GemmaTokenizer build their own pipeline from the
  vocabulary (LlamaTokenizer on a Unigram tokenizer.json gives single characters;
  GemmaTokenizer drops the "▁" prefix). PreTrainedTokenizerFast (an alias of
  TokenizersBackend) takes tokenizer.json as it is, so every folder here names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS = """\
The capital of France is Paris.
The capital of Germany is Berlin.
The capital of Italy is Rome.
The capital of Spain is Madrid.
The capital of Japan is Tokyo.
The capital of England is London.
Paris is the capital of France, and Berlin is the capital of Germany.
France is a country in Europe, and its capital is Paris.
People in France speak French; people in Germany speak German.
What is the capital of France? The capital of France is Paris.
The cat sat on the mat.
The cat is on the mat, and the dog is on the rug.
A cat and a dog sat on the mat together.
The black cat sat on the red mat by the door.
I love my cat, and my cat loves me.
I love you, and you love me.
I hate the rain, but I love the sun.
Love and hate are two sides of the same coin.
She loves cats; he hates dogs.
I think that you are right.
I think that you are kind.
I think that you are wrong about the cat.
I think that you are a good friend.
You are what you think you are.
We think that they are happy in Paris.
The quick brown fox jumps over the lazy dog.
It was the best of times, it was the worst of times.
There are 12 months in a year and 7 days in a week.
In 1999 the cat was 3 years old; in 2024 it is 28.
Hello, world! How are you today?
The answer is 42.
"Yes," she said, "the capital of Italy is Rome."
He said: I don't know where the mat is.
They're here, we've seen them, and it's fine.
What is the capital of Germany? It is Berlin.
User: What is the capital of France?
Assistant: The capital of France is Paris.
[INST] What is the capital of France? [/INST] Paris.
A system message tells the assistant what to do.
Thank you for asking about the capitals of countries.
"""

# Llama-3's pre-tokenizer split (contractions, letters, 1-3 digits, punctuation, spaces).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# meta-llama/Llama-2-7b-chat-hf's template (bos_token in the text: tokenize it without
# adding special tokens, which apply_chat_template does).
LLAMA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

# meta-llama/Meta-Llama-3-8B-Instruct's template.
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

# google/gemma-2-2b-it's template.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]

SP_SPECIALS = ["<unk>", "<s>", "</s>"]
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]

TINY_LLAMA = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=96, max_position_embeddings=256,
                  tie_word_embeddings=False)


def _lines() -> list[str]:
    return CORPUS.splitlines()


# -- tokenizers ---------------------------------------------------------------------------------


def _byte_level_bpe(pre_tokenizer: Any, vocab_size: int) -> Any:
    """A byte-level BPE trained on CORPUS with `pre_tokenizer`; no special tokens yet."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_lines(), trainer=trainer)
    return tok


def gpt2_tokenizer() -> Any:
    """GPT-2's pipeline: ByteLevel pre-tokenizer, post-processor (trim_offsets False, as in
    gpt2's tokenizer.json) and decoder; <|endoftext|> last in the vocabulary, added to nothing."""
    from tokenizers import AddedToken, pre_tokenizers, processors

    tok = _byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), 400)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return tok


def llama3_tokenizer() -> Any:
    """Llama-3's pipeline: regex Split then ByteLevel (no regex of its own); specials after
    the BPE vocabulary; post-processor ByteLevel + TemplateProcessing adding
    <|begin_of_text|>."""
    from tokenizers import AddedToken, Regex, pre_tokenizers, processors

    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = _byte_level_bpe(pre, 400)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in LLAMA3_SPECIALS])
    bos = "<|begin_of_text|>"
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                      special_tokens=[(bos, bos_id)])])
    return tok


# How the SentencePiece-family pipelines treat spaces, as their tokenizer.json files do:
# "metaspace": Metaspace pre-tokenizer, "▁" prepended to the first piece only
#     (prepend_scheme "first", split False): Llama-2 as transformers converts it today
#     (legacy=False), Mistral, TinyLlama.
# "legacy": no pre-tokenizer; normalizer Prepend("▁") + Replace(" ", "▁"): the tokenizer.json
#     in meta-llama/Llama-2-*-hf. A leading space becomes "▁▁" (" Paris" -> "▁", "▁Paris").
# "gemma": no pre-tokenizer, normalizer Replace(" ", "▁") and no prefix at all (Gemma 1-3):
#     the first word has no "▁" ("The" -> "The", not "▁The").
SP_SCHEMES = ("metaspace", "legacy", "gemma")


def _sp_pipeline(tok: Any, scheme: str, bos: str, bos_id: int) -> Any:
    from tokenizers import decoders, normalizers, pre_tokenizers, processors

    if scheme == "metaspace":
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                     split=False)
    elif scheme == "legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                               normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = None
    elif scheme == "gemma":
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = None
    else:
        raise ValueError(f"scheme {scheme!r}: one of {SP_SCHEMES}")
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if scheme != "gemma":  # the prefix "▁" of the first word is dropped again when decoding
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
        special_tokens=[(bos, bos_id)])
    return tok


def _sp_training_tok(model: Any) -> Any:
    from tokenizers import Tokenizer, pre_tokenizers

    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                 split=True)
    return tok


def sentencepiece_tokenizer(kind: str = "bpe", scheme: str = "metaspace",
                            specials: tuple[str, ...] = tuple(SP_SPECIALS), bos: str = "<s>",
                            unk: str = "<unk>") -> Any:
    """A SentencePiece-style tokenizer laid out as Llama-2's: the special tokens first
    (<unk> 0, <s> 1, </s> 2), the 256 byte pieces <0x00>..<0xFF> next, then the trained
    pieces; byte fallback on (a character outside the vocabulary becomes its UTF-8 bytes);
    `bos` added in front of every encoding by a TemplateProcessing post-processor.
    kind "bpe" (Llama-2, Mistral, Gemma) or "unigram" (T5, ALBERT, XLNet, mBART)."""
    from tokenizers import AddedToken, Tokenizer, trainers
    from tokenizers.models import BPE, Unigram

    head = list(specials) + BYTE_TOKENS
    if kind == "bpe":
        trainer_tok = _sp_training_tok(BPE(unk_token=unk))
        trainer_tok.train_from_iterator(_lines(), trainer=trainers.BpeTrainer(
            vocab_size=400, min_frequency=2, show_progress=False))
        model = json.loads(trainer_tok.to_str())["model"]
        pieces = sorted(model["vocab"], key=model["vocab"].get)
        vocab = {t: i for i, t in enumerate(head + [p for p in pieces if p not in head])}
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                  for m in model["merges"]]
        tok = Tokenizer(BPE(vocab, merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
    elif kind == "unigram":
        trainer_tok = _sp_training_tok(Unigram())
        trainer_tok.train_from_iterator(_lines(), trainer=trainers.UnigramTrainer(
            vocab_size=300, special_tokens=list(specials), unk_token=unk,
            show_progress=False))
        # The trainer iterates hash maps: its sums differ in the last bits from run to run,
        # and the characters it must keep (rare ones, "H", "[", "1") are appended below the
        # lowest score in steps of 1e-4 in a random order. Those characters all get the
        # lowest score, the rest are rounded, and the pieces sorted: every build writes the
        # same file (the set of pieces is the same each time).
        trained = [(p, s) for p, s in json.loads(trainer_tok.to_str())["model"]["vocab"]
                   if p not in head]
        low = round(min(s for _, s in trained), 2)
        trained = sorted(((p, low if len(p) == 1 and s < low + 0.01 else round(s, 6))
                          for p, s in trained), key=lambda ps: (-ps[1], ps[0]))
        vocab = [(t, 0.0) for t in head] + trained
        tok = Tokenizer(Unigram(vocab, unk_id=head.index(unk), byte_fallback=True))
    else:
        raise ValueError(f"kind {kind!r}: 'bpe' or 'unigram'")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return _sp_pipeline(tok, scheme, bos, head.index(bos))


# -- folders ------------------------------------------------------------------------------------


def _tiny_llama(folder: Path, vocab_size: int, bos_id: int | None, eos_id: int | None) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, bos_token_id=bos_id,
                                         eos_token_id=eos_id, **TINY_LLAMA))
    model.save_pretrained(folder)  # safetensors


def _write(folder: Path, tok: Any, config: dict, special_map: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n",
                                                  encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n",
                                                    encoding="utf-8")
    bos, eos = config.get("bos_token"), config.get("eos_token")
    _tiny_llama(folder, tok.get_vocab_size(with_added_tokens=True),
                tok.token_to_id(bos) if bos else None, tok.token_to_id(eos) if eos else None)
    return folder


def gpt2_style(path: str | Path) -> Path:
    """Byte-level BPE, no BOS added, no chat template (GPT-2's own repo has no
    tokenizer_class either; PreTrainedTokenizerFast reads tokenizer.json as is)."""
    eot = "<|endoftext|>"
    return _write(Path(path), gpt2_tokenizer(), {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eot, "eos_token": eot,
        "unk_token": eot, "model_max_length": 256, "clean_up_tokenization_spaces": False,
    }, {"bos_token": eot, "eos_token": eot, "unk_token": eot})


def _sentencepiece_folder(path: str | Path, tok: Any, template: str = LLAMA2_CHAT_TEMPLATE,
                          bos: str = "<s>", eos: str = "</s>", unk: str = "<unk>",
                          pad: str | None = None) -> Path:
    names = {"bos_token": bos, "eos_token": eos, "unk_token": unk}
    if pad:
        names["pad_token"] = pad
    # add_bos_token / add_eos_token as the Llama-2 and Gemma repos carry them; transformers 5
    # drops both keys when a tokenizer.json is there (tokenizer.json's post-processor decides).
    return _write(Path(path), tok, {
        "tokenizer_class": "PreTrainedTokenizerFast", **names,
        "add_bos_token": True, "add_eos_token": False, "model_max_length": 256,
        "clean_up_tokenization_spaces": False, "legacy": False, "chat_template": template,
    }, names)


def sentencepiece_style(path: str | Path) -> Path:
    """Llama-2 as converted today: Metaspace + BPE with byte fallback, <s> in front,
    the Llama-2 [INST] template."""
    return _sentencepiece_folder(path, sentencepiece_tokenizer("bpe", "metaspace"))


def sentencepiece_unigram_style(path: str | Path) -> Path:
    """As sentencepiece_style with a Unigram model."""
    return _sentencepiece_folder(path, sentencepiece_tokenizer("unigram", "metaspace"))


def llama2_legacy_style(path: str | Path) -> Path:
    """As sentencepiece_style with the normalizer of meta-llama/Llama-2-*-hf's tokenizer.json
    (Prepend + Replace, no pre-tokenizer): " Paris" alone -> "▁", "▁Paris"."""
    return _sentencepiece_folder(path, sentencepiece_tokenizer("bpe", "legacy"))


def gemma_style(path: str | Path) -> Path:
    """Gemma: spaces -> "▁" with no prefix, BPE with byte fallback, <bos> in front, Gemma's
    ids (<pad> 0, <eos> 1, <bos> 2, <unk> 3) and turn tokens, Gemma's chat template."""
    tok = sentencepiece_tokenizer("bpe", "gemma", tuple(GEMMA_SPECIALS), bos="<bos>")
    return _sentencepiece_folder(path, tok, GEMMA_CHAT_TEMPLATE, bos="<bos>", eos="<eos>",
                                 pad="<pad>")


def llama3_style(path: str | Path) -> Path:
    """Llama-3: byte-level BPE, <|begin_of_text|> from the post-processor, header template;
    no add_bos_token key, as in Meta's repos."""
    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    return _write(Path(path), llama3_tokenizer(), {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
        "model_max_length": 256, "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"],
        "chat_template": LLAMA3_CHAT_TEMPLATE,
    }, {"bos_token": bos, "eos_token": eos})


BUILDERS = {
    "gpt2": gpt2_style,
    "sentencepiece": sentencepiece_style,
    "sentencepiece-unigram": sentencepiece_unigram_style,
    "llama2-legacy": llama2_legacy_style,
    "gemma": gemma_style,
    "llama3": llama3_style,
}


def build_all(path: str | Path) -> dict[str, Path]:
    """Every style in its own folder under `path`: {name: folder}."""
    return {name: build(Path(path) / f"tok-{name}") for name, build in BUILDERS.items()}
