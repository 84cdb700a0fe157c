"""Token ids in and out (issue 46): `fptrace tokens` against the tokenizers' own
convert_ids_to_tokens and decode, `--ids` / `--ids-file` on every command that takes a prompt
(the ids of a text trace as the text does), records with "ids" for batch and stats, and the
bad inputs: one line each, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tokenizer_fixtures
from conftest import tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.notes import BOS_GIVEN, IDS_RETOKENIZED

runner = CliRunner()
PROMPT = "The cat sat on the mat"
# GPT-2 BPE, SentencePiece (Llama-2 style, adds <s>), Gemma style (adds <bos>)
STYLES = ("gpt2", "sentencepiece", "gemma")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return {s: str(tokenizer_fixtures.BUILDERS[s](root / s)) for s in STYLES}


def _json(args, code=0):
    r = runner.invoke(app, args)
    assert r.exit_code == code, r.output
    return json.loads(r.stdout) if code == 0 else r


def _ids(text: str, model: str) -> list[int]:
    return [t["id"] for t in _json(["tokens", text, "-m", model, "--json"])["tokens"]]


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """A cache of its own: the first `tokens` call reads the tokenizer through transformers and
    keeps it, the second reads what was kept (models/tokenizer_cache.py)."""
    monkeypatch.setenv("FPTRACE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("call", ["read", "kept"])
@pytest.mark.parametrize("style", STYLES)
def test_tokens_of_ids_are_the_tokenizers_own(style, call, folders, kept):
    from transformers import AutoTokenizer

    folder = folders[style]
    hf = AutoTokenizer.from_pretrained(folder)
    ids = hf("The capital of France is Paris. The cat sat.")["input_ids"]
    ids = [*ids, hf.eos_token_id]  # an end-of-text id too
    args = ["tokens", "--ids", ",".join(map(str, ids)), "-m", folder, "--json"]
    if call == "kept":
        _json(args)
        assert len(list((kept / "tokenizers").iterdir())) == 1
    doc = _json(args)
    assert doc["kind"] == "tokens" and doc["from_ids"] and doc["text"] is None
    assert [t["id"] for t in doc["tokens"]] == ids
    assert [t["piece"] for t in doc["tokens"]] == hf.convert_ids_to_tokens(ids)
    assert [t["text"] for t in doc["tokens"]] == [hf.decode([i]) for i in ids]
    assert doc["decoded"] == hf.decode(ids)
    specials = set(hf.all_special_ids)
    assert [t["special"] for t in doc["tokens"]] == [i in specials for i in ids]
    assert doc["tokens"][-1]["special"]
    if hf.bos_token_id is not None and ids[0] == hf.bos_token_id:
        assert doc["tokens"][0]["special"]
        assert any(BOS_GIVEN.matches(n) for n in doc["notes"]), doc["notes"]


@pytest.mark.parametrize("call", ["read", "kept"])
@pytest.mark.parametrize("style", STYLES)
def test_tokens_of_a_text(style, call, folders, kept):
    from transformers import AutoTokenizer

    folder = folders[style]
    hf = AutoTokenizer.from_pretrained(folder)
    text = "The cat sat on the mat, café"
    if call == "kept":
        _json(["tokens", "The", "-m", folder, "--json"])
    doc = _json(["tokens", text, "-m", folder, "--json"])
    got = hf(text, return_offsets_mapping=True)
    assert [t["id"] for t in doc["tokens"]] == got["input_ids"]
    assert [t["piece"] for t in doc["tokens"]] == hf.convert_ids_to_tokens(got["input_ids"])
    raw = text.encode("utf-8")
    for t, (a, b) in zip(doc["tokens"], got["offset_mapping"], strict=True):  # chars: bytes
        assert (t["start"], t["end"]) == (len(text[:a].encode()), len(text[:b].encode()))
    assert raw[doc["tokens"][-1]["start"]:doc["tokens"][-1]["end"]].decode().endswith("é")
    bos = hf.bos_token_id
    added = bos is not None and got["input_ids"][0] == bos
    said = " ".join(doc["notes"])
    assert ("added by the tokenizer" in said) == added, said


def test_tokens_gpt2_walkthrough_ids_config_only():
    """GPT-2 is a config-only model: its offline BPE answers, no weights, no network; the ids
    the GPT-2 walkthrough reads by number are what GPT-2's tokenizer says they are."""
    doc = _json(["tokens", "--ids", "0,319,866,50256", "-m", "gpt2", "--json"])
    assert [t["text"] for t in doc["tokens"]] == ["!", " on", " down", "<|endoftext|>"]
    assert [t["special"] for t in doc["tokens"]] == [False, False, False, True]
    assert doc["vocab_size"] == 50257 and doc["retokenized"] is None
    assert _ids("The cat sat", "gpt2") == [464, 3797, 3332]


