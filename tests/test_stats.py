"""fptrace stats: the statistics equal a direct computation on every activation stacked in memory
(tiny configs of every family, the bundled model), any split merges into one pass, an injected
massive activation is found where it was put (and none where there is none), the attention-sink
shares equal those of the model's own eager attention weights; resume, Ray-free merging, the
SmoothQuant scales, diff --stats and the refusals."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import make_gpt2_folder, make_llama_folder, tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.stats.collect import Collector
from fptrace.commands.stats.core import new_statistics
from fptrace.core.activation_stats import BINS, ActivationStats
from fptrace.core.hooks import eager_attention
from fptrace.core.inputs import PromptItem
from fptrace.core.prompt_groups import Encoded
from fptrace.errors import UnsupportedModel

runner = CliRunner()
LENGTHS = (1, 5, 9, 3, 12, 7)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def id_prompts(vocab: int, lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def count(lm, prompts: list[list[int]], batch_size: int = 1, sinks: bool = True
          ) -> ActivationStats:
    """fptrace's statistics of token-id prompts, group by group as `collect` merges them."""
    stats = new_statistics(lm, sinks)
    collector = Collector(lm, stats)
    with eager_attention(lm.model) if sinks else contextlib.nullcontext():
        for g in range(0, len(prompts), batch_size):
            group = [Encoded(PromptItem(f"p{g + k}", None, "test"), lm.prepare(ids))
                     for k, ids in enumerate(prompts[g:g + batch_size])]
            stats.merge_(collector.run(group))
    return stats


# ---- the independent computation ------------------------------------------------------------

def linear_names(model, parts) -> set[str]:
    """Every matrix-weighted leaf inside the blocks' attention and MLP, and the LM head."""
    inside = {id(m) for c in list(parts.attns) + list(parts.mlps) for m in c.modules()}
    return {n for n, m in model.named_modules()
            if id(m) in inside and getattr(m, "weight", None) is not None
            and m.weight.dim() == 2 and not list(m.children())} | {"lm_head"}


def recorded(lm, prompts: list[list[int]]) -> dict[str, list[np.ndarray]]:
    """Each prompt run alone (eager attention): the input of every linear layer and each block's
    output, per prompt, as (T, d) float64."""
    model, parts = lm.model, lm.parts
    names = linear_names(model, parts)
    seen: dict[str, list] = {n: [] for n in names}
    blocks = {id(b): i for i, b in enumerate(parts.blocks)}
    seen.update({f"block {i}": [] for i in range(len(parts.blocks))})
    handles = []
    for name, m in model.named_modules():
        if name in names:
            handles.append(m.register_forward_pre_hook(
                lambda mod, args, name=name: seen[name].append(  # (T, d); a router: (N, d)
                    args[0].reshape(-1, args[0].shape[-1]).double().numpy().copy())))
        if id(m) in blocks:
            handles.append(m.register_forward_hook(
                lambda mod, args, out, i=blocks[id(m)]: seen[f"block {i}"].append(
                    (out[0] if isinstance(out, tuple) else out)[0].double().numpy().copy())))
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            for ids in prompts:
                model(torch.tensor([ids]), use_cache=False)  # every position reaches lm_head
    finally:
        model.set_attn_implementation(before)
        for h in handles:
            h.remove()
    return seen


def direct(arrays: list[np.ndarray], prompts: list[list[int]]) -> dict:
    xs = np.concatenate(arrays)  # (M, d), prompt by prompt, position by position
    prompt = np.concatenate([np.full(len(a), p) for p, a in enumerate(arrays)])
    position = np.concatenate([np.arange(len(a)) for a in arrays])
    token = np.concatenate([np.asarray(ids) for ids in prompts])
    a = np.abs(xs)
    amax = a.max(0)
    row = np.argmax(a == amax, axis=0)  # the first (prompt, position) holding it
    cols = np.arange(xs.shape[1])
    binned = np.digitize(a, np.asarray(BINS)) - 1
    hist = np.stack([(binned == k).sum(0) for k in range(len(BINS) - 1)], axis=1)
    return {"count": len(xs), "mean": xs.mean(0), "var": xs.var(0), "absmax": amax,
            "absmax_value": xs[row, cols], "argmax_prompt": prompt[row],
            "argmax_position": position[row], "argmax_token": token[row], "hist": hist}


