"""fptrace ablate: zero-ablating a head equals zeroing that head's columns of the attention output
projection (done here to a copy of the weights); mean ablation equals putting the mean write
back by hand; removing every head and the MLP of a block leaves the stream before it (plus the
W_O bias, which belongs to no head); the batched grid equals one run per part; the direct effect
is minus attribute's contribution; bad input is refused with what to change."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import build_tiny, tiny_gpt2
from typer.testing import CliRunner

from fptrace.addresses import Head
from fptrace.cli.main import app
from fptrace.commands.ablate.core import ablate
from fptrace.commands.attribute.core import attribute
from fptrace.core.interventions import Part, ablation_hooks, run_rows
from fptrace.errors import BadInput
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311]
PROMPT = "The cat sat on the mat"
runner = CliRunner()


def _projection(lm, layer):
    """The attention output projection, by the leaf names the family gives."""
    attn = lm.parts.attns[layer]
    return next(getattr(attn, n) for n in lm.parts.family.w_o if hasattr(attn, n))


def _head_dim(lm):
    """The values per head W_O reads (latent attention, DeepSeek-V3: v_head_dim)."""
    c = lm.config
    return getattr(c, "v_head_dim", None) or getattr(c, "head_dim", None) \
        or c.hidden_size // c.num_attention_heads


def _zeroed_copy(lm, layer, head):
    """A copy of the model whose W_O has the head's input columns zeroed (GPT-2's Conv1D
    stores (in, out): rows there)."""
    model = copy.deepcopy(lm.model)
    wrapped = wrap_model(model, name="copy", random_weights=True)
    proj = _projection(wrapped, layer)
    hd = _head_dim(lm)
    with torch.no_grad():
        if type(proj).__name__ == "Conv1D":
            proj.weight[head * hd:(head + 1) * hd, :] = 0
        else:
            proj.weight[:, head * hd:(head + 1) * hd] = 0
    return model


def _logits(model, ids=IDS):
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False, logits_to_keep=1).logits[0, -1].float()


def test_zero_ablating_a_head_equals_zeroing_its_columns(tiny):
    layer = len(tiny.parts.blocks) - 1
    nh = int(tiny.config.num_attention_heads)
    rows = [[Part(layer, h)] for h in range(nh)]
    out = run_rows(tiny, IDS, nh, ablation_hooks(tiny, rows, None), "")
    for h in range(nh):
        want = _logits(_zeroed_copy(tiny, layer, h))
        torch.testing.assert_close(out.logits[h], want, rtol=1e-4, atol=1e-4)
    r = ablate(tiny, IDS, heads=[Head(layer, 0)])
    assert r.ok, r.checks
    want = _logits(_zeroed_copy(tiny, layer, 0))
    assert r.runs[0].prob == pytest.approx(float(torch.softmax(want, -1)[r.target.id]),
                                           rel=1e-4, abs=1e-7)


def test_every_head_and_the_mlp_of_a_block_leave_the_stream_before_it(tiny):
    """With every head and the MLP of block 0 removed, the block adds nothing but the attention
    output projection's bias (which belongs to no head; through the post-norm where the family
    has one), at every position."""
    nh = int(tiny.config.num_attention_heads)
    row = [Part(0, h) for h in range(nh)] + [Part(0)]
    from fptrace.core.hooks import hooked

    with torch.no_grad(), hooked(ablation_hooks(tiny, [row], None), prepend=True):
        hs = tiny.model(torch.tensor([IDS]), use_cache=False, output_hidden_states=True,
                        logits_to_keep=1).hidden_states
    added = hs[1] - hs[0]  # (1, T, d)
    bias = getattr(_projection(tiny, 0), "bias", None)
    want = torch.zeros_like(added) if bias is None else bias.float().expand_as(added)
    if tiny.parts.family.attn_added:
        with torch.no_grad():
            want = tiny.parts.attn_adds[0](want)
    torch.testing.assert_close(added, want, rtol=1e-5, atol=1e-5)


def test_removal_at_some_positions_leaves_the_others_as_they_were(tiny):
    """Every head and the MLP of block 0 removed at positions ≥ k only (`positions`): from k on
    the block adds nothing but the output projection's bias, as when removed everywhere; before
    k every block's output is the clean pass's (the model is causal)."""
    from fptrace.core.hooks import hooked

    nh = int(tiny.config.num_attention_heads)
    row = [Part(0, h) for h in range(nh)] + [Part(0)]
    k = 3
    x = torch.tensor([IDS])
    with torch.no_grad():
        clean = tiny.model(x, use_cache=False, output_hidden_states=True,
                           logits_to_keep=1).hidden_states
        with hooked(ablation_hooks(tiny, [row], None, positions=range(k, len(IDS))),
                    prepend=True):
            hs = tiny.model(x, use_cache=False, output_hidden_states=True,
                            logits_to_keep=1).hidden_states
        with hooked(ablation_hooks(tiny, [row], None), prepend=True):
            every = tiny.model(x, use_cache=False, output_hidden_states=True,
                               logits_to_keep=1).hidden_states
    for got, want in zip(hs, clean, strict=True):
        torch.testing.assert_close(got[:, :k], want[:, :k], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((hs[1] - hs[0])[:, k:], (every[1] - every[0])[:, k:],
                               rtol=1e-5, atol=1e-5)
    assert not torch.allclose(hs[-1][:, k:], clean[-1][:, k:], atol=1e-3)  # it changed there


def test_mean_ablation_puts_the_mean_back(tiny):
    """Mean-ablating a head equals zeroing its columns and adding its mean write W_O,h · mean(z_h)
    at every position; mean-ablating an MLP equals replacing its output with its mean."""
    layer = 0
    hd = _head_dim(tiny)
    seen = {}
    proj = _projection(tiny, layer)
    handles = [proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0].clone())),
               tiny.parts.mlp_adds[layer].register_forward_hook(
                   lambda m, a, o: seen.__setitem__("mlp", (o[0] if isinstance(o, tuple)
                                                            else o).clone()))]
    try:
        _logits(tiny.model)
    finally:
        for h in handles:
            h.remove()
    mean_z = seen["z"][0].mean(0)  # (nh·hd,)
    model = _zeroed_copy(tiny, layer, 1)
    W = proj.weight.float()
    W = W.T if type(proj).__name__ == "Conv1D" else W  # (d, nh·hd)
    write = W[:, hd:2 * hd] @ mean_z[hd:2 * hd]
    target = _projection(wrap_model(model, name="c", random_weights=True), layer)
    h = target.register_forward_hook(lambda m, a, o: o + write.to(o.dtype))
    try:
        want_head = _logits(model)
    finally:
        h.remove()
    mean_mlp = seen["mlp"][0].mean(0)
    mlp_module = tiny.parts.mlp_adds[layer]

    def replace(m, a, o):
        h = o[0] if isinstance(o, tuple) else o
        new = mean_mlp.to(h.dtype).expand_as(h).clone()
        return (new, *o[1:]) if isinstance(o, tuple) else new

    h = mlp_module.register_forward_hook(replace)
    try:
        want_mlp = _logits(tiny.model)
    finally:
        h.remove()
    from fptrace.core.interventions import mean_outputs

    means = mean_outputs(tiny, [IDS])
    out = run_rows(tiny, IDS, 2, ablation_hooks(tiny, [[Part(layer, 1)], [Part(layer)]], means),
                   "")
    torch.testing.assert_close(out.logits[0], want_head, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.logits[1], want_mlp, rtol=1e-4, atol=1e-4)
    r = ablate(tiny, IDS, heads=[Head(layer, 1)], mlps=[layer], mode="mean")
    assert r.ok and r.mean_positions == len(IDS)


def test_batched_grid_equals_one_by_one(tiny):
    a = ablate(tiny, IDS, all_heads=True, all_mlps=True, batch_size=64)
    b = ablate(tiny, IDS, all_heads=True, all_mlps=True, batch_size=1)
    assert a.ok and b.ok
    for ra, rb in zip(a.head_grid, b.head_grid):
        assert ra == pytest.approx(rb, rel=1e-4, abs=1e-5)
    assert a.mlp_column == pytest.approx(b.mlp_column, rel=1e-4, abs=1e-5)
    assert a.forward_passes < b.forward_passes


def test_direct_effect_is_minus_the_attribution():
    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    attr = {(c.component, c.layer, c.head): c.value for c in attribute(lm, IDS).contributions}
    r = ablate(lm, IDS, heads=[Head(1, 2)], mlps=[0])
    head, mlp, both = r.runs
    assert head.direct == pytest.approx(-attr[("attn_head", 1, 2)], rel=1e-6)
    assert mlp.direct == pytest.approx(-attr[("mlp", 0, None)], rel=1e-6)
    assert both.direct == pytest.approx(head.direct + mlp.direct, rel=1e-6)
    assert both.parts == ("mlp 0", "1.2")
    for run in r.runs:
        assert run.indirect == pytest.approx(run.logit_change - run.direct, abs=1e-9)
    # the last block's MLP: nothing comes after it but the final norm, so removing it is the
    # final norm and LM head applied to the last stream minus the MLP's output
    seen = {}
    hooks = [lm.parts.blocks[-1].register_forward_hook(
                 lambda m, a, o: seen.__setitem__("x", (o[0] if isinstance(o, tuple) else o))),
             lm.parts.mlp_adds[-1].register_forward_hook(
                 lambda m, a, o: seen.__setitem__("mlp", o))]
    try:
        _logits(lm.model)
    finally:
        for h in hooks:
            h.remove()
    last = ablate(lm, IDS, mlps=[len(lm.parts.blocks) - 1]).runs[0]
    with torch.no_grad():
        want = lm.parts.lm_head(lm.parts.final_norm(seen["x"] - seen["mlp"]))[0, -1]
    assert last.logit == pytest.approx(float(want[r.target.id]), rel=1e-4, abs=1e-5)


def test_mean_over_a_file_of_the_prompt_is_the_prompt_mean(tmp_path):
    src = tmp_path / "prompts.txt"
    src.write_text(PROMPT + "\n")
    args = [PROMPT, "-m", tiny_gpt2(), "--random-weights", "--mode", "mean", "--all-heads",
            "--json"]
    own = runner.invoke(app, ["ablate", *args])
    over = runner.invoke(app, ["ablate", *args, "--mean-over", str(src)])
    assert own.exit_code == 0 and over.exit_code == 0, over.stderr
    a, b = json.loads(own.stdout), json.loads(over.stdout)
    for ra, rb in zip(a["head_grid"], b["head_grid"]):
        assert ra == pytest.approx(rb, rel=1e-5, abs=1e-7)
    assert b["mean_over"] == str(src) and b["mean_positions"] == 6


def test_json_validates_and_plot(tmp_path):
    import jsonschema

    r = runner.invoke(app, ["schema"])
    validator = jsonschema.Draft202012Validator(json.loads(r.stdout))
    for extra in (["--head", "1.1", "--mlp", "0"], ["--all-heads", "--all-mlps"]):
        plot = tmp_path / "ablate.png"
        r = runner.invoke(app, ["ablate", PROMPT, "-m", tiny_gpt2(), "--random-weights", *extra,
                                "--json", "--plot", str(plot)])
        assert r.exit_code == 0, r.stderr
        data = json.loads(r.stdout)
        assert not list(validator.iter_errors(data)) and data["kind"] == "ablation"
        assert plot.stat().st_size > 1000
        plot.unlink()


def test_bad_input(tmp_path):
    cases = [
        (["--head", "2.0"], "--head 2.0: tiny-gpt2 has 2 blocks; the block is 0 to 1"),
        (["--head", "0.5"], "--head 0.5: each block of tiny-gpt2 has 2 heads; the head is 0 to 1"),
        (["--head", "L0H-3"], "--head L0H-3: each block of tiny-gpt2 has 2 heads"),
        (["--head", "1"], "--head '1': a block alone; give a block and a head as 23.4 or L23H4"),
        (["--mlp", "7"], "--mlp 7: tiny-gpt2 has 2 blocks; the block is 0 to 1"),
        (["--head", "0.0", "--mode", "half"], "--mode 'half'"),
        (["--head", "0.0", "--mean-over", str(tmp_path / "x.txt")], "goes with --mode mean"),
        (["--head", "0.0", "--mode", "mean", "--mean-over", str(tmp_path / "x.txt")],
         "no such file"),
        ([], "say what to remove"),
        (["--head", "0.0", "--target", "#100000"], "--target #100000: outside the vocabulary"),
    ]
    for args, needle in cases:
        r = runner.invoke(app, ["ablate", PROMPT, "-m", tiny_gpt2(), "--random-weights", *args])
        assert r.exit_code == 2, (args, r.stdout)
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith("fptrace: error:") and needle in line, (args, line)


HOSTILE = ["²", "٣", "１", "-", "1.", ".1", "1.2.3", "99999999999999999999", "", "1 2", "+1"]


@pytest.mark.parametrize("option", ["--head", "--mlp", "--expert"])
@pytest.mark.parametrize("value", HOSTILE + ["1.²", "².1", "L1H²", "23:4"])
def test_hostile_addresses_get_one_line_before_loading(option, value):
    """Every bad place is refused by the one address parser: exit 2, one line that names the
    option and the value, before any model loads (issue 32: `--head 1.²` was exit 70)."""
    if option == "--mlp" and value in ("L1H²",):
        value = "L1²"
    if option == "--expert" and value in ("L1H²",):
        value = "L1E²"
    r = runner.invoke(app, ["ablate", PROMPT, "-m", tiny_gpt2(), "--random-weights", option,
                            value])
    assert r.exit_code == 2, (option, value, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fptrace: error: {option} {value!r}"), lines


def test_negative_addresses_count_from_the_end_and_print_resolved():
    """`Head(-1, -1)` is the last head of the last block: the same logits as that head zeroed
    in a copy of the weights, and the run is labelled with the resolved address."""
    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    L, nh = len(lm.parts.blocks), int(lm.config.num_attention_heads)
    r = ablate(lm, IDS, heads=[Head(-1, -1)], mlps=[-1])
    assert r.ok, r.checks
    head, mlp, both = r.runs
    assert head.parts == (f"{L - 1}.{nh - 1}",) and mlp.parts == (f"mlp {L - 1}",)
    want = _logits(_zeroed_copy(lm, L - 1, nh - 1))
    assert head.prob == pytest.approx(float(torch.softmax(want, -1)[r.target.id]), rel=1e-4,
                                      abs=1e-7)


def test_the_api_takes_typed_values_and_names_its_parameters():
    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    L = len(lm.parts.blocks)
    with pytest.raises(BadInput, match=r"^heads='1.2': give a list of Head values"):
        ablate(lm, IDS, heads="1.2")
    with pytest.raises(BadInput, match=r"^heads='1.2': give a Head \(fptrace.Head\(23, 4\)\)"):
        ablate(lm, IDS, heads=["1.2"])
    with pytest.raises(BadInput, match=rf"^heads=Head\(9, 0\): tiny-llama has {L} blocks; the "
                       rf"block is 0 to {L - 1} \(or -1 to -{L} from the end\)$"):
        ablate(lm, IDS, heads=[Head(9, 0)])
    with pytest.raises(BadInput, match=rf"^mlps=9: tiny-llama has {L} blocks"):
        ablate(lm, IDS, mlps=[9])
    with pytest.raises(BadInput, match=r"^mlps='1': the block must be an int"):
        ablate(lm, IDS, mlps=["1"])
    with pytest.raises(BadInput, match=r"^target #100000: outside the vocabulary"):
        ablate(lm, IDS, heads=[Head(0, 0)], target="#100000")


def test_a_batch_too_big_says_what_to_lower(monkeypatch):
    import fptrace.models.memory as memory

    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    with pytest.raises(BadInput, match="lower --batch-size"):
        ablate(lm, IDS, all_heads=True)


@pytest.mark.slow
def test_bundled_model_all_heads(smollm):
    r = ablate(smollm, "The capital of France is", all_heads=True, all_mlps=True, top=5)
    assert r.ok and r.target.text == " Paris"
    assert len(r.head_grid) == 30 and all(len(row) == 9 for row in r.head_grid)
    assert r.forward_passes == 1 + -(-300 // 32)
    # attribute's largest head (23.4) is among the heads whose removal costs the most
    worst_heads = sorted((v, f"{l}.{h}") for l, row in enumerate(r.head_grid)
                         for h, v in enumerate(row))[:5]
    assert "23.4" in [name for _, name in worst_heads]


def test_report_sections(tmp_path):
    out = tmp_path / "r.html"
    r = runner.invoke(app, ["report", PROMPT, "-m", tiny_gpt2(), "--random-weights", "-o",
                            str(out), "--ablate", "--add", " love", "--subtract", " hate",
                            "--steer-layer", "1"])
    assert r.exit_code == 0, r.stderr
    page = out.read_text()
    assert "a steering vector added to the stream" in page and "one head or MLP removed" in page
    assert 'alt="steering sweep"' in page and 'alt="ablation grid"' in page
    plain = tmp_path / "plain.html"
    r = runner.invoke(app, ["report", PROMPT, "-m", tiny_gpt2(), "--random-weights", "-o",
                            str(plain)])
    assert r.exit_code == 0, r.stderr
    assert page.count("<img") == plain.read_text().count("<img") + 2  # the sweep and the grid
    r = runner.invoke(app, ["report", PROMPT, "-m", tiny_gpt2(), "--random-weights", "-o",
                            str(out), "--add", " love"])
    assert r.exit_code == 2 and "--steer-layer" in r.stderr


@pytest.mark.parametrize("style", ["llama3", "gemma"])
def test_prompts_as_the_model_takes_them(style, tmp_path):
    """On tokenizers that add a begin-of-text token: the prompt's ids are the tokenizer's own,
    --target given as text is the one token the tokenizer writes for it, and --chat ablates on
    the chat template's ids (computed here with the tokenizer, not through fptrace)."""
    import tokenizer_fixtures
    from transformers import AutoTokenizer

    from fptrace.models.loading import load_model

    folder = tokenizer_fixtures.BUILDERS[style](tmp_path / style)
    tok = AutoTokenizer.from_pretrained(folder)
    lm = load_model(str(folder), device="cpu")
    (paris,) = tok.encode(" Paris", add_special_tokens=False)
    a = ablate(lm, PROMPT, heads=[Head(1, 0)], target=" Paris")
    assert [t.id for t in a.tokens] == tok(PROMPT)["input_ids"]
    assert a.target.id == paris and a.ok
    r = runner.invoke(app, ["ablate", "--chat", PROMPT, "--head", "1.0", "--mlp", "0",
                            "-m", str(folder), "--json"])
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    want = tok.apply_chat_template([{"role": "user", "content": PROMPT}],
                                   add_generation_prompt=True, tokenize=True, return_dict=False)
    assert [t["id"] for t in data["tokens"]] == want
    assert any(t["template"] for t in data["tokens"])