@pytest.mark.system
def test_a_kept_tokenizer_answers_without_transformers(folders, kept):
    """The second call reads the kept pipeline with `tokenizers` alone (no transformers, no
    torch) and answers what the first did; a changed tokenizer file is read again."""
    folder = folders["gemma"]
    code = ("import sys, json; from fptrace.cli.main import main; "
            f"sys.argv = ['fptrace', 'tokens', 'The cat sat, café', '-m', {folder!r}, '--json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('LOADED', 'transformers' in sys.modules or 'torch' in sys.modules, "
            "file=sys.stderr)")
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1", "FPTRACE_SERVER": "off"}

    def call():
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        doc.pop("seconds")
        return doc, "LOADED True" in r.stderr

    first, loaded = call()
    assert loaded
    second, loaded = call()
    assert not loaded and second == first
    assert first["tokens"][0]["piece"] == "<bos>" and first["tokens"][0]["special"]
    config = Path(folder) / "tokenizer_config.json"
    config.write_text(config.read_text())  # the same bytes, a new time: read again
    third, loaded = call()
    assert loaded and third == first
    assert len(list((kept / "tokenizers").iterdir())) == 2


@pytest.mark.system
def test_tokens_loads_no_weights_and_no_torch():
    code = ("import sys, time; t = time.perf_counter(); from fptrace.cli.main import main; "
            "sys.argv = ['fptrace', 'tokens', 'The cat sat', '-m', 'gpt2', '--json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('TORCH', 'torch' in sys.modules, file=sys.stderr)")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr
    assert "TORCH False" in r.stderr, r.stderr
    assert json.loads(r.stdout)["tokens"][0]["id"] == 464
    assert seconds < 30  # a shared CI machine; no model is built or read