def assert_site(stats, want: dict, exact: bool = True) -> None:
    assert stats.count == want["count"]
    if exact:
        for k in ("absmax", "absmax_value", "argmax_prompt", "argmax_position", "argmax_token",
                  "hist"):
            np.testing.assert_array_equal(getattr(stats, k), want[k], err_msg=k)
        rtol = 1e-6
    else:  # other padding, other rounding: maxima and moments within float32 rounding
        np.testing.assert_allclose(stats.absmax, want["absmax"], rtol=1e-4, atol=1e-6)
        assert (stats.hist.sum(1) == want["count"]).all()
        rtol = 1e-3
    scale = want["absmax"]
    assert (np.abs(stats.mean - want["mean"]) <= rtol * np.abs(want["mean"]) + 1e-9 * scale).all()
    assert (np.abs(stats.var - want["var"]) <= rtol * want["var"] + 1e-9 * scale ** 2).all()


def check_against_direct(lm, stats: ActivationStats, prompts, exact: bool = True) -> None:
    rec = recorded(lm, prompts)
    covered = set()
    for layer, site in stats.all_sites():
        if site.name == "resid_post":
            arrays = rec[f"block {layer}"]
        else:
            first, *others = site.modules
            arrays = rec[first]
            for m in others:  # modules that share a site read the very same values
                for a, b in zip(arrays, rec[m]):
                    np.testing.assert_array_equal(a, b)
            covered |= set(site.modules)
        assert_site(site.stats, direct(arrays, prompts), exact)
    assert covered == linear_names(lm.model, lm.parts)  # no linear layer left out
    assert stats.prompts == [f"p{i}" for i in range(len(prompts))]
    assert stats.tokens == sum(len(p) for p in prompts)


def _refuses_latent_attention(tiny) -> bool:
    """stats knows two inputs inside attention (attn_in, z); DeepSeek-V3's latent attention has
    more (the Q and K/V latents): it is refused, loudly, naming the layer."""
    if tiny.parts.family.kv_cache_values is None:
        return False
    with pytest.raises(UnsupportedModel, match="kv_b_proj reads a third distinct input"):
        count(tiny, id_prompts(int(tiny.config.vocab_size)))
    return True


def test_statistics_equal_a_direct_computation(tiny):
    if _refuses_latent_attention(tiny):
        return
    prompts = id_prompts(int(tiny.config.vocab_size))
    check_against_direct(tiny, count(tiny, prompts), prompts)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "gpt_neox", "phi3"])
def test_padded_groups_stay_within_rounding(family):
    from conftest import build_tiny

    from fptrace.models.loading import wrap_model

    lm = wrap_model(build_tiny(family), name=family, random_weights=True)
    prompts = id_prompts(int(lm.config.vocab_size))
    check_against_direct(lm, count(lm, prompts, batch_size=4), prompts, exact=False)


