"""Prompts as real models take them: every tokenizer kind a real model ships (byte-level BPE
without a begin-of-text token, SentencePiece with `<s>` and the leading "▁" in its BPE,
Unigram, legacy and Gemma flavours, Llama-3's byte-level BPE with `<|begin_of_text|>`), each
paired with a tiny model; every command that takes a piece of text beside the prompt finds
the right tokens (asserted against the tokenizer's own offsets, computed here), and chat
templates are applied as transformers applies them."""

from __future__ import annotations

import json

import pytest
import tokenizer_fixtures
import torch
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.errors import BadInput
from fptrace.models.loading import load_model
from fptrace.models.prompts import Chat

PROMPT = "The capital of France is"
STYLES = list(tokenizer_fixtures.BUILDERS)
runner = CliRunner()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tokenizer_fixtures.build_all(tmp_path_factory.mktemp("tokenizers"))


@pytest.fixture(scope="module", params=STYLES)
def style(request, folders):
    from transformers import AutoTokenizer

    folder = folders[request.param]
    return request.param, folder, load_model(str(folder), device="cpu"), \
        AutoTokenizer.from_pretrained(folder)


def overlap_positions(tok, text, start, end):
    """The tokens of text whose offsets overlap [start, end): computed from the tokenizer
    here, independently of fptrace."""
    offsets = tok(text, return_offsets_mapping=True)["offset_mapping"]
    return [k for k, (a, b) in enumerate(offsets) if a < end and b > start]


def test_the_prompt_is_tokenized_as_the_tokenizer_does(style):
    name, _, lm, tok = style
    assert lm.encode(PROMPT) == tok(PROMPT)["input_ids"]
    starts_with_bos = tok(PROMPT)["input_ids"][0] == tok.bos_token_id
    assert starts_with_bos == (name != "gpt2")


@pytest.mark.parametrize("subject,occurrence", [(" France", None), ("France", None),
                                                 ("ance", None), ("The", None),
                                                 ("capital of", None)])
def test_subject_positions_follow_the_offsets(style, subject, occurrence):
    """A subject is the tokens whose characters overlap it: with or without its space, half a
    word, at position 0 (after a begin-of-text token), two words."""
    from fptrace.core.fragments import subject_positions

    _, _, lm, tok = style
    start = PROMPT.index(subject)
    want = overlap_positions(tok, PROMPT, start, start + len(subject))
    assert want, "the test's subject must cover a token"
    assert subject_positions(lm, PROMPT, subject, occurrence) == want


def test_a_subject_twice_asks_which(style):
    from fptrace.core.fragments import subject_positions

    _, _, lm, tok = style
    prompt = "The cat sat on the mat and the cat slept"
    with pytest.raises(BadInput, match=r"' cat' occurs 2 times.*--noise-occurrence N"):
        subject_positions(lm, prompt, " cat")
    second = prompt.index(" cat", prompt.index(" cat") + 1)
    assert subject_positions(lm, prompt, " cat", 2) == \
        overlap_positions(tok, prompt, second, second + 4)
    with pytest.raises(BadInput, match="occurs 2 times"):
        subject_positions(lm, prompt, " cat", 3)
    with pytest.raises(BadInput, match="not in the prompt"):
        subject_positions(lm, prompt, " dog")


@pytest.mark.parametrize("target", [" Paris", "Paris"])
def test_a_target_is_one_token_as_the_tokenizer_writes_it(style, target):
    """No begin-of-text token in a target; where the text alone is two tokens (Llama-2's
    legacy ' Paris' = '▁' + '▁Paris'), the token it gets right after the prompt."""
    from fptrace.core.fragments import token_id

    _, _, lm, tok = style
    alone = tok(target, add_special_tokens=False)["input_ids"]
    full = tok(PROMPT + target)["input_ids"]
    prefix = tok(PROMPT)["input_ids"]
    after = full[len(prefix):] if full[:len(prefix)] == prefix else []
    if len(alone) == 1:
        assert token_id(lm, target, "--target", PROMPT) == alone[0]
    elif len(after) == 1:
        assert token_id(lm, target, "--target", PROMPT) == after[0]
    else:  # more than one token either way: refused, with the tokens and the #ID way out
        with pytest.raises(BadInput, match=rf"is {len(alone)} tokens .*#ID"):
            token_id(lm, target, "--target", PROMPT)


