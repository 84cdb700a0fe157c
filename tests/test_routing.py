"""The routing engine against what the model itself computes, on every MoE family's tiny config,
for every block and position: the experts and weights the MoE block hands its experts (a hook
on the experts module's input, not fptrace's), and the router logits transformers returns with
`output_router_logits=True`, from which the mass and entropy are recomputed here."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import build_tiny, build_tiny_moe, make_moe_folder

from fptrace.core.trace import run_trace, run_traces
from fptrace.families import FAMILIES
from fptrace.models.loading import wrap_model

MOE = sorted(f.name for f in FAMILIES if f.moe is not None)


def _model(name):
    return build_tiny_moe(name, seed=1)


def _own(model, ids):
    """The experts module's inputs (what the model multiplies by), per MoE block, and the router
    logits transformers returns."""
    seen = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        experts = getattr(layer.mlp, "experts", None)
        if experts is None:
            continue

        def pre(module, args, kwargs, i=i):
            idx = args[1] if len(args) > 1 else next(iter(
                v for k, v in kwargs.items() if "ind" in k))
            w = args[2] if len(args) > 2 else next(iter(
                v for k, v in kwargs.items() if "weight" in k))
            seen[i] = (idx.clone(), w.float().clone())
        hooks.append(experts.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_router_logits=True, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return seen, out.router_logits


def _distribution(logits, scoring):
    if scoring == "sigmoid":
        s = logits.float().sigmoid()
        return s / s.sum(-1, keepdim=True)
    return logits.float().softmax(-1)


@pytest.mark.parametrize("name", MOE)
def test_routing_is_the_models_own(name):
    model = _model(name)
    lm = wrap_model(model, name=f"tiny-{name}", random_weights=True)
    ids = [5, 17, 3, 99, 250, 7, 41]
    r = run_trace(lm, ids).routing
    seen, router_logits = _own(model, ids)
    assert r.checked and r.mismatched == 0, (r.mismatched, r.max_weight_error)
    assert [b.layer for b in r.blocks] == sorted(seen)
    assert len(router_logits) == len(r.blocks)
    for block, logits in zip(r.blocks, router_logits):
        idx, w = seen[block.layer]
        p = _distribution(logits, r.scoring)
        assert len(block.experts) == len(block.weights) == len(block.mass) \
            == len(block.entropy) == len(ids)
        for t in range(len(ids)):
            want = dict(zip(idx[t].tolist(), w[t].tolist()))
            got = dict(zip(block.experts[t], block.weights[t]))
            assert set(got) == set(want), (block.layer, t)
            for e in want:
                assert got[e] == pytest.approx(want[e], rel=1e-5, abs=1e-6)
            assert list(block.weights[t]) == sorted(block.weights[t], reverse=True)
            assert block.mass[t] == pytest.approx(float(p[t, list(want)].sum()), rel=1e-5)
            ent = float(-(p[t] * p[t].log()).sum())
            assert block.entropy[t] == pytest.approx(ent, rel=1e-5, abs=1e-6)


def test_deepseek_grouped_choice_and_bias_matter():
    """The DeepSeek-V3 rule is the grouped one with the bias: without groups or without the
    bias the same logits choose differently somewhere (so the check above tests both)."""
    from fptrace.core.routing import capture_routing, route

    model = _model("deepseek_v3")
    lm = wrap_model(model, name="tiny-deepseek_v3", random_weights=True)
    ids = list(range(3, 40))
    with torch.no_grad(), capture_routing(lm.parts, lm.config) as cap:
        model(torch.tensor([ids]), use_cache=False)
    moe = lm.parts.family.moe(lm.config)
    i = cap.blocks[0]
    own = cap.indices[i].sort(-1).values
    assert torch.equal(route(cap.logits[i], moe, cap.biases[i])[0].sort(-1).values, own)
    no_bias = route(cap.logits[i], moe, None)[0].sort(-1).values
    no_groups = route(cap.logits[i], dataclasses.replace(moe, n_groups=1), cap.biases[i])[0]
    assert not torch.equal(no_bias, own)
    assert not torch.equal(no_groups.sort(-1).values, own)


def test_a_wrong_rule_is_caught(monkeypatch):
    """The check is live: a family that claimed no renormalisation would fail it."""
    model = _model("mixtral")
    lm = wrap_model(model, name="tiny-mixtral", random_weights=True)
    fam = lm.parts.family
    wrong = dataclasses.replace(fam, moe=lambda cfg: dataclasses.replace(
        fam.moe(cfg), renormalise=False))
    parts = dataclasses.replace(lm.parts, family=wrong)
    monkeypatch.setattr(lm, "parts", parts)
    r = run_trace(lm, [5, 17, 3, 99]).routing
    assert not r.checked and r.max_weight_error > 0.1


def test_batch_rows_equal_single_prompts():
    """Left-padded rows: each row's routing is that prompt's alone."""
    model = _model("qwen2_moe")
    lm = wrap_model(model, name="tiny-qwen2_moe", random_weights=True)
    a, b = [5, 17, 3, 99, 250, 7], [8, 9]
    both = run_traces(lm, [a, b])
    for prompt, trace in zip((a, b), both):
        alone = run_trace(lm, prompt).routing
        for x, y in zip(trace.routing.blocks, alone.blocks):
            assert x.experts == y.experts
            for p, q in zip(x.weights, y.weights):
                assert p == pytest.approx(q, abs=1e-5)


def test_dense_model_has_no_routing():
    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    t = run_trace(lm, [1, 2, 3])
    assert t.routing is None and t.model.moe is None


def _moe_folder(tmp_path, name="qwen3_moe"):
    return make_moe_folder(tmp_path, name)


def test_cli_run_header_table_and_json(tmp_path):
    """`run` on an MoE folder: the MoE header line, the routing table (the last position of
    every MoE block), and the JSON's routing for every block and position, equal to what the
    model's router returns (output_router_logits, its own top-k)."""
    import json

    from typer.testing import CliRunner

    from fptrace.cli.main import app

    folder, model = _moe_folder(tmp_path)
    runner = CliRunner()
    res = runner.invoke(app, ["run", "The cat sat on the mat", "--model", str(folder),
                              "--json"])
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["model"]["moe"] == "8 experts, 2 active, d_expert 32"
    ids = [t["id"] for t in data["tokens"]]
    r = data["routing"]
    assert r["checked"] and [b["layer"] for b in r["blocks"]] == [0, 1]
    with torch.no_grad():
        logits = model(torch.tensor([ids]), output_router_logits=True).router_logits
    for block, lg in zip(r["blocks"], logits):
        assert len(block["experts"]) == len(ids)
        w, idx = lg.float().softmax(-1).topk(2, dim=-1)  # Qwen3-MoE's rule, written here
        w = w / w.sum(-1, keepdim=True)  # norm_topk_prob
        for t in range(len(ids)):
            assert block["experts"][t] == idx[t].tolist()
            assert block["weights"][t] == pytest.approx(w[t].tolist(), abs=1e-6)
    table = runner.invoke(app, ["run", "The cat sat on the mat", "--model", str(folder)])
    assert table.exit_code == 0, table.stderr
    assert "MoE      8 experts, 2 active, d_expert 32" in table.stdout
    assert "d_mlp" not in table.stdout.split("MoE")[0].splitlines()[-2]
    assert "Routing at the last position (5)" in table.stdout
    last = r["blocks"][1]
    assert f"{last['experts'][-1][0]} ({last['weights'][-1][0]:.3f})" in table.stdout