def test_bundled_model(smollm):
    """Exact statistics on three real prompts; the massive activations equal those found in the
    stacked hidden states (|x| > 100 and >= 1000 x the median |x| of the prompt's hidden state)."""
    texts = ["The capital of France is", "Water boils at", "Once upon a time there was a king"]
    prompts = [smollm.encode(t) for t in texts]
    stats = count(smollm, prompts)
    check_against_direct(smollm, stats, prompts)
    rec = recorded(smollm, prompts)
    want: dict[tuple[int, int], list] = {}
    for layer in range(len(smollm.parts.blocks)):
        for p, h in enumerate(rec[f"block {layer}"]):
            a = np.abs(h)
            med = np.sort(a.reshape(-1))[(a.size - 1) // 2]  # the lower median
            for t, c in zip(*np.nonzero((a > 100) & (a >= 1000 * med))):
                want.setdefault((layer, int(c)), []).append((p, int(t), float(h[t, c])))
    assert stats.massive.keys() == want.keys()
    for key, hits in want.items():
        tally = stats.massive[key]
        top = min(hits, key=lambda h: (-abs(h[2]), h[0], h[1]))
        assert (tally.count, tally.prompts) == (len(hits), len({h[0] for h in hits}))
        assert tally.positions == Counter(h[1] for h in hits)
        assert (tally.value, tally.prompt, tally.position) == (top[2], top[0], top[1])
    assert min(layer for layer, c in want if c == 507) == 11  # the channel the README shows


# ---- merging --------------------------------------------------------------------------------

def assert_same_stats(a: ActivationStats, b: ActivationStats) -> None:
    assert a.prompts == b.prompts and a.tokens == b.tokens
    sa, sb = list(a.all_sites()), list(b.all_sites())
    assert [(l, s.name, s.modules) for l, s in sa] == [(l, s.name, s.modules) for l, s in sb]
    for (_, x), (_, y) in zip(sa, sb):
        for k in ("absmax", "absmax_value", "argmax_prompt", "argmax_position", "argmax_token",
                  "hist"):
            np.testing.assert_array_equal(getattr(x.stats, k), getattr(y.stats, k), err_msg=k)
        np.testing.assert_allclose(x.stats.mean, y.stats.mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(x.stats.var, y.stats.var, rtol=1e-9, atol=1e-15)
    assert a.massive.keys() == b.massive.keys()
    for k in a.massive:
        assert a.massive[k] == b.massive[k]
    np.testing.assert_allclose(a.sink_sums, b.sink_sums, rtol=1e-12)
    assert a.sink_queries == b.sink_queries and a.position_tokens == b.position_tokens


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3"])
def test_any_split_merges_into_one_pass(family):
    from conftest import build_tiny

    from fptrace.models.loading import wrap_model

    lm = wrap_model(build_tiny(family), name=family, random_weights=True)
    prompts = id_prompts(int(lm.config.vocab_size), lengths=(4, 1, 6, 2, 5, 3, 7, 2))
    whole = count(lm, prompts)
    rng = np.random.default_rng(0)
    for _ in range(4):
        cuts = sorted(rng.choice(np.arange(1, len(prompts)), rng.integers(1, 4), replace=False))
        bounds = [0, *cuts, len(prompts)]
        shards = []
        for a, b in zip(bounds, bounds[1:]):
            s = count(lm, prompts[a:b])
            s.prompts = [f"p{a + i}" for i in range(b - a)]  # ids as in the whole run
            shards.append(s)
        while len(shards) > 1:  # merge neighbours in any order: the tree does not matter
            i = int(rng.integers(0, len(shards) - 1))
            shards[i:i + 2] = [shards[i].merge_(shards[i + 1])]
        assert_same_stats(shards[0], whole)


# ---- massive activations --------------------------------------------------------------------

CHANNEL, FROM_LAYER, MARK = 5, 2, 11


def inject(folder) -> None:
    """A tiny GPT-2 whose channel CHANNEL explodes at position 0 from block FROM_LAYER on: a mark
    in the position-0 embedding (channel MARK, 30: not massive) switches on one unit of that
    block's MLP, which needs the normalised mark above 4 (no other position comes near: its GELU
    is ~0 there) and writes ~16,000 into CHANNEL; the residual stream carries it on."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder)
    with torch.no_grad():
        model.transformer.wpe.weight[0, MARK] = 30.0
        mlp = model.transformer.h[FROM_LAYER].mlp
        unit = 0
        mlp.c_fc.weight[:, unit] = 0.0  # Conv1D: (in, out)
        mlp.c_fc.weight[MARK, unit] = 10.0
        mlp.c_fc.bias[unit] = -40.0
        mlp.c_proj.weight[unit, :] = 0.0
        mlp.c_proj.weight[unit, CHANNEL] = 1000.0
    model.save_pretrained(folder)


def test_an_injected_massive_activation_is_found_where_it_was_put(tmp_path):
    folder, _ = make_gpt2_folder(tmp_path, n_layer=4)
    src = tmp_path / "p.txt"
    src.write_text("The cat sat on the mat\nA dog\nPeople from Kenya are called\nHi\n")
    plain = json.loads(invoke("stats", src, "-m", folder, "--json").stdout)
    assert plain["massive"] == []  # none in the untouched model
    inject(folder)
    r = invoke("stats", src, "-m", folder, "--json")
    assert r.exit_code == 0, r.stderr
    massive = json.loads(r.stdout)["massive"]
    assert len(massive) == 1
    m = massive[0]
    assert m["channel"] == CHANNEL and m["layers"] == [2, 3] and m["position"] == 0
    assert [p["value"] for p in m["positions"]] == [0] and m["positions"][0]["share"] == 1.0
    assert m["count"] == 4 * 2 and m["prompt_share"] == 1.0  # 4 prompts × 2 layers
    assert m["ratio"] >= 1000 and abs(m["value"]) > 100
    view = invoke("stats", src, "-m", folder).stdout
    assert "2–3" in view and "Massive activations" in view


# ---- attention sinks ------------------------------------------------------------------------

def sink_shares(lm, prompts) -> np.ndarray:
    """From the model's own eager attention weights (output_attentions), each prompt alone:
    (layers, heads, P) the share of attention from positions i > j landing on position j (over
    every query after j: docs/stats.md's definition)."""
    model = lm.model
    P = 16
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    sums, queries = None, np.zeros(P)
    try:
        with torch.no_grad():
            for ids in prompts:
                att = model(torch.tensor([ids]), output_attentions=True).attentions
                w = torch.stack([a[0] for a in att]).double()  # (L, H, T, T)
                T = w.shape[-1]
                s = torch.zeros(w.shape[0], w.shape[1], P, dtype=torch.float64)
                for j in range(min(P, T)):
                    s[:, :, j] = w[:, :, j + 1:, j].sum(-1)
                sums = s if sums is None else sums + s
                queries += np.maximum(T - 1 - np.arange(P), 0)
    finally:
        model.set_attn_implementation(before)
    return sums.numpy() / np.maximum(queries, 1)[None, None, :]


def test_sink_shares_equal_the_models_own_attention_weights(tiny):
    if _refuses_latent_attention(tiny):
        return
    prompts = id_prompts(int(tiny.config.vocab_size), lengths=(6, 1, 17, 4, 9, 20, 2))
    stats = count(tiny, prompts, batch_size=3)  # padded groups: the padding is skipped
    from fptrace.commands.stats.findings import queries_after, sink_heads

    shares = sink_shares(tiny, prompts)
    np.testing.assert_allclose(stats.sink_sums / queries_after(stats)[None, None, :], shares,
                               rtol=1e-5, atol=1e-7)
    for h in sink_heads(stats, 0.3):  # the table's share and position: the model's own
        assert h.position == int(shares[h.layer, h.head].argmax())
        assert h.mass == pytest.approx(shares[h.layer, h.head, h.position], rel=1e-5, abs=1e-7)


def test_sink_heads_name_the_most_attended_position(tmp_path):
    folder = make_llama_folder(tmp_path)
    src = tmp_path / "p.txt"
    src.write_text("The cat sat on the mat\nThe dog ran far away\nThe sky\n")
    r = invoke("stats", src, "-m", folder, "--json", "--sink-threshold", "0")
    heads = json.loads(r.stdout)["sink_heads"]
    assert len(heads) == 2 * 4 and all(h["sink"] for h in heads)  # threshold 0: every head
    stats = json.loads(r.stdout)["statistics"]
    for h in heads:
        sums = stats["layers"][h["layer"]]["sink_sums"][h["head"]]
        assert h["position"] == int(np.argmax(sums))
        assert math.isclose(h["mass"], max(sums) / stats["sink_queries"], rel_tol=1e-12)
        if h["position"] == 0:
            assert h["text"] == "The" and h["token_share"] == 1.0


# ---- the command: files, resume, merge, refusals --------------------------------------------

@pytest.fixture(scope="module")
def gpt2_folder():
    return tiny_gpt2()


def statistics_of(path) -> ActivationStats:
    return ActivationStats.from_dict(json.loads(open(path, encoding="utf-8").read())["statistics"])


def test_out_resume_force_and_merge_equal_one_pass(tmp_path, gpt2_folder):
    a, b, both = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "both.txt"
    a.write_text("The cat sat\nOne two three four\n")
    b.write_text("A dog\nThe sky is blue today\nHi\n")
    both.write_text(a.read_text() + b.read_text())
    m = ("-m", gpt2_folder, "-b", "1")
    one = tmp_path / "one.json"
    assert invoke("stats", both, *m, "--out", one).exit_code == 0
    # resume: the first two prompts counted (ids both:1, both:2), then the rest
    first = tmp_path / "first" / "both.txt"
    first.parent.mkdir()
    first.write_text(a.read_text())
    part = tmp_path / "part.json"
    assert invoke("stats", first, *m, "--out", part).exit_code == 0
    r = invoke("stats", both, *m, "--out", part)
    assert r.exit_code == 2 and "--resume" in r.stderr and "--force" in r.stderr
    r = invoke("stats", both, *m, "--out", part, "--resume")
    assert r.exit_code == 0 and "counted 3, failed 0, skipped 2" in r.stderr
    assert_same_stats(statistics_of(part), statistics_of(one))
    # --merge of two files: what one pass over both gives
    sa, sb, merged = tmp_path / "sa.json", tmp_path / "sb.json", tmp_path / "merged.json"
    assert invoke("stats", a, *m, "--out", sa).exit_code == 0
    assert invoke("stats", b, *m, "--out", sb).exit_code == 0
    r = invoke("stats", "--merge", sa, sb, "--out", merged)
    assert r.exit_code == 0, r.stderr
    want = statistics_of(one)
    got = statistics_of(merged)
    want.prompts = got.prompts  # the ids name their files: a:1 ... against both:1 ...
    assert_same_stats(got, want)
    # --force starts over
    r = invoke("stats", a, *m, "--out", part, "--force")
    assert r.exit_code == 0 and len(statistics_of(part).prompts) == 2


def test_json_follows_the_schema_and_the_figure_plots_the_result(tmp_path, gpt2_folder):
    import jsonschema

    src = tmp_path / "p.txt"
    src.write_text("The cat sat on the mat\nHello\n")
    schema = json.loads(invoke("schema").stdout)
    data = json.loads(invoke("stats", src, "-m", gpt2_folder, "--json", "--plot",
                             tmp_path / "s.png").stdout)
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(data))
    assert not errors, [e.message[:200] for e in errors[:3]]
    assert data["kind"] == "stats" and data["prompts"] == 2 and (tmp_path / "s.png").exists()
    from fptrace.commands.stats.render import stats_figure
    from fptrace.commands.stats.result import Stats

    stats = statistics_of_doc(data)
    result = _result(stats, data)
    _, series = stats_figure(result)
    for layer, row in enumerate(series["absmax"]):
        np.testing.assert_array_equal(row, stats.layers[layer]["resid_post"].stats.absmax)
    assert isinstance(result, Stats)


def statistics_of_doc(doc) -> ActivationStats:
    return ActivationStats.from_dict(doc["statistics"])


def _result(stats, doc):
    from fptrace.commands.stats.core import build, model_of

    return build(stats, model_of(doc))


def test_save_scales_match_smoothquants_act_scales(tmp_path):
    """Keys and values of what SmoothQuant's get_act_scales computes (written here afresh: a
    forward hook on every nn.Linear, the per-channel max of |input| over all positions)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    folder = make_llama_folder(tmp_path)
    src = tmp_path / "p.txt"
    texts = ["The cat sat on the mat", "A dog", "The capital of France is Paris"]
    src.write_text("\n".join(texts) + "\n")
    out = tmp_path / "act_scales.safetensors"
    r = invoke("stats", src, "-m", folder, "--save-scales", out, "-b", "1")
    assert r.exit_code == 0, r.stderr
    got = load_file(out)

    from fptrace.models.loading import load_model

    lm = load_model(str(folder), device="cpu")
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    scales: dict[str, torch.Tensor] = {}

    def hook(m, x, y, name):
        t = x[0].reshape(-1, x[0].shape[-1]).abs().detach()
        cur = t.max(0).values.float()
        scales[name] = cur if name not in scales else torch.maximum(scales[name], cur)

    hs = [m.register_forward_hook(lambda m, x, y, name=name: hook(m, x, y, name))
          for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for t in texts:
            model(torch.tensor([lm.encode(t)]))
    for h in hs:
        h.remove()
    assert set(got) == set(scales)
    assert "model.layers.0.self_attn.q_proj" in got and "lm_head" in got
    for k in scales:
        torch.testing.assert_close(got[k], scales[k], rtol=0, atol=0, msg=k)


def test_prompts_longer_than_the_context_are_listed(tmp_path, gpt2_folder):
    src = tmp_path / "p.txt"
    src.write_text("The cat sat\n" + "word " * 60 + "\nHello\n")
    r = invoke("stats", src, "-m", gpt2_folder, "--json")
    assert r.exit_code == 1  # some prompts were not counted
    data = json.loads(r.stdout)
    assert data["prompts"] == 2 and data["failed"] == 1
    failed = data["statistics"]["failed"][0]
    assert failed["id"] == "p:2" and "32" in failed["error"]
    r = invoke("stats", src, "-m", gpt2_folder, "--json", "--truncate")
    assert r.exit_code == 0 and json.loads(r.stdout)["prompts"] == 3


def test_prompts_go_in_as_the_model_takes_them(tmp_path):
    """A .jsonl line with "messages" goes through the model's chat template, a text line gets
    the tokenizer's begin-of-text token: the statistics are those of the ids transformers'
    tokenizer gives for them."""
    import tokenizer_fixtures
    from transformers import AutoTokenizer

    from fptrace.commands.stats.core import collect
    from fptrace.core.inputs import read_inputs
    from fptrace.models.loading import load_model

    folder = tokenizer_fixtures.BUILDERS["llama3"](tmp_path / "llama3")
    lm = load_model(str(folder), device="cpu")
    messages = [{"role": "user", "content": "The cat sat"}]
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "chat", "messages": messages}) + "\n"
                   + json.dumps({"id": "text", "prompt": "The cat sat"}) + "\n")
    got = new_statistics(lm)
    s = collect(lm, read_inputs([str(src)]), got, batch_size=2)
    assert (s.traced, s.failed) == (2, 0)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = [list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]),
           tok("The cat sat")["input_ids"]]
    assert ids[1][0] == tok.bos_token_id and len(ids[0]) > len(ids[1])
    want = count(lm, ids, batch_size=2)
    want.prompts = ["chat", "text"]
    assert_same_stats(got, want)


def test_refusals(tmp_path, gpt2_folder):
    src = tmp_path / "p.txt"
    src.write_text("The cat sat\n")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert invoke("stats", src, "-m", gpt2_folder, "--out", a).exit_code == 0
    other = make_gpt2_folder(tmp_path / "other", n_layer=3)[0]
    assert invoke("stats", src, "-m", other, "--out", b).exit_code == 0
    r = invoke("stats", "--merge", a, b)
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert str(a) in line and str(b) in line and "model" in line
    newer = json.loads(a.read_text())
    newer["schema_version"] = "1.99"
    (tmp_path / "newer.json").write_text(json.dumps(newer))
    r = invoke("stats", "--merge", tmp_path / "newer.json")
    assert r.exit_code == 2 and "1.99" in r.stderr and "upgrade" in r.stderr
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}')
    for args in (("--out", mine), ("--out", mine, "--force"), ("--out", mine, "--resume")):
        r = invoke("stats", src, "-m", gpt2_folder, *args)
        assert r.exit_code == 2 and "not an fptrace statistics file" in r.stderr
    assert mine.read_text() == '{"my": "notes"}'
    r = invoke("stats", src, "-m", gpt2_folder, "--out", a, "--resume", "--random-weights")
    assert r.exit_code == 2 and "random weights" in r.stderr
    r = invoke("stats", src, "-m", gpt2_folder, "--save-scales", tmp_path / "s.pt")
    assert r.exit_code == 2 and ".safetensors" in r.stderr
    r = invoke("stats", "--merge", a, a)
    assert r.exit_code == 2 and "twice" in r.stderr


@pytest.mark.system
def test_killed_run_resumes_to_what_one_pass_gives(tmp_path, gpt2_folder):
    """A real process, killed with SIGKILL after a checkpoint, then resumed."""
    n = 120
    src = tmp_path / "many.txt"
    src.write_text("".join(f"Prompt number {i} about a cat\n" for i in range(n)))
    out, one = tmp_path / "o.json", tmp_path / "one.json"
    cmd = [sys.executable, "-m", "fptrace", "stats", str(src), "-m", gpt2_folder, "-b", "1",
           "--checkpoint", "0", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and len(statistics_of(out).prompts) >= 10:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = len(statistics_of(out).prompts)
    assert 10 <= kept < n
    done = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"skipped {kept}" in done.stderr
    # the one pass in a process like the others: a worker of the suite may hold other torch
    # settings (once, one absmax came out one float32 unit apart in-process), while the same
    # command gives the same arithmetic, so the comparison stays exact
    whole = [*cmd[:cmd.index("--out")], "--out", str(one)]
    done = subprocess.run(whole, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert_same_stats(statistics_of(out), statistics_of(one))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupt_during_the_hand_over_waits_for_its_end(sig):
    """A signal that lands while a group's results are handed on (statistics merged, records
    written) is held until the hand-over ends: the group goes whole (a SIGTERM inside the
    merge once wrote statistics whose channels named a prompt the file did not hold), and the
    loop stops there."""
    from types import SimpleNamespace

    from fptrace.core.inputs import PromptItem
    from fptrace.core.prompt_groups import Summary, run_groups, sigterm_interrupts

    lm = SimpleNamespace(prepare=lambda prompt, truncate: SimpleNamespace(ids=[1, 2]))
    items = [PromptItem(id=str(i), prompt=f"p{i}", source=f"f:{i}") for i in range(4)]
    handed: list[tuple[str, str]] = []

    def emit(chunk, results, failures):
        handed.append(("start", chunk[0].id))
        os.kill(os.getpid(), sig)
        handed.append(("end", chunk[0].id))

    summary = Summary()
    # Ctrl-C as a terminal gives it: a suite started in the background (`make test &`) has
    # SIGINT ignored, and fptrace rightly leaves an ignored SIGINT alone
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with sigterm_interrupts():
            run_groups(lm, items, lambda group: len(group), emit, summary=summary,
                       batch_size=2, truncate=False)
    finally:
        signal.signal(signal.SIGINT, before)
    assert handed == [("start", "0"), ("end", "0")]
    assert summary.interrupted and summary.traced == 2


@pytest.mark.system
def test_sigterm_writes_what_was_counted(tmp_path, gpt2_folder):
    src = tmp_path / "many.txt"
    src.write_text("".join(f"Prompt {i}\n" for i in range(400)))
    out = tmp_path / "o.json"
    proc = subprocess.Popen([sys.executable, "-m", "fptrace", "stats", str(src), "-m",
                             gpt2_folder, "-b", "1", "--checkpoint", "0", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not out.exists():
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "--resume" in err, err[-2000:]
    assert 0 < len(statistics_of(out).prompts) < 400


def test_diff_stats_names_the_channels_that_moved(tmp_path, gpt2_folder):
    src = tmp_path / "p.txt"
    src.write_text("The cat sat on the mat\nA dog ran\n")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert invoke("stats", src, "-m", gpt2_folder, "--out", a).exit_code == 0
    assert invoke("stats", src, "-m", gpt2_folder, "--out", b, "--random-weights",
                  "--seed", "1").exit_code == 0
    r = invoke("diff", "--stats", a, b, "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["kind"] == "stats_diff" and d["channels"]
    sa, sb = statistics_of(a), statistics_of(b)
    top = d["channels"][0]
    site = "final_norm" if top["layer"] is None else top["site"]
    x = (sa.final if top["layer"] is None else sa.layers[top["layer"]][site]).stats
    y = (sb.final if top["layer"] is None else sb.layers[top["layer"]][site]).stats
    c = top["channel"]
    assert math.isclose(top["absmax_a"], x.absmax[c]) and math.isclose(top["absmax_b"],
                                                                          y.absmax[c])
    view = invoke("diff", "--stats", a, b).stdout
    assert "moved most" in view
    r = invoke("diff", "--stats", a)
    assert r.exit_code == 2
    r = invoke("diff", "--stats", a, b, "--deep")
    assert r.exit_code == 2 and "--deep" in r.stderr
    r = invoke("diff", "--stats", a, tmp_path / "nope.json")
    assert r.exit_code == 2 and f"no such file: {tmp_path / 'nope.json'}" in r.stderr


def test_an_activation_changed_in_place_is_refused_not_counted():
    """A model that scales an input in place after one projection read it: what that layer read
    is no longer there to count, so the pass fails loudly instead of counting other values."""
    from conftest import build_tiny

    from fptrace.errors import Mismatch
    from fptrace.models.loading import wrap_model

    lm = wrap_model(build_tiny("llama"), name="llama", random_weights=True)
    q = lm.parts.attns[1].q_proj
    handle = q.register_forward_hook(lambda mod, args, out: args[0].mul_(2.0))
    try:
        with pytest.raises(Mismatch, match="block 1's attn_in in place"):
            count(lm, id_prompts(int(lm.config.vocab_size), lengths=(4,)))
    finally:
        handle.remove()


# ---- mixture of experts: expert load --------------------------------------------------------

def _own_routing(model, prompts):
    """Per MoE block, from the model itself, one prompt at a time (no padding): the experts
    its router handed the experts module (a pre-hook on that module), counted; and the
    router's entropy from the logits transformers returns with output_router_logits."""
    moe = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]
    sigmoid = model.config.model_type == "deepseek_v3"
    E = model.model.layers[moe[0]].mlp.experts.num_experts
    load = {i: np.zeros(E, dtype=np.int64) for i in moe}
    entropy = {i: 0.0 for i in moe}
    hooks = []
    for i in moe:
        def pre(module, args, i=i):
            np.add.at(load[i], args[1].flatten().numpy(), 1)
        hooks.append(model.model.layers[i].mlp.experts.register_forward_pre_hook(pre))
    try:
        for ids in prompts:
            with torch.no_grad():
                out = model(torch.tensor([ids]), output_router_logits=True, use_cache=False)
            for i, logits in zip(moe, out.router_logits):
                p = logits.double().sigmoid() if sigmoid else logits.double().softmax(-1)
                p = p / p.sum(-1, keepdim=True)
                entropy[i] += float(-(p * p.log()).sum())
    finally:
        for h in hooks:
            h.remove()
    return moe, load, entropy