def test_retokenized_ids_are_traced_as_given_and_said():
    """Ids whose text tokenizes to other ids (' c' + 'at' spells ' cat', one token): traced as
    given, with the note in the JSON and on stderr; the ids of a text carry no such note."""
    model = tiny_gpt2()
    split = _ids(" c", "gpt2") + _ids("at", "gpt2")
    r = runner.invoke(app, ["run", "--ids", ",".join(map(str, split)), "-m", model,
                            "--random-weights", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [t["id"] for t in doc["tokens"]] == split
    assert any(IDS_RETOKENIZED.matches(n) for n in doc["notes"]), doc["notes"]
    assert "tokenizes to other ids" in r.stderr
    tok = _json(["tokens", "--ids", ",".join(map(str, split)), "-m", "gpt2", "--json"])
    assert tok["retokenized"] == _ids(" cat", "gpt2")
    whole = _ids(PROMPT, "gpt2")
    r = runner.invoke(app, ["run", "--ids", ",".join(map(str, whole)), "-m", model,
                            "--random-weights", "--json"])
    assert not any(IDS_RETOKENIZED.matches(n) for n in json.loads(r.stdout)["notes"])
    assert "tokenizes to other ids" not in r.stderr


@pytest.mark.parametrize("model,special,text_ids", [
    ("llama-3.2-1b", "<|reserved_special_token_100|>", [128000, 13347, 128105, 1070]),
    ("qwen2.5-0.5b", "<|im_start|>", [13048, 151644, 1052]),
])
def test_offline_encodings_read_a_special_token_whole(model, special, text_ids):
    """A special token spelled in a prompt is its one id, as the models' tokenizer.json reads
    it (Llama 3: 128105, Qwen: 151644); quicktok's tiktoken default raised a ValueError, which
    `run` showed as an internal error, and so did ids holding a special token (their text is
    tokenized again for the retokenized note). Those ids read back as themselves: no note."""
    doc = _json(["tokens", f"Hi{special} there", "-m", model, "--json"])
    assert [t["id"] for t in doc["tokens"]] == text_ids
    assert doc["tokens"][-2]["special"] and doc["tokens"][-2]["text"] == special
    doc = _json(["tokens", "--ids", ",".join(map(str, text_ids)), "-m", model, "--json"])
    assert doc.get("retokenized") is None


def _same(a, b, path=""):
    """JSON equal but for timings (a text's tokenizer time is none for ids)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = {k for k in a.keys() | b.keys() if "seconds" not in k and "per_s" not in k}
        return [d for k in sorted(keys) for d in _same(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for x, y in zip(a, b, strict=True) for d in _same(x, y, path)]
    return [] if a == b else [path]


COMMANDS = {
    "run": [],
    "explain": ["--layer", "0"],
    "attribute": [],
    "patch": ["--noise", " cat"],
    "steer": ["--token", " mat", "-l", "0", "--scale", "0,1", "-n", "2"],
    "ablate": ["--head", "1.0"],
    "generate": ["-n", "2"],
    "diff": ["--dtype-b", "bfloat16"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_ids_of_a_text_trace_as_the_text(command, tmp_path):
    model = tiny_gpt2()
    ids = ",".join(map(str, _ids(PROMPT, "gpt2")))
    common = ["-m", model, "--random-weights", *COMMANDS[command], "--json"]
    text = runner.invoke(app, [command, PROMPT, *common])
    given = runner.invoke(app, [command, "--ids", ids, *common])
    assert text.exit_code == 0, text.output
    assert given.exit_code == 0, given.output
    assert _same(json.loads(text.stdout), json.loads(given.stdout)) == []
    (tmp_path / "ids.json").write_text(f"[{ids}]")
    (tmp_path / "ids.txt").write_text(ids.replace(",", "\n") + "\n")
    for f in ("ids.json", "ids.txt"):
        r = runner.invoke(app, [command, "--ids-file", str(tmp_path / f), *common])
        assert r.exit_code == 0, r.output
        assert _same(json.loads(text.stdout), json.loads(r.stdout)) == []


def test_features_and_report_take_ids(tmp_path):
    from fptrace.commands.features.examples import write_seeded

    model = tiny_gpt2()
    ids = ",".join(map(str, _ids(PROMPT, "gpt2")))
    sae = write_seeded(str(tmp_path / "s"), 32, 64)
    common = ["-m", model, "--random-weights", "--sae", sae, "--json"]
    text = runner.invoke(app, ["features", PROMPT, *common])
    given = runner.invoke(app, ["features", "--ids", ids, *common])
    assert text.exit_code == 0 and given.exit_code == 0, given.output
    assert _same(json.loads(text.stdout), json.loads(given.stdout)) == []
    page = tmp_path / "r.html"
    r = runner.invoke(app, ["report", "--ids", ids, "-m", model, "--random-weights", "-o",
                            str(page)])
    assert r.exit_code == 0, r.output
    assert page.exists()


def test_run_ids_on_the_bundled_model(smollm_cli):
    """The check of the issue on the bundled model: run --ids on the ids of a text equals
    run TEXT, JSON equal but for the tokenizer's time."""
    ids = ",".join(map(str, _ids("The capital of France is", "smollm2-135m")))
    a = smollm_cli(["run", "The capital of France is", "--json"])
    b = smollm_cli(["run", "--ids", ids, "--json"])
    assert _same(a, b) == []


@pytest.mark.parametrize("style", STYLES)
def test_runs_token_table_shows_each_ids_piece(style, folders):
    """run --ids: each token's piece is the tokenizer's own convert_ids_to_tokens, in the JSON
    and in the token table's piece column, beside its text."""
    from transformers import AutoTokenizer

    folder = folders[style]
    hf = AutoTokenizer.from_pretrained(folder)
    ids = hf(" Paris, café")["input_ids"]
    given = ["--ids", ",".join(map(str, ids)), "-m", folder]
    doc = _json(["run", *given, "--json"])
    assert [t["piece"] for t in doc["tokens"]] == hf.convert_ids_to_tokens(ids)
    r = runner.invoke(app, ["run", *given])
    assert r.exit_code == 0, r.output
    lines = [line.translate({ord(c): " " for c in "┃│"}).split()
             for line in r.stdout.splitlines()]
    at = lines.index(["pos", "id", "piece", "text"])
    for t, row in zip(doc["tokens"], lines[at + 2:], strict=False):
        assert row[:3] == [str(t["position"]), str(t["id"]), t["piece"]], row


@pytest.fixture(scope="module")
def smollm_cli(smollm):
    """A command on the bundled model, in this process (a subprocess each paid torch's and
    transformers' imports again)."""
    def call(args):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output[-2000:]
        return json.loads(r.stdout)
    return call


def test_batch_and_stats_take_records_with_ids(tmp_path):
    model = tiny_gpt2()
    ids = _ids(PROMPT, "gpt2")
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "text", "prompt": PROMPT}) + "\n"
                   + json.dumps({"id": "ids", "ids": ids}) + "\n"
                   + json.dumps({"id": "bad", "ids": [1, -2]}) + "\n"
                   + json.dumps({"id": "both", "ids": [1], "prompt": "x"}) + "\n")
    out = tmp_path / "out.jsonl"
    r = runner.invoke(app, ["batch", str(src), "-m", model, "--random-weights", "--out",
                            str(out)])
    recs = {json.loads(line)["id"]: json.loads(line) for line in out.read_text().splitlines()}
    assert set(recs) == {"text", "ids", "in:3", "in:4"}, r.output  # a bad line: file:line
    a, b = recs["text"], recs["ids"]
    assert _same({k: v for k, v in a.items() if k not in ("id", "source", "extra")},
                 {k: v for k, v in b.items() if k not in ("id", "source", "extra")}) == []
    assert "id 2 is -2" in recs["in:3"]["error"]
    assert '"ids" list' in recs["in:4"]["error"]
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"id": "one:1", "ids": ids}) + "\n")  # the .txt line's id
    txt = tmp_path / "one.txt"
    txt.write_text(PROMPT + "\n")
    s1, s2 = tmp_path / "s1.json", tmp_path / "s2.json"
    for f, o in ((one, s1), (txt, s2)):
        r = runner.invoke(app, ["stats", str(f), "-m", model, "--random-weights", "--out",
                                str(o)])
        assert r.exit_code == 0, r.output
    d1, d2 = json.loads(s1.read_text()), json.loads(s2.read_text())
    for key in ("statistics", "top_channels", "tokens", "massive", "sink_heads"):
        assert _same(d1[key], d2[key]) == [], key