def test_attribute_and_patch_take_fragments_on_every_tokenizer(style):
    """The commands, end to end: the attributed target and the noised positions."""
    from fptrace.commands.attribute.core import attribute
    from fptrace.commands.patch.core import patch
    from fptrace.core.fragments import token_id

    _, _, lm, tok = style
    paris = token_id(lm, " Paris", "--target", PROMPT)
    a = attribute(lm, PROMPT, target=" Paris")
    assert a.target.id == paris and a.ok
    start = PROMPT.index(" France")
    r = patch(lm, PROMPT, noise=" France", target=" Paris", batch_size=64)
    assert list(r.subject_positions) == overlap_positions(tok, PROMPT, start, start + 7)
    assert r.target.id == paris


def test_every_command_runs_on_every_tokenizer(style):
    from fptrace.commands.explain.core import explain
    from fptrace.commands.generate.core import generate
    from fptrace.core.trace import run_trace

    _, _, lm, tok = style
    ids = tok(PROMPT)["input_ids"]
    t = run_trace(lm, PROMPT)
    assert [x.id for x in t.tokens] == ids
    with torch.inference_mode():
        logits = lm.model(torch.tensor([ids])).logits[0, -1]
    assert t.top_k[0].id == int(logits.argmax())
    assert explain(lm, PROMPT, layer=1).match
    assert [x.id for x in generate(lm, PROMPT, max_new_tokens=2).tokens] == ids


def test_chat_ids_are_the_templates(style):
    """--chat: the ids apply_chat_template gives (with the assistant's turn opened); the tokens
    the template added are marked, the message's are not (checked against the offsets of the
    message's characters in the rendered text)."""
    name, _, lm, tok = style
    chat = Chat.of("What is the capital of France?")
    if tok.chat_template is None:
        with pytest.raises(BadInput, match="has no chat template"):
            lm.prepare(chat)
        return
    want = tok.apply_chat_template(chat.as_dicts(), add_generation_prompt=True, tokenize=True,
                                   return_dict=True)["input_ids"]
    p = lm.prepare(chat)
    assert list(p.ids) == list(want)
    text = tok.apply_chat_template(chat.as_dicts(), add_generation_prompt=True, tokenize=False)
    start = text.index("What is the capital")
    content = set(overlap_positions_plain(tok, text, start, start + 30))
    assert [k for k, flag in enumerate(p.flags()) if not flag] == sorted(content)
    toks = lm.tokens(p)
    assert sum(t.template for t in toks) == len(toks) - len(content)
    from fptrace.core.fragments import subject_positions

    assert subject_positions(lm, chat, " France") == \
        overlap_positions_plain(tok, text, text.index(" France"), text.index(" France") + 7)


def overlap_positions_plain(tok, text, start, end):
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return [k for k, (a, b) in enumerate(offsets) if a < end and b > start]


def test_a_role_the_template_refuses_says_the_templates_words(folders):
    lm = load_model(str(folders["sentencepiece"]), device="cpu")
    bad = Chat.of("hi")
    bad = Chat(bad.messages + bad.messages)  # user, user: Llama-2's template refuses
    with pytest.raises(BadInput, match="refuses these messages: Conversation roles must "
                                       "alternate"):
        lm.prepare(bad)


@pytest.mark.slow
def test_chat_on_the_bundled_model(smollm):
    """The bundled instruct model's GGUF template: the traced ids are transformers' own, and
    the traced logits are the model's on those ids."""
    from fptrace.core.trace import run_trace

    chat = Chat.of("What is the capital of France?")
    want = smollm.tokenizer.chat_ids(chat.as_dicts())
    t = run_trace(smollm, chat, top_k=3)
    assert [x.id for x in t.tokens] == want
    with torch.inference_mode():
        logits = smollm.model(torch.tensor([want])).logits[0, -1].float()
    probs = torch.softmax(logits, -1)
    assert [x.id for x in t.top_k] == probs.topk(3).indices.tolist()
    assert t.top_k[0].prob == pytest.approx(float(probs.max()), rel=1e-5)
    assert t.tokens[0].template and not t.tokens[24].template  # <|im_start|>, 'What'
    assert "chat template" in t.token_note