# ------------------------------------------------------------------ experts (mixture of experts)
# What each family does with its chosen experts' weights, written here from the transformers
# sources (not fptrace's): renormalised or not (the tiny configs' norm_topk_prob), the scale.
MOE_RULES = {
    "mixtral": ("softmax", True, 1.0), "qwen2_moe": ("softmax", False, 1.0),
    "qwen3_moe": ("softmax", True, 1.0), "olmoe": ("softmax", False, 1.0),
    "deepseek_v3": ("sigmoid", True, 2.5), "gpt_oss": ("topk_softmax", True, 1.0),
}
MOE_IDS = [5, 17, 42, 7, 9, 311, 2, 80]


def _router(model, layer):
    mlp = model.model.layers[layer].mlp
    return mlp.router if hasattr(mlp, "router") else mlp.gate


def _next_choice(model, layer, logits, e, family):
    """The family's rule without expert e in the choice, on the router's logits (N, E)."""
    scoring, renorm, scale = MOE_RULES[family]
    k = model.config.num_experts_per_tok
    x = logits.float()
    if scoring == "topk_softmax":
        top, idx = x.masked_fill(torch.arange(x.shape[-1]) == e, float("-inf")).topk(k, dim=-1)
        return idx, top.softmax(-1)
    if scoring == "softmax":
        p = x.softmax(-1)
        idx = p.masked_fill(torch.arange(x.shape[-1]) == e, -1.0).topk(k, dim=-1).indices
    else:  # DeepSeek-V3: sigmoid scores, bias on the choice, the best groups of experts
        p = x.sigmoid()
        c = p + _router(model, layer).e_score_correction_bias
        c = c.masked_fill(torch.arange(x.shape[-1]) == e, float("-inf"))
        G, tg = model.config.n_group, model.config.topk_group
        N, E = c.shape
        worth = c.view(N, G, E // G).topk(2, dim=-1).values.sum(-1)
        groups = worth.topk(tg, dim=-1).indices
        allowed = torch.zeros(N, G, dtype=torch.bool).scatter(1, groups, True)
        c = c.masked_fill(~allowed.repeat_interleave(E // G, dim=1), float("-inf"))
        idx = c.topk(k, dim=-1).indices
    w = p.gather(1, idx)
    if renorm:
        w = w / w.sum(-1, keepdim=True)
    return idx, w * scale


def _own_removal(model, layer, e, how, family):
    """A forward hook on the model's own router that takes expert e out of what it hands the
    experts (this test's code, not fptrace's)."""
    _, renorm, scale = MOE_RULES[family]

    def hook(module, args, output):
        logits, w, idx = output[0], output[1].clone(), output[2].clone()
        rows = (idx == e).any(-1)
        if how == "renormalise":
            w[idx == e] = 0.0
            if renorm:
                w[rows] = w[rows] / w[rows].sum(-1, keepdim=True) * scale
        else:
            i2, w2 = _next_choice(model, layer, logits, e, family)
            idx[rows], w[rows] = i2[rows].to(idx.dtype), w2[rows].to(w.dtype)
        return (logits, w, idx)
    return _router(model, layer).register_forward_hook(hook)


def _last_choice(model, layer):
    seen = {}
    h = _router(model, layer).register_forward_hook(
        lambda m, a, o: seen.update(idx=o[2][-1].tolist()))
    try:
        with torch.no_grad():
            model(torch.tensor([MOE_IDS]), use_cache=False)
    finally:
        h.remove()
    return seen["idx"]


@pytest.mark.parametrize("how", ["renormalise", "next"])
@pytest.mark.parametrize("family", sorted(MOE_RULES))
def test_expert_removal_equals_a_hook_on_the_models_router(family, how):
    """ablate --expert L.E: the ablated logit equals the model's with an independent hook on
    its own router removing that expert; the direct effect equals what that hook changes in
    the MoE block's output at the last position, through the final norm frozen at the clean
    stream and the target's unembedding row."""
    from conftest import build_tiny_moe

    from fptrace.addresses import Expert

    model = build_tiny_moe(family)
    lm = wrap_model(model, name=f"tiny-{family}", random_weights=True)
    layer = model.config.num_hidden_layers - 1
    e = _last_choice(model, layer)[0]  # the last position's top expert: a removal that matters
    r = ablate(lm, MOE_IDS, experts=[Expert(layer, e)], route=how)
    assert r.ok, r.checks
    assert [c.target for c in r.checks] == ["ablated_experts", "ablated_block"]
    run = r.runs[0]
    assert run.parts == (f"L{layer}E{e}",)
    t = r.target.id
    mlp = model.model.layers[layer].mlp
    got = {}
    keep = mlp.register_forward_hook(lambda m, a, o: got.setdefault("moe", []).append(
        (o[0] if isinstance(o, tuple) else o)[0, -1]))
    norm_in = model.model.norm.register_forward_hook(
        lambda m, a, o: got.setdefault("final", []).append(a[0][0, -1]))
    try:
        with torch.no_grad():
            clean = model(torch.tensor([MOE_IDS]), use_cache=False).logits[0, -1]
            handle = _own_removal(model, layer, e, how, family)
            try:
                ablated = model(torch.tensor([MOE_IDS]), use_cache=False).logits[0, -1]
            finally:
                handle.remove()
    finally:
        keep.remove()
        norm_in.remove()
    assert r.clean_logit == pytest.approx(float(clean[t]), rel=1e-5, abs=1e-5)
    assert run.logit == pytest.approx(float(ablated[t]), rel=1e-5, abs=1e-5)
    assert run.logit_change == pytest.approx(float(ablated[t] - clean[t]), rel=1e-3, abs=1e-6)
    assert abs(run.logit_change) > 1e-5  # the removal mattered: the test can fail
    x = got["final"][0]
    norm = model.model.norm
    with torch.no_grad():
        gain = norm.weight * torch.rsqrt(x.pow(2).mean() + norm.variance_epsilon)
        delta = got["moe"][1] - got["moe"][0]
        want = float((delta * gain) @ model.lm_head.weight[t])
    assert run.direct == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert run.indirect == pytest.approx(run.logit_change - run.direct)


@pytest.mark.parametrize("family", sorted(MOE_RULES))
def test_every_expert_removed_leaves_the_routed_output_zero(family):
    """With every routed expert of a block gone there is nothing left to choose: `next` and
    `renormalise` alike give the model whose experts module adds zero there (a hook on the
    model's own experts module, shared experts kept). `next` used to keep k removed experts,
    weighted by their unmasked probabilities (OLMoE's last block: -0.011 for -0.0052)."""
    from conftest import build_tiny_moe

    from fptrace.addresses import Expert

    model = build_tiny_moe(family)
    lm = wrap_model(model, name=f"tiny-{family}", random_weights=True)
    layer = model.config.num_hidden_layers - 1
    E = lm.config.num_local_experts if hasattr(lm.config, "num_local_experts") else \
        lm.config.num_experts if hasattr(lm.config, "num_experts") else lm.config.n_routed_experts
    every = [Expert(layer, e) for e in range(E)]
    experts = model.model.layers[layer].mlp.experts
    with torch.no_grad():
        clean = model(torch.tensor([MOE_IDS]), use_cache=False).logits[0, -1]
        h = experts.register_forward_hook(lambda m, a, o: torch.zeros_like(o))
        try:
            zeroed = model(torch.tensor([MOE_IDS]), use_cache=False).logits[0, -1]
        finally:
            h.remove()
    for how in ("next", "renormalise"):
        r = ablate(lm, MOE_IDS, experts=every, route=how)
        assert r.ok, (how, r.checks)
        t = r.target.id
        run = r.runs[-1]  # all of them together
        assert len(run.parts) == E
        assert run.logit == pytest.approx(float(zeroed[t]), rel=1e-5, abs=1e-5), how
        assert abs(float(zeroed[t] - clean[t])) > 1e-5  # the removal matters: the test can fail
        assert any(n.startswith(f"with L{layer}E0, L{layer}E1") and
                   f"no expert is left for the last position to take at block {layer}" in n
                   for n in r.notes), (how, r.notes)


def test_the_expert_check_is_not_the_rule_it_checks(monkeypatch):
    """The `ablated_experts` check computes the new choice by hand, not with the route() the
    hooks run: a hook rule that ignores the removal (keeps the removed expert) fails it."""
    from conftest import build_tiny_moe

    from fptrace.addresses import Expert
    from fptrace.core import routing

    model = build_tiny_moe("olmoe")
    lm = wrap_model(model, name="tiny-olmoe", random_weights=True)
    layer = model.config.num_hidden_layers - 1
    e = _last_choice(model, layer)[0]
    assert ablate(lm, MOE_IDS, experts=[Expert(layer, e)], route="next").ok
    real = routing.route
    monkeypatch.setattr(routing, "route", lambda logits, moe, bias=None, exclude=None:
                        real(logits, moe, bias))
    r = ablate(lm, MOE_IDS, experts=[Expert(layer, e)], route="next")
    check = next(c for c in r.checks if c.target == "ablated_experts")
    assert not check.ok and not r.ok


def test_cli_every_expert_of_a_block_next_equals_renormalise(tmp_path):
    from conftest import make_moe_folder

    folder, model = make_moe_folder(tmp_path)
    E = model.config.num_experts
    args = [a for e in range(E) for a in ("--expert", f"1.{e}")]
    got = {}
    for how in ("next", "renormalise"):
        res = CliRunner().invoke(app, ["ablate", "The cat sat on the mat", "--model",
                                       str(folder), *args, "--route", how, "--json"])
        assert res.exit_code == 0, res.stderr
        data = json.loads(res.stdout)
        assert all(c["ok"] for c in data["checks"])
        got[how] = data["runs"][-1]["logit"]
    assert got["next"] == pytest.approx(got["renormalise"], rel=1e-5, abs=1e-6)


def test_expert_notes_say_what_the_family_does():
    from conftest import build_tiny_moe

    from fptrace.addresses import Expert

    def notes(family, how):
        lm = wrap_model(build_tiny_moe(family), name=f"tiny-{family}", random_weights=True)
        return " ".join(ablate(lm, MOE_IDS, experts=[Expert(1, 0)], route=how).notes)

    assert "renormalised to sum to 1 again, as Mixtral" in notes("mixtral", "renormalise")
    assert "renormalised to sum to 2.5 again" in notes("deepseek_v3", "renormalise")
    assert "does not renormalise" in notes("olmoe", "renormalise")
    assert "took its next choice" in notes("olmoe", "next")


def test_expert_bad_input_is_one_line(tmp_path):
    from conftest import make_llama_folder, make_moe_folder

    folder, _ = make_moe_folder(tmp_path)
    dense = make_llama_folder(tmp_path)
    runner = CliRunner()
    cases = [
        (["--model", str(dense), "--expert", "1.0"], "has no experts"),
        (["--model", str(folder), "--expert", "1.8"], "expert"),
        (["--model", str(folder), "--expert", "5.0"], "block"),
        (["--model", str(folder), "--expert", "1.x"], "--expert"),
        (["--model", str(folder), "--expert", "1.0", "--route", "sideways"], "--route"),
        (["--model", str(folder), "--mlp", "1", "--route", "next"], "--route goes with"),
        (["--model", str(folder), "--expert", "1.0", "--mode", "mean"], "--mode mean"),
    ]
    for args, words in cases:
        res = runner.invoke(app, ["ablate", "The cat sat", *args])
        assert res.exit_code == 2, (args, res.output)
        errors = [x for x in res.stderr.splitlines() if "error" in x or "Traceback" in x]
        assert len(errors) == 1 and errors[0].startswith("fptrace: error:"), (args, res.stderr)
        assert words in errors[0], (args, errors[0])


def test_expert_of_a_dense_block_is_refused():
    """DeepSeek-V3's first block is dense: no router, no expert to remove."""
    from conftest import build_tiny_moe

    from fptrace.addresses import Expert

    lm = wrap_model(build_tiny_moe("deepseek_v3"), name="tiny-deepseek_v3", random_weights=True)
    with pytest.raises(BadInput, match="block 0 of tiny-deepseek_v3 is dense"):
        ablate(lm, MOE_IDS, experts=[Expert(0, 1)])


def test_cli_expert_json(tmp_path):
    from conftest import make_moe_folder

    folder, _ = make_moe_folder(tmp_path)
    res = CliRunner().invoke(app, ["ablate", "The cat sat on the mat", "--model", str(folder),
                                   "--expert", "L1E3", "--expert", "0.2", "--json"])
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert [r["parts"] for r in data["runs"]] == [["L1E3"], ["L0E2"], ["L0E2", "L1E3"]]
    assert [r["experts"] for r in data["runs"]] == [True, True, True]
    assert any(c["target"] == "ablated_experts" and c["ok"] for c in data["checks"])
    res = CliRunner().invoke(app, ["ablate", "The cat sat on the mat", "--model", str(folder),
                                   "--head", "0.1", "--mlp", "1", "--json"])
    assert [r["experts"] for r in json.loads(res.stdout)["runs"]] == [False, False, False]


def test_expert_view_says_how_an_expert_is_removed(tmp_path):
    from conftest import make_moe_folder

    folder, _ = make_moe_folder(tmp_path)
    res = CliRunner().invoke(app, ["ablate", "The cat sat on the mat", "--model", str(folder),
                                   "--expert", "1.3", "--wide"])
    assert res.exit_code == 0, res.stderr
    assert "(an expert: taken out of its router's choice)" in res.stdout
    assert "L1E3" in res.stdout and "✓ what the MoE block output without" in res.stdout