def test_dense_json_has_null_routing(tmp_path):
    import json

    from conftest import make_llama_folder
    from typer.testing import CliRunner

    from fptrace.cli.main import app

    res = CliRunner().invoke(app, ["run", "The cat", "--model", str(make_llama_folder(tmp_path)),
                                   "--json"])
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["routing"] is None and data["model"]["moe"] is None
    assert "d_mlp" in CliRunner().invoke(app, ["run", "The cat", "--model",
                                               str(tmp_path / "tiny-llama-4h")]).stdout


def test_all_positions_grid_shows_each_blocks_top1(tmp_path):
    """`run --all-positions` on an MoE model: a blocks × positions grid of the top-1 expert,
    the first expert of each position's routing in the JSON."""
    import json

    from typer.testing import CliRunner

    from fptrace.cli.main import app

    folder, _ = _moe_folder(tmp_path)
    runner = CliRunner()
    args = ["run", "The cat sat on the mat", "--model", str(folder), "--all-positions"]
    data = json.loads(runner.invoke(app, args + ["--json"]).stdout)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.stderr
    grid = res.stdout.split("Top-1 expert per block and position")[1].split("Predictions")[0]
    rows = [line.split() for line in grid.splitlines()
            if line.strip() and line.split()[0].isdecimal() and len(line.split()) > 2]
    blocks = data["routing"]["blocks"]
    rows = rows[-len(blocks):]  # below the header (position numbers, token texts)
    for block, row in zip(blocks, rows):
        assert row[0] == str(block["layer"])
        assert [int(x) for x in row[1:]] == [e[0] for e in block["experts"]]