def test_cli_chat_options_and_their_mistakes(folders, tmp_path):
    folder = str(folders["llama3"])
    r = runner.invoke(app, ["run", "--chat", "Hello there", "-m", folder, "--json"])
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["tokens"][0]["template"] and not any(
        t["template"] for t in data["tokens"] if t["text"] in ("Hello", " there"))
    good = tmp_path / "chat.json"
    good.write_text(json.dumps([{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hello there"}]))
    r = runner.invoke(app, ["run", "--messages", str(good), "-m", folder, "--json"])
    assert r.exit_code == 0, r.stderr
    r2 = runner.invoke(app, ["run", "Hello there", "--system", "Be brief.", "-m", folder,
                             "--json"])
    assert json.loads(r2.stdout)["tokens"] == json.loads(r.stdout)["tokens"]

    def err(*args):
        res = runner.invoke(app, list(args))
        assert res.exit_code == 2, res.output
        errors = [x for x in res.stderr.strip().splitlines() if x.startswith("fptrace: error: ")]
        assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
        return errors[0]

    assert "without --chat" in err("run", "--chat", "--messages", str(good), "-m", folder)
    assert "not both" in err("run", "hi", "--messages", str(good), "-m", folder)
    assert "give a PROMPT" in err("run", "-m", folder)
    bad = tmp_path / "bad.json"
    bad.write_text('[\n  {"role": "user", "content": "hi"},\n  {"role": "user"}\n]\n')
    assert "line 3 (message 2): no 'content'" in err("run", "--messages", str(bad), "-m", folder)
    bad.write_text('{"role": "user", "content": "hi"}')
    assert "expected a non-empty JSON list" in err("run", "--messages", str(bad), "-m", folder)
    bad.write_text('[{"role": "user", "content": "hi"},]')
    assert "line 1: not JSON" in err("run", "--messages", str(bad), "-m", folder)
    assert "no such file" in err("run", "--messages", str(tmp_path / "nope.json"), "-m", folder)
    assert "has no chat template" in err("run", "--chat", "hi", "-m", str(folders["gpt2"]))
    assert "refuses these messages" in err("run", "--messages", str(good), "-m",
                                           str(folders["gemma"]))  # no system role in Gemma 2


def test_patch_and_attribute_cli_on_a_bos_tokenizer(folders):
    """The failures of issue 23, on a tokenizer that adds <bos>: a target and a subject given
    as text now work."""
    folder = str(folders["gemma"])
    r = runner.invoke(app, ["attribute", PROMPT, "--target", " Paris", "-m", folder, "--json"])
    assert r.exit_code == 0, r.stderr
    r = runner.invoke(app, ["patch", PROMPT, "--noise", " France", "-m", folder, "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["subject_positions"]
    r = runner.invoke(app, ["patch", "the cat and the cat", "--noise", "cat", "-m", folder])
    assert r.exit_code == 2 and "--noise-occurrence" in r.stderr
    r = runner.invoke(app, ["patch", "the cat and the cat", "--noise", "cat",
                            "--noise-occurrence", "2", "-m", folder, "--json"])
    assert r.exit_code == 0, r.stderr


def test_batch_lines_may_hold_messages(folders, tmp_path):
    from fptrace.commands.batch.core import read_inputs

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "Hi"}]})
                   + "\n" + json.dumps({"id": "b", "prompt": "Hi", "messages": []}) + "\n"
                   + json.dumps({"id": "c", "messages": [{"content": "Hi"}]}) + "\n")
    items = read_inputs([str(src)])
    assert isinstance(items[0].prompt, Chat) and items[0].error is None
    assert "a \"prompt\" string or a \"messages\" list" in items[1].error
    assert "no 'role'" in items[2].error
    out = tmp_path / "out.jsonl"
    r = runner.invoke(app, ["batch", str(src), "--out", str(out), "-m",
                            str(folders["llama3"])])
    assert r.exit_code == 1  # two input errors
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["kind"] == "trace" and lines[0]["tokens"][0]["template"]
    assert lines[0]["extra"]["messages"][0]["content"] == "Hi"
    assert [x["kind"] for x in lines[1:]] == ["error", "error"]