@pytest.mark.parametrize("args, message", [
    (["tokens", "--ids", "5,50257", "-m", "gpt2"], "token id 50257 (position 1) is outside"),
    (["run", "--ids", "5,50257", "-m", "TINY", "--random-weights"], "is outside the vocab"),
    (["tokens", "--ids", "5,-1", "-m", "gpt2"], "token id -1: must be at least 0"),
    (["run", "--ids", "5,-1", "-m", "TINY"], "token id -1: must be at least 0"),
    (["tokens", "--ids", "\u0663", "-m", "gpt2"], "not a whole number (ASCII digits 0-9)"),
    (["tokens", "--ids", "", "-m", "gpt2"], "no token ids"),
    (["run", "--ids", " , ", "-m", "TINY"], "no token ids"),
    (["run", "--ids-file", "MILLION", "-m", "TINY", "--random-weights"],
     "the prompt is 1000000 tokens but"),
    (["tokens", "--ids-file", "MILLION", "-m", "gpt2"], "are more than gpt2 reads"),
    (["run", "The cat", "--ids", "5,6", "-m", "TINY"], "give PROMPT or --ids, not both"),
    (["tokens", "The cat", "--ids", "5,6", "-m", "gpt2"], "give PROMPT or --ids, not both"),
    (["generate", "--ids", "5,6", "--chat", "-m", "TINY"], "without --chat"),
    (["run", "--ids", "5", "--ids-file", "MILLION", "-m", "TINY"], "not both"),
    (["tokens", "--ids-file", "NOFILE", "-m", "gpt2"], "no such file"),
    (["tokens", "--ids-file", "OBJ", "-m", "gpt2"], "expected a JSON list of token ids"),
    (["tokens", "-m", "gpt2"], "give a PROMPT"),
    (["tui", "--ids", "5,6", "-m", "TINY"], "fptrace run --ids"),
])
def test_bad_ids_are_one_line_exit_2(args, message, tmp_path):
    million = tmp_path / "million.txt"
    million.write_text("11\n" * 1_000_000)
    obj = tmp_path / "obj.json"
    obj.write_text('{"ids": [1]}')
    names = {"TINY": tiny_gpt2(), "MILLION": str(million), "NOFILE": str(tmp_path / "no"),
             "OBJ": str(obj)}
    t0 = time.perf_counter()
    r = runner.invoke(app, [names.get(a, a) for a in args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 or all(not line.startswith("fptrace: error") for line in lines[:-1])
    assert lines[-1].startswith("fptrace: error: ") and "Traceback" not in r.output
    assert time.perf_counter() - t0 < 60


def test_parse_ids_forms():
    from fptrace.errors import BadInput
    from fptrace.models.prompts import check_ids, parse_ids

    assert parse_ids("504,3575,282") == parse_ids("[504, 3575, 282]") == \
        parse_ids("504\n3575\n282\n") == (504, 3575, 282)
    for bad in ("1.5", "1e3", "\u00b2", "0x10", "[1,[2]]"):
        with pytest.raises(BadInput):
            parse_ids(bad)
    for bad in ([], [True], [1.0], ["1"], {"a": 1}):
        with pytest.raises(BadInput):
            check_ids(bad, "x")


def _llamacpp_installed() -> bool:
    from fptrace.engines.llamacpp import binding as B

    return B.installed_version() is not None


@pytest.mark.slow
@pytest.mark.skipif(not _llamacpp_installed(), reason="the [llamacpp] extra is not installed")
def test_llamacpp_runs_the_ids_given(smollm_cli):
    """run --engine llama.cpp and diff --engine-b llama.cpp with --ids: llama.cpp runs exactly
    the ids given (its own tokenizer is not asked), and the ids of a text give the text's
    trace; ids that llama.cpp's tokenizer would split otherwise are still traced as given."""
    text = "The capital of France is"
    ids = _ids(text, "smollm2-135m")
    a = smollm_cli(["run", text, "--engine", "llama.cpp", "--json"])
    b = smollm_cli(["run", "--ids", ",".join(map(str, ids)), "--engine", "llama.cpp",
                    "--json"])
    assert _same(a, b) == []
    split = _ids(" c", "smollm2-135m") + _ids("at", "smollm2-135m")
    c = smollm_cli(["run", "--ids", ",".join(map(str, split)), "--engine", "llama.cpp",
                    "--json"])
    assert [t["id"] for t in c["tokens"]] == split
    r = runner.invoke(app, ["diff", "--engine-b", "llama.cpp", "--ids", ",".join(map(str, split)),
                            "--json"])
    assert r.exit_code in (0, 1), r.output[-2000:]  # 1: beyond the tolerance, as with a text
    d = json.loads(r.stdout)
    assert [t[0] for t in d["a"]["tokens"]] == [t[0] for t in d["b"]["tokens"]] == split