def test_report_shows_the_routing_table_and_grid(tmp_path):
    """`fptrace report` on an MoE model: the run section has the routing table and the
    blocks × positions grid of the top-1 expert, each block's row the router's first choice at
    every position (the trace's JSON, checked against the router above)."""
    import html
    import json

    from typer.testing import CliRunner

    from fptrace.cli.main import app

    folder, _ = _moe_folder(tmp_path)
    runner = CliRunner()
    prompt = "The cat sat on the mat"
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", prompt, "--model", str(folder), "-o", str(out)])
    assert res.exit_code == 0, res.stderr
    import re

    page = " ".join(re.sub("<[^>]+>", " ", html.unescape(out.read_text(encoding="utf-8"))
                           ).split())
    assert "Routing at the last position (5)" in page
    grid = page.split("Top-1 expert per block and position (all 6 positions)")[1][:400]
    data = json.loads(runner.invoke(app, ["run", prompt, "--model", str(folder), "--json"]
                                    ).stdout)
    for block in data["routing"]["blocks"]:
        row = f"{block['layer']} " + " ".join(str(e[0]) for e in block["experts"])
        assert row in grid, row


def test_batch_records_carry_the_routing_of_each_prompt(tmp_path):
    """`fptrace batch` on an MoE model: every record's routing is that prompt's own, as `run`
    gives it alone (rows are padded together in one group)."""
    import json

    from typer.testing import CliRunner

    from fptrace.cli.main import app

    folder, _ = _moe_folder(tmp_path)
    src = tmp_path / "p.txt"
    prompts = ["The cat sat", "A dog ran far away from home", "Hi"]
    src.write_text("\n".join(prompts) + "\n")
    out = tmp_path / "out.jsonl"
    runner = CliRunner()
    res = runner.invoke(app, ["batch", str(src), "--model", str(folder), "--out", str(out)])
    assert res.exit_code == 0, res.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3
    for prompt, rec in zip(prompts, records):
        alone = json.loads(runner.invoke(app, ["run", prompt, "--model", str(folder), "--json"]
                                         ).stdout)["routing"]
        got = rec["routing"]
        assert got["checked"] and got["n_experts"] == 8
        for x, y in zip(got["blocks"], alone["blocks"]):
            assert x["layer"] == y["layer"] and x["experts"] == y["experts"]
            for p, q in zip(x["weights"], y["weights"]):
                assert p == pytest.approx(q, abs=1e-5)