# (DeepSeek-V3's latent attention has a third input stats does not know: it is refused)
@pytest.mark.parametrize("family", ["gpt_oss", "mixtral", "olmoe", "qwen2_moe", "qwen3_moe"])
def test_expert_load_is_a_count_of_the_routers_own_choices(family):
    """Padded groups of prompts: each MoE block's load per expert equals the count of the
    router's own choices at the real positions, its entropy sum the router's (padded and
    unpadded float32 logits round apart: 1e-6); any split merges into what one pass gives
    (counts equal, entropy sums to 1e-12)."""
    from conftest import build_tiny_moe

    from fptrace.commands.stats.findings import expert_loads
    from fptrace.models.loading import wrap_model

    model = build_tiny_moe(family)
    lm = wrap_model(model, name=family, random_weights=True)
    prompts = id_prompts(int(lm.config.vocab_size), lengths=(4, 1, 6, 2, 5, 3, 7, 2))
    whole = count(lm, prompts, batch_size=3, sinks=False)
    blocks, load, entropy = _own_routing(model, prompts)
    assert whole.moe_blocks == tuple(blocks)
    for j, i in enumerate(blocks):
        np.testing.assert_array_equal(whole.expert_load[j], load[i])
        assert whole.route_positions[j] == sum(len(p) for p in prompts)
        assert whole.route_entropy[j] == pytest.approx(entropy[i], rel=1e-6)
    found = expert_loads(whole)
    for e, i in zip(found, blocks):
        want = load[i]
        assert e.layer == i and e.load == tuple(want.tolist())
        assert e.never_chosen == tuple(np.flatnonzero(want == 0).tolist())
        assert e.max_over_mean == pytest.approx(want.max() / want.mean())
        assert e.cv == pytest.approx(want.std() / want.mean())
        assert e.entropy == pytest.approx(entropy[i] / sum(len(p) for p in prompts), rel=1e-6)
    # the same groups as the whole pass (the same padding, so the same float32 logits)
    halves = [count(lm, prompts[:3], batch_size=3, sinks=False),
              count(lm, prompts[3:], batch_size=3, sinks=False)]
    halves[1].prompts = [f"p{3 + k}" for k in range(len(prompts) - 3)]
    back = ActivationStats.from_dict(json.loads(json.dumps(
        _plain(halves[0].merge_(halves[1]).to_record()))))
    np.testing.assert_array_equal(back.expert_load, whole.expert_load)
    np.testing.assert_array_equal(back.route_positions, whole.route_positions)
    np.testing.assert_allclose(back.route_entropy, whole.route_entropy, rtol=1e-12)


