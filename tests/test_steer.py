"""fptrace steer: scale 0 is the clean run bit for bit; a steered run equals a plain forward hook
written here that adds the same vector to the same block's output; the vector sits on top of
what the modules the family names actually added (post-norm families included); the batched
sweep equals one run per strength; a saved control vector reads back through the `gguf` library
and reproduces the run; every vector source is what it says; bad input is refused with what to
change."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.steer.core import steer
from fptrace.commands.steer.vectors import SteeringVector, pairs_vector, read_vector, token_vector
from fptrace.core.interventions import run_rows, steering_hooks
from fptrace.errors import BadInput

IDS = [5, 17, 42, 7, 9, 311]
runner = CliRunner()
PROMPT = "The cat sat on the mat"


def _vector(lm, layer: int, seed: int = 1) -> SteeringVector:
    g = torch.Generator().manual_seed(seed)
    d = int(lm.config.hidden_size)
    return SteeringVector({layer: torch.randn(d, generator=g)}, "file", "a random vector")


def _plain_forward(lm, ids, layer=None, v=None, positions=None, hidden=False):
    """The model with, optionally, a forward hook of this test that adds v to block `layer`'s
    output (at `positions`, or everywhere): registered here, not through fptrace."""
    handle = None
    if v is not None:
        def add(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            h = h.clone()
            if positions is None:
                h += v.to(h.dtype)
            else:
                h[:, positions] += v.to(h.dtype)
            return (h, *output[1:]) if isinstance(output, tuple) else h
        handle = lm.parts.blocks[layer].register_forward_hook(add, prepend=True)
    try:
        with torch.no_grad():
            return lm.model(torch.tensor([list(ids)]), use_cache=False, logits_to_keep=1,
                            output_hidden_states=hidden)
    finally:
        if handle is not None:
            handle.remove()


def test_scale_zero_is_the_clean_run_bit_for_bit(tiny):
    vec = _vector(tiny, 0)
    out = run_rows(tiny, IDS, 1, steering_hooks(tiny, vec.layers, [0.0], None), "")
    want = _plain_forward(tiny, IDS).logits[0, -1].float()
    assert torch.equal(out.logits[0], want)
    r = steer(tiny, IDS, vector=vec, scales=[0])
    assert len(r.rows) == 1 and r.rows[0].clean and r.rows[0].kl[-1] == 0.0
    assert r.target.logit == float(want[r.target.id])


def test_steered_run_equals_an_independent_hook(tiny):
    L = len(tiny.parts.blocks) - 1
    vec = _vector(tiny, L)
    v = vec.layers[L]
    r = steer(tiny, IDS, vector=vec, scales=[0, 0.5, 2])
    clean = _plain_forward(tiny, IDS).logits[0, -1].float()
    p_clean = torch.log_softmax(clean, -1)
    for row in r.rows:
        got = _plain_forward(tiny, IDS, L, row.scale * v).logits[0, -1].float()
        t = r.target.id
        assert row.target.logit == pytest.approx(float(got[t]), rel=1e-4, abs=1e-4)
        lp = torch.log_softmax(got, -1)
        kl = float((lp.exp() * (lp - p_clean)).sum())
        assert row.kl[-1] == pytest.approx(max(kl, 0.0), rel=1e-3, abs=1e-5)
        assert row.top[0].id == int(got.argmax())
    assert r.ok and all(c.ok for c in r.checks)


def test_hidden_states_see_the_vector(tiny):
    """transformers' output_hidden_states comes from its own hook on each block: fptrace's
    steering hook is prepended, so hidden_states[L + 1] holds the steered stream."""
    L = 0
    vec = _vector(tiny, L)
    clean = _plain_forward(tiny, IDS, hidden=True).hidden_states[L + 1]
    from fptrace.core.hooks import hooked

    with torch.no_grad(), hooked(steering_hooks(tiny, vec.layers, [3.0], None), prepend=True):
        steered = tiny.model(torch.tensor([IDS]), use_cache=False,
                             output_hidden_states=True).hidden_states[L + 1]
    torch.testing.assert_close(steered - clean, (3.0 * vec.layers[L]).expand_as(clean),
                               rtol=1e-4, atol=1e-4)


def test_the_vector_sits_on_what_the_stream_received(tiny):
    """The block's output minus its input minus what the family's attention and MLP add-modules
    (the post-norms of Gemma 2/3 and OLMo 2) output is exactly the vector: it goes where the
    stream is."""
    L = 0
    vec = _vector(tiny, L)
    seen = {}

    def keep(name):
        def hook(module, args, output):
            seen[name] = (output[0] if isinstance(output, tuple) else output).detach().clone()
        return hook

    def keep_in(module, args, kwargs):
        seen["in"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    parts = tiny.parts
    handles = [parts.blocks[L].register_forward_pre_hook(keep_in, with_kwargs=True),
               parts.blocks[L].register_forward_hook(keep("out")),
               parts.attn_adds[L].register_forward_hook(keep("attn")),
               parts.mlp_adds[L].register_forward_hook(keep("mlp"))]
    from fptrace.core.hooks import hooked

    try:
        with torch.no_grad(), hooked(steering_hooks(tiny, vec.layers, [2.0], None), prepend=True):
            tiny.model(torch.tensor([IDS]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    rest = seen["out"] - seen["in"] - seen["attn"] - seen["mlp"]
    torch.testing.assert_close(rest, (2.0 * vec.layers[L]).expand_as(rest), rtol=1e-4,
                               atol=1e-4)


def test_batched_sweep_equals_one_by_one(tiny):
    vec = _vector(tiny, 0)
    together = steer(tiny, IDS, vector=vec, scales="0,1,2,4")
    for row in together.rows:
        alone = steer(tiny, IDS, vector=vec, scales=[row.scale]).rows[-1]
        assert alone.scale == row.scale
        assert row.target.logit == pytest.approx(alone.target.logit, rel=1e-4, abs=1e-4)
        assert row.kl == pytest.approx(alone.kl, rel=1e-3, abs=1e-5)
        assert row.top[0].id == alone.top[0].id
    assert together.forward_passes == 1


def test_positions_last_and_continuations():
    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2(), random_weights=True, device="cpu")
    vec = _vector(lm, 1)
    v = vec.layers[1]
    r = steer(lm, IDS, vector=vec, scales=[8], positions=[-1], new_tokens=4)
    assert r.positions == (len(IDS) - 1,)
    got = _plain_forward(lm, IDS, 1, 8 * v, positions=[len(IDS) - 1]).logits[0, -1]
    assert r.rows[-1].top[0].id == int(got.argmax())
    # the continuation: greedy, the vector at the prompt's last position in every pass
    ids = list(IDS)
    for _ in range(4):
        ids.append(int(_plain_forward(lm, ids, 1, 8 * v, positions=[len(IDS) - 1])
                       .logits[0, -1].argmax()))
    assert [t.id for t in r.rows[-1].continuation] == ids[len(IDS):]
    # every position (the default): generated tokens are steered too
    every = steer(lm, IDS, vector=vec, scales=[8], new_tokens=3).rows[-1]
    ids = list(IDS)
    for _ in range(3):
        ids.append(int(_plain_forward(lm, ids, 1, 8 * v).logits[0, -1].argmax()))
    assert [t.id for t in every.continuation] == ids[len(IDS):]


def _last_stream(lm, text, layer):
    """The stream after block `layer` (< the last) at the last position, from transformers'
    hidden states."""
    return _plain_forward(lm, lm.encode(text), hidden=True).hidden_states[layer + 1][0, -1]


def test_sources_are_what_they_say(tmp_path):
    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2(), random_weights=True, device="cpu")
    r = steer(lm, PROMPT, add=" love", subtract=" hate", layer=0, scales=[1])
    want = _last_stream(lm, " love", 0) - _last_stream(lm, " hate", 0)
    assert r.vector.norms[0] == pytest.approx(float(want.norm()), rel=1e-5)
    pairs = [("I love it", "I hate it"), ("Good day", "Bad day"), ("yes sir", "no thanks sir")]
    diffs = torch.stack([_last_stream(lm, a, 0) - _last_stream(lm, b, 0) for a, b in pairs])
    mean = pairs_vector(lm, pairs, 0, "mean").layers[0]
    torch.testing.assert_close(mean, diffs.mean(0), rtol=1e-4, atol=1e-5)
    pca = pairs_vector(lm, pairs, 0, "pca").layers[0]
    u = torch.linalg.svd(diffs.double()).Vh[0].float()
    assert abs(float(torch.nn.functional.cosine_similarity(pca, u, 0))) == pytest.approx(1, abs=1e-4)
    assert float(pca @ diffs.mean(0)) > 0
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps({"positive": a, "negative": b}) + "\n" for a, b in pairs))
    from_file = pairs_vector(lm, str(src), 0, "mean")
    torch.testing.assert_close(from_file.layers[0], mean)
    assert from_file.pairs == 3
    row = token_vector(lm, " Paris", 1).layers[1]
    torch.testing.assert_close(row, lm.parts.lm_head.weight[lm.encode(" Paris")[0]].float())
    matched = steer(lm, PROMPT, token=" Paris", layer=1, scales=[1], norm_match=True)
    assert matched.vector.norms[0] == pytest.approx(matched.vector.stream_norms[0], rel=1e-4)
    assert matched.vector.norm_matched and matched.forward_passes == 2


def test_saved_vector_reads_back_and_reproduces_the_run(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "love.gguf"
    args = [PROMPT, "-m", tiny_gpt2(), "--random-weights", "--scale", "0,2,4"]
    r = runner.invoke(app, ["steer", *args, "--add", " love", "--subtract", " hate", "-l", "1",
                            "--save-vector", str(path), "--json"])
    assert r.exit_code == 0, r.stderr
    first = json.loads(r.stdout)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "controlvector"
    assert reader.fields["controlvector.layer_count"].contents() == 1
    assert reader.fields["controlvector.model_hint"].contents() == "gpt2"
    (t,) = reader.tensors
    assert t.name == "direction.1" and t.tensor_type == gguf.GGMLQuantizationType.F32
    assert list(t.shape) == [32]
    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2(), random_weights=True, device="cpu")
    # block 1 is the last block: its output is hidden_states[2] before the final norm, so it is
    # measured with a hook here
    seen = []
    h = lm.parts.blocks[1].register_forward_hook(lambda m, a, o: seen.append(o[0, -1].clone()))
    try:
        _plain_forward(lm, lm.encode(" love"))
        _plain_forward(lm, lm.encode(" hate"))
    finally:
        h.remove()
    np.testing.assert_allclose(np.array(t.data), (seen[0] - seen[1]).numpy(), rtol=1e-5,
                               atol=1e-6)
    r = runner.invoke(app, ["steer", *args, "--vector", str(path), "--json"])
    assert r.exit_code == 0, r.stderr
    again = json.loads(r.stdout)
    for a, b in zip(first["rows"], again["rows"]):
        assert a["target"]["logit"] == pytest.approx(b["target"]["logit"], rel=1e-5, abs=1e-6)
        assert a["kl"] == pytest.approx(b["kl"], rel=1e-4, abs=1e-7)
    assert again["vector"]["layers"] == [1] and again["vector"]["source"] == "file"
    for suffix in (".npy", ".safetensors"):
        other = tmp_path / f"love{suffix}"
        r = runner.invoke(app, ["steer", *args, "--add", " love", "--subtract", " hate", "-l",
                                "1", "--save-vector", str(other)])
        assert r.exit_code == 0, r.stderr
        back = read_vector(lm, str(other))
        assert list(back.layers) == [1]
        np.testing.assert_allclose(back.layers[1].numpy(), np.array(t.data), rtol=1e-6)


def test_json_validates_and_plot(tmp_path):
    import jsonschema

    r = runner.invoke(app, ["schema"])
    validator = jsonschema.Draft202012Validator(json.loads(r.stdout))
    plot = tmp_path / "sweep.png"
    r = runner.invoke(app, ["steer", PROMPT, "-m", tiny_gpt2(), "--random-weights", "--token",
                            " mat", "-l", "0", "--scale", "0,1,-1", "-n", "2", "--json",
                            "--plot", str(plot)])
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert not list(validator.iter_errors(data)) and data["kind"] == "steering"
    assert plot.stat().st_size > 1000
    assert [row["scale"] for row in data["rows"]] == [0, 1, -1]


def _write_gguf(path, arch, tensors):
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch=arch)
    for name, values in tensors.items():
        w.add_tensor(name, np.asarray(values, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_bad_input(tmp_path):
    import numpy as np

    wide = tmp_path / "wide.npy"
    np.save(wide, np.ones(64, dtype=np.float32))
    model = tmp_path / "model.gguf"
    _write_gguf(model, "llama", {"token_embd.weight": np.ones((4, 32))})
    far = tmp_path / "far.gguf"
    _write_gguf(far, "controlvector", {"direction.7": np.ones(32)})
    odd = tmp_path / "odd.gguf"
    _write_gguf(odd, "controlvector", {"direction.²": np.ones(32)})
    from safetensors.numpy import save_file

    odd_st = tmp_path / "odd.safetensors"
    save_file({"direction.1": np.ones(32, dtype=np.float32),
               "direction.٣": np.ones(32, dtype=np.float32)}, str(odd_st))
    cases = [
        (["--vector", str(odd)], "the tensor 'direction.²' is '²': not a whole number"),
        (["--vector", str(odd_st)], "the tensor 'direction.٣' is '٣': not a whole"),
        (["--token", "#²", "-l", "1"], "--token '#²': the token id '²': not a whole number"),
        (["--vector", str(wide), "-l", "0"], "has 64 values but tiny-gpt2's d_model is 32"),
        (["--vector", str(model)], "is not a control vector"),
        (["--vector", str(far)], "direction for block 7"),
        (["--add", " a", "--subtract", " b", "-l", "2"], "--layer 2: tiny-gpt2 has 2 blocks; "
         "the block is 0 to 1"),
        (["--token", " a"], "--layer: say which block's output receives the vector"),
        (["--add", " a", "--subtract", " b", "-l", "0", "--scale", "1,x"], "'x' is not a number"),
        (["--add", " love", "-l", "0"], "--add and --subtract go together"),
        (["--token", " a", "--add", " b", "--subtract", " c", "-l", "0"],
         "--token is not an option of `steer --add A --subtract B` (the stream of one text minus "
         "another's); it belongs to `steer --token T`"),
        (["-l", "0"], "give one source of the steering vector: `steer --sae DIR --latent N`"),
        (["--token", " a", "-l", "0", "--positions", "9"], "--positions 9: the prompt has 6 "
         "tokens; the position is 0 to 5 (or -1 to -6 from the end)"),
        (["--token", " a", "-l", "0", "--positions", "0,-7"], "--positions 0,-7: the prompt has "
         "6 tokens"),
        (["--token", " a", "-l", "0", "--positions", "3--5"], "--positions 3--5: the range 3--5 "
         "is 3-1, which is reversed"),
        (["--token", " a", "-l", "0", "--method", "pca"], "--method is not an option of "
         "`steer --token T` (the LM head's row of a token); it belongs to `steer --pairs FILE`"),
        (["--token", " a", "--save-vector", str(tmp_path / "v.txt"), "-l", "0"], ".gguf"),
        (["--token", " a", "--save-vector", str(tmp_path / "v.gguf"), "-l", "0"], "block 0"),
        (["--token", " a", "-l", "0", "-n", "40"], "context window"),
    ]
    for args, needle in cases:
        r = runner.invoke(app, ["steer", PROMPT, "-m", tiny_gpt2(), "--random-weights", *args])
        assert r.exit_code == 2, (args, r.stdout)
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith("fptrace: error:") and needle in line, (args, line)


HOSTILE = ["²", "٣", "１", "-", "1.", ".1", "1.2.3", "99999999999999999999", "", "1 2", "+1"]


@pytest.mark.parametrize("option", ["--layer", "--positions"])
@pytest.mark.parametrize("value", HOSTILE + ["3-1", "0,,1", "0-", "all,1"])
def test_hostile_addresses_get_one_line_before_loading(option, value):
    """Every bad place is refused by the one address parser: exit 2, one line that names the
    option and the value, before any model loads (issue 32: `--positions ²` was exit 70)."""
    args = ["--token", " cat", "--layer", "1", "--positions", "all"]
    args[args.index(option) + 1] = value
    r = runner.invoke(app, ["steer", "The cat sat", "-m", tiny_gpt2(), "--random-weights", *args])
    assert r.exit_code == 2, (option, value, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fptrace: error: {option} {value!r}"), lines


def test_positions_and_layer_addresses():
    """`--positions 0-2,-1` is positions 0, 1, 2 and the last; `--layer -1` the last block:
    the same run as a plain forward hook of this test at those places."""
    from fptrace.addresses import Block, parse_selection
    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2(), random_weights=True, device="cpu")
    vec = _vector(lm, 1)
    where = parse_selection("0-2,-1", "--positions")
    r = steer(lm, IDS, vector=vec, scales=[8], positions=where)
    assert r.positions == (0, 1, 2, len(IDS) - 1)
    got = _plain_forward(lm, IDS, 1, 8 * vec.layers[1], positions=[0, 1, 2, len(IDS) - 1])
    torch.testing.assert_close(r.rows[-1].top[0].logit, float(got.logits[0, -1].max()),
                               rtol=1e-4, atol=1e-4)
    last = steer(lm, IDS, token="#5", layer=Block(-1), scales=[4])
    assert last.vector.layers == (1,)
    with pytest.raises(BadInput, match=r"^positions=\[9\]: the prompt has 6 tokens"):
        steer(lm, IDS, vector=vec, positions=[9])
    with pytest.raises(BadInput, match=r"^positions='last': give a non-empty list of ints"):
        steer(lm, IDS, vector=vec, positions="last")
    with pytest.raises(BadInput, match=r"^layer=5: tiny-gpt2 has 2 blocks"):
        steer(lm, IDS, token="#5", layer=5)


def test_a_sweep_too_big_says_what_to_lower(monkeypatch):
    import fptrace.models.memory as memory
    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2(), random_weights=True, device="cpu")
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    with pytest.raises(BadInput, match="sweep fewer strengths"):
        steer(lm, IDS, vector=_vector(lm, 0), scales="0,1,2,4,8")


@pytest.mark.slow
def test_bundled_model_love_minus_hate(smollm):
    r = steer(smollm, "I think that you are", add=" love", subtract=" hate", layer=6,
              scales="0,2,8", new_tokens=3)
    assert r.ok and r.kl_layers == tuple(range(6, 30))
    kl = [row.kl[-1] for row in r.rows]
    assert kl[0] == 0 and 0 < kl[1] < kl[2]
    assert all(not math.isnan(x) for row in r.rows for x in row.kl)


def test_a_control_vector_of_several_blocks_steers_each_block(tmp_path):
    """As llama.cpp: direction.N is added to the output of block N, for every N in the file;
    --layer keeps one."""
    import numpy as np

    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2(), random_weights=True, device="cpu")
    g = np.random.default_rng(0)
    dirs = {k: g.standard_normal(32).astype(np.float32) for k in (0, 1)}
    path = tmp_path / "two.gguf"
    _write_gguf(path, "controlvector", {f"direction.{k}": v for k, v in dirs.items()})
    r = steer(lm, IDS, vector=str(path), scales=[0, 3])
    assert r.vector.layers == (0, 1) and r.kl_layers == (0, 1) and r.ok
    handles = [lm.parts.blocks[k].register_forward_hook(
        lambda m, a, o, v=torch.from_numpy(v): o + 3 * v) for k, v in dirs.items()]
    try:
        want = _plain_forward(lm, IDS).logits[0, -1]
    finally:
        for h in handles:
            h.remove()
    assert r.rows[-1].target.logit == pytest.approx(float(want[r.target.id]), rel=1e-4, abs=1e-5)
    one = steer(lm, IDS, vector=str(path), layer=1, scales=[3])
    assert one.vector.layers == (1,)
    single = tmp_path / "one.gguf"
    _write_gguf(single, "controlvector", {"direction.1": np.ones(32)})
    with pytest.raises(BadInput, match="no direction for block 0"):
        read_vector(lm, str(single), 0)


@pytest.mark.parametrize("style", ["llama3", "gemma"])
def test_prompts_as_the_model_takes_them(style, tmp_path):
    """On tokenizers that add a begin-of-text token: the prompt's ids are the tokenizer's own,
    --target and --token given as text are the one token the tokenizer writes for them, and
    --chat steers the chat template's ids, the template's tokens marked (all computed here with
    the tokenizer, not through fptrace)."""
    import tokenizer_fixtures
    from transformers import AutoTokenizer

    from fptrace.models.loading import load_model

    folder = tokenizer_fixtures.BUILDERS[style](tmp_path / style)
    tok = AutoTokenizer.from_pretrained(folder)
    lm = load_model(str(folder), device="cpu")
    (paris,) = tok.encode(" Paris", add_special_tokens=False)
    s = steer(lm, PROMPT, token=" Paris", layer=1, scales="0,1", target=" Paris")
    assert [t.id for t in s.tokens] == tok(PROMPT)["input_ids"]
    assert s.target.id == paris and s.ok
    assert s.vector.norms[0] == pytest.approx(float(lm.model.lm_head.weight[paris].detach().norm()))
    r = runner.invoke(app, ["steer", "--chat", PROMPT, "--token", " Paris", "--layer", "1",
                            "--scale", "0,1", "-m", str(folder), "--json"])
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    want = tok.apply_chat_template([{"role": "user", "content": PROMPT}],
                                   add_generation_prompt=True, tokenize=True, return_dict=False)
    assert [t["id"] for t in data["tokens"]] == want
    assert any(t["template"] for t in data["tokens"]) and not all(
        t["template"] for t in data["tokens"])