def _plain(record):
    from fptrace.render.json import to_dict

    return to_dict(record)


def test_cli_expert_load_and_merge(tmp_path):
    """`stats` on an MoE folder shows the expert load; `--merge` of two halves gives the
    figures of one run over all the prompts."""
    from conftest import make_moe_folder

    folder, _ = make_moe_folder(tmp_path)
    a, b, both = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "both.txt"
    a.write_text("The cat sat\nOne two three four\n")
    b.write_text("A dog\nThe sky is blue today\nHi\n")
    both.write_text(a.read_text() + b.read_text())
    m = ("-m", folder, "--no-sinks", "-b", "1")  # one prompt a pass: the same float32 logits
    r = invoke("stats", both, *m)
    assert r.exit_code == 0, r.stderr
    assert "Expert load: positions per expert of 8" in r.stdout
    one = json.loads(invoke("stats", both, *m, "--json").stdout)
    sa, sb = tmp_path / "sa.json", tmp_path / "sb.json"
    assert invoke("stats", a, *m, "--out", sa).exit_code == 0
    assert invoke("stats", b, *m, "--out", sb).exit_code == 0
    merged = json.loads(invoke("stats", "--merge", sa, sb, "--json").stdout)
    assert len(one["experts"]) == 2
    for x, y in zip(merged["experts"], one["experts"]):
        assert x["load"] == y["load"] and x["positions"] == y["positions"] == one["tokens"]
        assert x["never_chosen"] == y["never_chosen"]
        assert x["entropy"] == pytest.approx(y["entropy"], rel=1e-12)
        assert sum(x["load"]) == 2 * x["positions"]
    dense = json.loads(invoke("stats", a, "-m", make_llama_folder(tmp_path), "--json").stdout)
    assert dense["experts"] == [] and dense["statistics"]["routing"] == []
