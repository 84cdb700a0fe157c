"""`fptrace graph --transcoders` against circuit-tracer 0.5.0, side by side (issue 43).

    python benchmarks/bench_circuit_tracer.py [--tokens 16] [--latents 2048] [--active 12]
        [--transcoders DIR] [--ct-python /work/ct-venv/bin/python] [--ct-batch 256] [--work /tmp/fptrace-bench-ct]
        [--out benchmarks/results-circuit-tracer.json]

circuit-tracer runs in its own virtual environment (--ct-python; see benchmarks/README.md for
how it was made: circuit-tracer 0.5.0 pins transformers <= 4.57.3, and nnsight must be 0.6.x),
as a subprocess of this script (the same file, `--ct-side SPEC`), so one run times both on the
same machine, one after the other (circuit-tracer first).

Inputs, prepared under --work (rebuilt each run; the HF folder is kept between runs):
- the model: the bundled SmolLM2-135M-Instruct as fptrace loads it (float32, dequantized from
  its GGUF), saved as a float32 HF folder for transformers 4.57: config.json gains `rope_theta`
  (transformers 5 writes it inside `rope_parameters`, which 4.57 ignores, silently falling back
  to a RoPE base of 10,000) and tokenizer_config.json names `PreTrainedTokenizerFast`;
- the prompt: <|im_start|> (id 1, a special token, so that circuit-tracer prepends nothing)
  then a fixed English sentence's ids, --tokens ids in all; both tools get the same ids;
- the transcoders: one per block (30), --latents latents each, seeded random weights (W_enc
  N(0, 1/d), b_enc 0, b_dec N(0, 0.01)), JumpReLU with one threshold per block placed (in a
  gap of the pre-activations) so that --active latents fire per position on average on this
  prompt; the decoder is --fit (0.8) times the least-squares decoder of the block's MLP output
  on this prompt plus the rest times a random N(0, 1/n) one, so that the latents carry most of
  the graph (with random decoders the error nodes carry all of it and no latent survives the
  pruning: nothing to compare there); written with the same float32 numbers in SAELens's
  layout (what fptrace reads: cfg.json `jumprelu_transcoder`, sae_weights.safetensors) and in
  circuit-tracer's (layer_{i}.safetensors: W_enc, W_dec (d_sae, d_model), b_enc, b_dec,
  activation_function.threshold; config.yaml `model_kind: transcoder_set`, hooks `mlp.hook_in`
  / `mlp.hook_out`), loaded by circuit-tracer as its command line loads a set
  (load_transcoders: encoder in memory, decoder read lazily from the file).
- or, with --transcoders DIR, a circuit-tracer transcoder set's folder (config.yaml and its
  layer files, as `fptrace features train --transcoder --export circuit-tracer` writes them:
  trained transcoders, JumpReLU, with W_skip where trained with --skip): fptrace reads that
  folder itself (`read_transcoders`, circuit-tracer's layout), circuit-tracer loads its
  config.yaml as above (a relative file path taken from the config's folder, as fptrace takes
  it; without `transcoders`, the folder's layer_N.safetensors); --latents, --active and --fit
  are then unused, and the active latents per site are counted from the set on the prompt.
  It needs a transcoder for every block (circuit-tracer replaces every MLP).

What runs, so that both compute the same graph:
- circuit-tracer: `attribute(ids, model, batch_size=--ct-batch, max_feature_nodes=None)`
  (every active feature gets its row, circuit-tracer's default), nnsight backend, float32,
  CPU. Two settings of ours, both said in the results: (1) its attribution targets are given
  as CustomTarget(token, p, W_U[token]), the logit nodes fptrace chooses (the top tokens to
  0.95 probability, at most 10: circuit-tracer's own rule, which picks the same tokens) with
  the raw unembedding rows, because circuit-tracer otherwise attributes logit - mean logit
  and fptrace the logit itself; (2) `model.zero_positions = slice(0, 0)`: circuit-tracer
  zeroes every latent and error vector at position 0 (its BOS), fptrace does not.
- fptrace: `graph(lm, ids, transcoders=TranscoderSet, per_site=K, max_nodes=N)` with K the
  most latents active at one (block, position) and N all active latents, so every active
  latent is a candidate and gets its row unless its influence on the logits is 0 (fptrace
  skips those: circuit-tracer computes them); float64, or with --fp-precision float32 the
  rows and the split over heads in float32 (graph's --precision: each row checked against
  its float64 value and recomputed in float64 where it misses, as its notes count).
- With --max-nodes N both compute N latent rows, chosen by their influence on the logits
  over the rows so far: circuit-tracer ranks after the logits' rows and then every
  update_interval (4) x batch_size rows, fptrace every 4 x batch_size rows; with
  --fp-batch equal to --ct-batch and N <= 4 x batch_size both rank once, after the logits'
  rows, so they pick the same latents (up to ties). Then circuit-tracer's rows simply lack
  the latents it did not compute, while fptrace sums them into per-site remainders (not
  error nodes), so the pruning and the scores need not agree there.
- Peak resident memory (VmHWM, reset just before): of circuit-tracer's `attribute` call and of
  fptrace's `graph` call, each in its process (the model, inputs and anything else already
  resident count too: the value before each call is given beside it).
- Timed: circuit-tracer's `attribute` call alone (model and transcoders loaded before) and
  its whole subprocess (interpreter start, imports, load, an untimed check pass, attribute,
  pruning); fptrace's `graph` call alone (model loaded and transcoders read before; the
  float64 copy, both passes, the rows, the check, the pruning and the scores are inside) and
  fptrace's load + read + graph. The ratio is attribute-alone against graph-alone.

Compared:
(a) the unpruned adjacency, edge by edge: every row both computed (the logits, and the latents
    both computed) against every column both have (latents, error nodes, tokens): the
    relative difference |f - c| / max(|f|, |c|) over edges nonzero in either (max, median,
    99th percentile, how many above 1e-4) and the same scaled by the row's largest |edge|;
    circuit-tracer's float32 against fptrace's float64. Edges one has and the other lacks
    (a source that is a node in one only) are counted apart, as are fptrace's remainder
    columns (zero when every active latent is a candidate). The relative difference of a
    tiny edge is float32's rounding of a sum of larger terms, so it is also given for the
    edges of at least 1e-3 of their row's largest.
(b) the node sets after pruning (node 0.8, edge 0.98): circuit-tracer's prune_graph mask
    against fptrace's kept nodes, as typed keys (latent, error, token, logit, fptrace's
    remainders): circuit-tracer's frontend node_id spells a block-0 latent "0_{latent}_{pos}"
    and an error node "0_{block}_{pos}", which can collide.
(c) the replacement and completeness scores (compute_graph_scores against fptrace's).

Prints a table and writes --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

TEXT = ("The capital of France is Paris, and the capital of Germany is Berlin; the capital of "
        "Italy is Rome, and the capital of Spain is")
BOS = 1  # <|im_start|>: a special token of SmolLM2's tokenizer


# ---------------------------------------------------------------- circuit-tracer's side ---

def ct_side(spec_path: str) -> None:
    """Runs under circuit-tracer's venv: load, attribute, prune, score; write an .npz."""
    t_start = time.perf_counter()
    with open(spec_path) as f:
        spec = json.load(f)
    import circuit_tracer
    import numpy as np
    import torch
    import yaml
    from circuit_tracer import ReplacementModel, attribute
    from circuit_tracer.attribution.targets import AttributionTargets, CustomTarget
    from circuit_tracer.graph import compute_graph_scores, prune_graph
    from circuit_tracer.utils.hf_utils import load_transcoders

    t_imports = time.perf_counter()
    with open(spec["config"]) as f:
        config = yaml.safe_load(f)
    # a local set (--transcoders): its files from the config's folder, as fptrace reads them
    home = os.path.dirname(os.path.abspath(spec["config"]))
    if "transcoders" not in config:
        n = sum(1 for f in os.listdir(home) if f.startswith("layer_") and
                f.endswith(".safetensors"))
        config["transcoders"] = [f"layer_{i}.safetensors" for i in range(n)]
    config["transcoders"] = [p if "://" in p else os.path.join(home, p)
                             for p in config["transcoders"]]
    transcoders = load_transcoders(config, torch.device("cpu"), torch.float32)
    model = ReplacementModel.from_pretrained_and_transcoders(
        spec["hf"], transcoders, device="cpu", dtype=torch.float32, backend="nnsight")
    if not spec["zero_bos"]:
        model.zero_positions = slice(0, 0)
    ids = torch.tensor(spec["ids"])
    t_loaded = time.perf_counter()
    # untimed check pass: the model's logits, and the logit nodes circuit-tracer would choose
    ctx = model.setup_attribution(ids)
    logits = ctx.logits[0, -1].detach().float()
    stock = AttributionTargets(attribution_targets=None, logits=logits,
                               unembed_proj=model.unembed_proj, tokenizer=model.tokenizer,
                               max_n_logits=10, desired_logit_prob=0.95)
    stock_ids = [int(t.vocab_idx) for t in stock.logit_targets]
    n_active = int(ctx.activation_matrix._nnz())
    del ctx
    if spec["raw_logits"]:
        W_U = model.unembed_proj
        targets = [CustomTarget(token_str=f"tok{t}", prob=float(p), vec=W_U[t].detach().clone())
                   for t, p in zip(spec["targets"], spec["probs"], strict=True)]
    else:
        targets = None
    rss_before = peak_rss_mib(reset=True)
    t0 = time.perf_counter()
    g = attribute(ids, model, attribution_targets=targets, batch_size=spec["batch"],
                  max_feature_nodes=spec["max_feature_nodes"])
    t_attr = time.perf_counter() - t0
    rss_attr = peak_rss_mib()
    t0 = time.perf_counter()
    pr = prune_graph(g, spec["node_threshold"], spec["edge_threshold"])
    repl, compl = compute_graph_scores(g)
    t_prune = time.perf_counter() - t0
    A = g.adjacency_matrix
    n_sel = len(g.selected_features)
    n_log = len(g.logit_targets)
    rows = torch.cat([A[:n_sel], A[-n_log:]]).numpy()
    np.savez(spec["out"], rows=rows,
             features=g.active_features[g.selected_features].numpy(),
             activations=g.activation_values[g.selected_features].numpy(),
             node_mask=pr.node_mask.numpy(), cumulative=pr.cumulative_scores.numpy(),
             logits=logits.numpy(), probs=g.logit_probabilities.numpy())
    import importlib.metadata as md

    import transformers
    versions = {p: md.version(p) for p in ("circuit-tracer", "nnsight", "transformers", "torch",
                                           "numpy", "safetensors", "transformer-lens")}
    info = {"versions": versions, "circuit_tracer": circuit_tracer.__version__,
            "transformers_module": transformers.__version__,
            "threads": torch.get_num_threads(), "n_active": n_active, "n_selected": n_sel,
            "stock_targets": stock_ids,
            "stock_probs": [float(p) for p in stock.logit_probabilities],
            "replacement": repl, "completeness": compl,
            "imports_s": t_imports - t_start, "load_s": t_loaded - t_imports,
            "attribute_s": t_attr, "prune_score_s": t_prune,
            "rss_before_attribute_mib": rss_before, "peak_rss_attribute_mib": rss_attr,
            "whole_in_process_s": time.perf_counter() - t_start}
    with open(spec["out"] + ".json", "w") as f:
        json.dump(info, f)


# ------------------------------------------------------------------------ preparation ---

def peak_rss_mib(reset: bool = False) -> float:
    """This process's peak resident set (VmHWM, MiB); with reset, the resident set now, the
    peak reset to it first (/proc/self/clear_refs "5"), so that a later call gives the peak of
    what ran in between (the process's own inputs and model stay counted: they are resident)."""
    if reset:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def hf_folder(lm, folder: str) -> str:
    """The loaded model as a float32 HF folder that transformers 4.57 reads right."""
    if os.path.exists(os.path.join(folder, "done")):
        return folder
    os.makedirs(folder, exist_ok=True)
    lm.model.save_pretrained(folder)
    lm.tokenizer._tok.save_pretrained(folder)
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.get("rope_parameters") or {}
    cfg["rope_theta"] = float(rope.get("rope_theta", getattr(lm.config, "rope_theta", 0.0)))
    assert cfg["rope_theta"] == 100000.0, cfg["rope_theta"]
    cfg["torch_dtype"] = "float32"
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path) as f:
        tcfg = json.load(f)
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(path, "w") as f:
        json.dump(tcfg, f, indent=2)
    open(os.path.join(folder, "done"), "w").close()
    return folder


def mlp_inputs(lm, ids: list[int]):
    """Each block's MLP input and output on the prompt, float32 as the model computes them:
    (L, T, d) each, and the last position's logits."""
    import torch

    got: dict[int, torch.Tensor] = {}
    out_: dict[int, torch.Tensor] = {}
    layers = lm.model.model.layers
    def hook(i: int):
        def keep(module, args, output) -> None:
            got[i] = args[0][0].detach().clone()
            out_[i] = output[0].detach().clone()
        return keep

    hooks = [layers[i].mlp.register_forward_hook(hook(i)) for i in range(len(layers))]
    try:
        with torch.no_grad():
            out = lm.model(torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    n = len(layers)
    return (torch.stack([got[i] for i in range(n)]), torch.stack([out_[i] for i in range(n)]),
            out.logits[0, -1].float())


def write_transcoders(x, y, n: int, active: int, fit: float, root: str, hf: str,
                      seed: int = 0) -> dict:
    """Seeded random JumpReLU transcoders, one per block, in both layouts (see the module's
    text); the threshold of block l sits in the widest gap of its pre-activations near the
    rank that fires `active` latents a position on average; the decoder is `fit` times the
    least-squares decoder of the MLP's output y on this prompt plus 1 - fit times a random
    one (so that the latents, not only the error nodes, carry the graph)."""
    import numpy as np
    import torch
    from safetensors.numpy import save_file

    L, T, d = x.shape
    sae_root, ct_root = os.path.join(root, "saelens"), os.path.join(root, "circuit-tracer")
    os.makedirs(ct_root, exist_ok=True)
    counts = np.zeros((L, T), dtype=int)
    thresholds = []
    for layer in range(L):
        r = np.random.default_rng(seed + layer)
        W_enc = (r.normal(size=(d, n)) / np.sqrt(d)).astype(np.float32)
        W_dec = (r.normal(size=(n, d)) / np.sqrt(n)).astype(np.float32)
        b_enc = np.zeros(n, dtype=np.float32)
        b_dec = (r.normal(size=d) * 0.1).astype(np.float32)
        pre = x[layer].double().numpy() @ W_enc.astype(np.float64)  # (T, n)
        s = np.sort(pre.ravel())[::-1]
        want = T * active
        lo, hi = max(1, want - 3 * T), min(len(s) - 1, want + 3 * T)
        gaps = s[lo - 1:hi - 1] - s[lo:hi]  # gap between rank i-1 and i (0-based)
        i = lo + int(np.argmax(gaps))
        theta = float((s[i - 1] + s[i]) / 2)
        assert theta > 0, theta
        thresholds.append(theta)
        counts[layer] = (pre > theta).sum(-1)
        if fit:
            acts = np.where(pre > theta, pre, 0.0)
            target = y[layer].double().numpy() - b_dec.astype(np.float64)
            W_fit = np.linalg.lstsq(acts, target, rcond=None)[0]
            W_dec = (fit * W_fit + (1 - fit) * W_dec).astype(np.float32)
        thr = np.full(n, theta, dtype=np.float32)
        folder = os.path.join(sae_root, f"layer_{layer}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "cfg.json"), "w") as f:
            json.dump({"architecture": "jumprelu_transcoder", "d_in": d, "d_sae": n,
                       "hook_name": f"blocks.{layer}.hook_mlp_in",
                       "hook_name_out": f"blocks.{layer}.hook_mlp_out",
                       "normalize_activations": "none", "dtype": "float32"}, f)
        save_file({"W_enc": W_enc, "W_dec": W_dec, "b_enc": b_enc, "b_dec": b_dec,
                   "threshold": thr}, os.path.join(folder, "sae_weights.safetensors"))
        save_file({"W_enc": np.ascontiguousarray(W_enc.T), "W_dec": W_dec, "b_enc": b_enc,
                   "b_dec": b_dec, "activation_function.threshold": thr},
                  os.path.join(ct_root, f"layer_{layer}.safetensors"))
    lines = ["model_kind: transcoder_set", f"model_name: {json.dumps(hf)}",
             'feature_input_hook: "mlp.hook_in"', 'feature_output_hook: "mlp.hook_out"',
             'scan: "fptrace-bench/random"', "transcoders:"]
    lines += [f"  - {json.dumps(os.path.join(ct_root, f'layer_{i}.safetensors'))}"
              for i in range(L)]
    with open(os.path.join(ct_root, "config.yaml"), "w") as f:
        f.write("\n".join(lines) + "\n")
    del torch
    return {"saelens": sae_root, "config": os.path.join(ct_root, "config.yaml"),
            "counts": counts, "thresholds": thresholds, "latents": n}


def given_set(folder: str, lm, x) -> dict:
    """A circuit-tracer set given with --transcoders, read by fptrace once (untimed) to count
    the latents active at each (block, position) on the prompt's MLP inputs x (L, T, d)."""
    import numpy as np
    import torch

    from fptrace.commands.graph.transcoders import read_transcoders

    config = os.path.join(folder, "config.yaml")
    if not os.path.isfile(config):
        raise SystemExit(f"--transcoders {folder!r}: no config.yaml (a circuit-tracer set's "
                         "folder, as --export circuit-tracer writes it, is needed)")
    tset = read_transcoders(folder, lm)
    if tset.missing:
        raise SystemExit(f"--transcoders {folder!r}: no transcoder for blocks "
                         f"{list(tset.missing)}; circuit-tracer replaces every MLP")
    L, T, _ = x.shape
    counts = np.zeros((L, T), dtype=int)
    with torch.no_grad():
        for layer, t in tset.by_block.items():
            acts = t.act(t.pre(x[layer].to(t.W_enc.device, torch.float64)))
            counts[layer] = (acts != 0).sum(-1).cpu().numpy()
    return {"read": folder, "config": config, "counts": counts, "latents": tset.width}


def salient(logits) -> tuple[list[int], list[float]]:
    """circuit-tracer's (and fptrace's) rule: the top tokens to 0.95 probability, at most 10."""
    import torch

    p = torch.softmax(logits.double(), -1)
    top_p, top_i = torch.topk(p, 10)
    cut = int(torch.searchsorted(torch.cumsum(top_p, 0), 0.95)) + 1
    return top_i[:cut].tolist(), top_p[:cut].tolist()


# ------------------------------------------------------------------------- comparison ---

def stats(rel) -> dict:
    import numpy as np

    if not len(rel):
        return {"n": 0}
    return {"n": len(rel), "max": float(rel.max()), "median": float(np.median(rel)),
            "p99": float(np.quantile(rel, 0.99)), "above_1e-4": int((rel > 1e-4).sum())}


def compare(ct: dict, cap: dict, L: int, T: int, ids: list[int], targets: list[int]) -> dict:
    """(a): fptrace's computed rows, mapped onto circuit-tracer's columns, against its rows."""
    import numpy as np

    rows_ct, feats = ct["rows"], ct["features"]
    n_sel = len(feats)
    ct_col = {tuple(int(v) for v in f): j for j, f in enumerate(feats)}
    ct_row = {("f", *k): j for k, j in ct_col.items()}
    ct_row.update({("l", t): n_sel + j for j, t in enumerate(targets)})
    matrix, done = cap["matrix"], cap["done"]
    layout = matrix.layout
    # candidate column c -> circuit-tracer's column, or -1
    cand_map = np.full(layout.n_cand, -1)
    for c in range(layout.n_cand):
        t = layout.cand.target(c)
        cand_map[c] = ct_col.get((t.layer, t.position, t.index), -1)
    n_cols = n_sel + L * T + T
    F, C, rests, fp_only = [], [], [], 0.0
    n_feat_rows = n_logit_rows = 0
    for i, (t, _, _) in enumerate(done):
        key = ("l", t.index) if t.layer is None else ("f", t.layer, t.position, t.index)
        j = ct_row.get(key)
        if j is None:
            continue
        full = matrix.rows[i]
        mapped = np.zeros(n_cols)
        cand = full[:layout.n_cand]
        ok = cand_map >= 0
        mapped[cand_map[ok]] = cand[ok]
        fp_only = max(fp_only, float(np.abs(cand[~ok]).max(initial=0.0)))
        rests.append(float(np.abs(full[layout.n_cand:layout.n_cand + L * T]).max()))
        e0 = layout.n_cand + L * T
        mapped[n_sel:n_sel + L * T] = full[e0:e0 + L * T]
        mapped[n_sel + L * T:] = full[e0 + L * T:e0 + L * T + T]
        F.append(mapped)
        C.append(rows_ct[j, :n_cols].astype(np.float64))
        n_feat_rows += t.layer is not None
        n_logit_rows += t.layer is None
    F, C = np.array(F), np.array(C)
    # circuit-tracer's columns fptrace lacks (a latent that is not a candidate there)
    covered = np.zeros(n_cols, dtype=bool)
    covered[cand_map[cand_map >= 0]] = True
    covered[n_sel:] = True
    ct_only = float(np.abs(C[:, ~covered]).max(initial=0.0))
    F[:, ~covered] = 0
    C[:, ~covered] = 0
    nz = (F != 0) | (C != 0)
    both = (F != 0) & (C != 0)
    diff = np.abs(F - C)
    rel = diff[nz] / np.maximum(np.abs(F), np.abs(C))[nz]
    scale = np.abs(F).max(1, keepdims=True)
    rel_row = (diff / np.where(scale > 0, scale, 1.0))[nz]
    big = nz & (np.maximum(np.abs(F), np.abs(C)) >= 1e-3 * scale)
    rel_big = diff[big] / np.maximum(np.abs(F), np.abs(C))[big]
    big2 = nz & (np.maximum(np.abs(F), np.abs(C)) >= 1e-2 * scale)
    rel_big2 = diff[big2] / np.maximum(np.abs(F), np.abs(C))[big2]
    worst = np.unravel_index(int(np.argmax(np.where(nz, diff / np.maximum(
        np.maximum(np.abs(F), np.abs(C)), 1e-300), 0))), F.shape)
    kinds = {"latent": slice(0, n_sel), "error": slice(n_sel, n_sel + L * T),
             "token": slice(n_sel + L * T, n_cols)}
    by_kind = {}
    for name, sl in kinds.items():
        m = nz[:, sl]
        d = diff[:, sl][m] / np.maximum(np.abs(F[:, sl]), np.abs(C[:, sl]))[m]
        by_kind[name] = stats(d)
    return {"rows_compared": {"latents": n_feat_rows, "logits": n_logit_rows},
            "edges_nonzero_in_either": int(nz.sum()), "edges_nonzero_in_both": int(both.sum()),
            "edges_zero_in_one_only": int((nz & ~both).sum()),
            "relative": stats(rel), "relative_to_row_max": stats(rel_row),
            "relative_edges_above_1e-3_of_row_max": stats(rel_big),
            "relative_edges_above_1e-2_of_row_max": stats(rel_big2),
            "relative_by_source": by_kind,
            "worst_edge": {"fptrace": float(F[worst]), "circuit_tracer": float(C[worst]),
                           "row": int(worst[0]), "column": int(worst[1])},
            "fptrace_only_sources_max_abs": fp_only, "ct_only_sources_max_abs": ct_only,
            "fptrace_remainder_max_abs": max(rests) if rests else 0.0}


def ct_nodes(ct: dict, L: int, T: int, targets: list[int]) -> set[tuple]:
    """circuit-tracer's pruned node set as typed keys (its frontend's node_id cannot tell a
    block-0 latent "0_{latent}_{pos}" from an error node "0_{block}_{pos}")."""
    import numpy as np

    feats, mask = ct["features"], ct["node_mask"]
    n_sel = len(feats)
    out: set[tuple] = set()
    for i in np.flatnonzero(mask):
        i = int(i)
        if i < n_sel:
            layer, pos, f = (int(v) for v in feats[i])
            out.add(("latent", layer, f, pos))
        elif i < n_sel + L * T:
            out.add(("error", *divmod(i - n_sel, T)))
        elif i < n_sel + L * T + T:
            out.add(("token", i - n_sel - L * T))
        else:
            out.add(("logit", targets[i - n_sel - L * T - T]))
    return out


def fp_nodes(g) -> set[tuple]:
    """fptrace's kept nodes as the same typed keys (remainders as "rest")."""
    out: set[tuple] = set()
    for n in g.nodes:
        if n.node_type == "latent":
            out.add(("latent", n.layer, n.index, n.position))
        elif n.node_type == "error":
            out.add(("error", n.layer, n.position))
        elif n.node_type == "other latents":
            out.add(("rest", n.layer, n.position))
        elif n.node_type == "embedding":
            out.add(("token", n.position))
        else:
            out.add(("logit", n.index))
    return out


# ------------------------------------------------------------------------------- main ---

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ct-side", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--latents", type=int, default=2048)
    ap.add_argument("--active", type=int, default=12,
                    help="latents firing per (block, position) on average")
    ap.add_argument("--ct-python", default="/work/ct-venv/bin/python")
    ap.add_argument("--ct-batch", type=int, default=256,
                    help="circuit-tracer's batch_size (its command line's default: 256)")
    ap.add_argument("--fp-batch", type=int, default=32, help="fptrace's batch_size (default)")
    ap.add_argument("--fp-precision", choices=("float64", "float32"), default="float64",
                    help="fptrace's precision (graph --precision): the dtype of its rows")
    ap.add_argument("--transcoders", default=None,
                    help="a circuit-tracer transcoder set's folder (config.yaml; as --export "
                         "circuit-tracer writes it): both sides read it instead of the seeded "
                         "random transcoders")
    ap.add_argument("--fit", type=float, default=0.8,
                    help="share of the least-squares decoder in each transcoder's decoder")
    ap.add_argument("--max-nodes", type=int, default=None,
                    help="latent rows for both (circuit-tracer's max_feature_nodes, fptrace's "
                         "max_nodes); default: every active latent")
    ap.add_argument("--stock-logits", action="store_true",
                    help="circuit-tracer's own demeaned logit targets (no comparison of "
                         "logit rows then)")
    ap.add_argument("--zero-bos", action="store_true",
                    help="leave circuit-tracer's zeroing of position 0 on")
    ap.add_argument("--work", default="/tmp/fptrace-bench-ct")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results-circuit-tracer.json"))
    args = ap.parse_args()
    if args.ct_side:
        ct_side(args.ct_side)
        return
    if not os.path.exists(args.ct_python):
        raise SystemExit(f"{args.ct_python}: no such interpreter; circuit-tracer's venv is made "
                         "as benchmarks/README.md says (python3 -m venv DIR; DIR/bin/pip install "
                         "torch==2.13.0; DIR/bin/pip install circuit-tracer==0.5.0 "
                         "'transformers<=4.57.3' 'nnsight>=0.6,<0.7'), then --ct-python "
                         "DIR/bin/python")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import numpy as np
    import torch

    import fptrace.commands.graph.core as core
    from fptrace.commands.graph.transcoders import read_transcoders
    from fptrace.models.loading import load_model

    started = {"loadavg": loadavg(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    t0 = time.perf_counter()
    lm = load_model()
    fp_load = time.perf_counter() - t0
    ids = ([BOS] + list(lm.prepare(TEXT).ids) * 4)[:args.tokens]
    hf = hf_folder(lm, os.path.join(args.work, "smollm2-135m-f32"))
    x, y, logits32 = mlp_inputs(lm, ids)
    L, T, _ = x.shape
    if args.transcoders:
        tc = given_set(args.transcoders, lm, x)
    else:
        tc_root = os.path.join(args.work, f"tc-{args.latents}-{args.active}-{args.fit}-{T}")
        tc = write_transcoders(x, y, args.latents, args.active, args.fit, tc_root, hf)
        tc["read"] = tc["saelens"]
    counts = tc["counts"]
    targets, probs = salient(logits32)
    n_active = int(counts.sum())
    spec = {"hf": hf, "config": tc["config"], "ids": ids, "batch": args.ct_batch,
            "max_feature_nodes": args.max_nodes, "zero_bos": args.zero_bos,
            "raw_logits": not args.stock_logits, "targets": targets, "probs": probs,
            "node_threshold": 0.8, "edge_threshold": 0.98,
            "out": os.path.join(args.work, "ct-graph.npz")}
    spec_path = os.path.join(args.work, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    print(f"prompt {T} tokens, {L} transcoders of {tc['latents']} latents, {n_active} active "
          f"latents (at most {counts.max()} at one site); circuit-tracer first ...", flush=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    ct_load_before = loadavg()
    t0 = time.perf_counter()
    done = subprocess.run([args.ct_python, os.path.abspath(__file__), "--ct-side", spec_path],
                          env=env, capture_output=True, text=True)
    ct_whole = time.perf_counter() - t0
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-6000:])
        raise SystemExit(f"circuit-tracer's side failed (exit {done.returncode})")
    with open(spec["out"] + ".json") as f:
        ct_info = json.load(f)
    ct = dict(np.load(spec["out"]))

    # fptrace, in this process; its internal rows captured from _assemble's arguments
    cap: dict = {}
    assemble = core._assemble

    def spy(*a, **kw):
        names = ("lm", "prepared", "queries", "ids", "real", "done", "matrix", "visited",
                 "weights")
        cap.update(dict(zip(names, a[:len(names)], strict=True)))
        return assemble(*a, **kw)

    core._assemble = spy
    fp_load_before = loadavg()
    t0 = time.perf_counter()
    tset = read_transcoders(tc["read"], lm)
    fp_read = time.perf_counter() - t0
    fp_rss_before = peak_rss_mib(reset=True)
    t0 = time.perf_counter()
    g = core.graph(lm, ids, transcoders=tset, per_site=int(counts.max()),
                   max_nodes=args.max_nodes or n_active,
                   batch_size=args.fp_batch, precision=args.fp_precision)
    fp_graph = time.perf_counter() - t0
    fp_rss = peak_rss_mib()
    core._assemble = assemble
    fp_targets = [n.index for n in g.nodes if n.node_type == "logit"]

    agree = compare(ct, cap, L, T, ids, targets)
    fp_set, ct_set = fp_nodes(g), ct_nodes(ct, L, T, targets)

    def kinds(keys: set) -> dict:
        return {k: sum(1 for t in keys if t[0] == k) for k in sorted({t[0] for t in keys})}

    pruned = {"fptrace_nodes": len(fp_set), "ct_nodes": len(ct_set), "same": fp_set == ct_set,
              "both": len(fp_set & ct_set), "fptrace_kinds": kinds(fp_set),
              "ct_kinds": kinds(ct_set), "fptrace_only": [list(t) for t in
                                                          sorted(fp_set - ct_set)][:20],
              "ct_only": [list(t) for t in sorted(ct_set - fp_set)][:20],
              "n_fptrace_only": len(fp_set - ct_set), "n_ct_only": len(ct_set - fp_set)}
    logit_diff = float((logits32.double() - torch.tensor(ct["logits"]).double()).abs().max())
    res = {
        "measured": started["time"], "loadavg_start": started["loadavg"],
        "loadavg_before_ct": ct_load_before, "loadavg_before_fptrace": fp_load_before,
        "loadavg_end": loadavg(), "cores": os.cpu_count(),
        "torch_threads_fptrace": torch.get_num_threads(),
        "torch_threads_ct": ct_info["threads"],
        "tokens": T, "transcoders": L, "latents": tc["latents"],
        "transcoder_set": tc["read"] if args.transcoders else "seeded random",
        "active_per_site": None if args.transcoders else args.active,
        "decoder_fit": None if args.transcoders else args.fit,
        "active_latents": n_active, "max_active_at_a_site": int(counts.max()),
        "ct_active_latents": ct_info["n_active"], "ct_selected": ct_info["n_selected"],
        "fptrace_computed": g.computed, "fptrace_per_site": g.per_site,
        "max_nodes": args.max_nodes, "ct_batch": args.ct_batch, "fptrace_batch": args.fp_batch,
        "fptrace_precision": args.fp_precision, "fptrace_notes": list(g.notes),
        "ct_logit_targets": "stock (logit - mean logit)" if args.stock_logits else
        "CustomTarget: raw unembedding rows of fptrace's logit tokens",
        "ct_zero_positions": "slice(0, 1) (stock)" if args.zero_bos else "slice(0, 0)",
        "logit_tokens": targets, "ct_stock_logit_tokens": ct_info["stock_targets"],
        "fptrace_logit_tokens": fp_targets,
        "same_logit_tokens": targets == ct_info["stock_targets"] and sorted(fp_targets)
        == sorted(targets),
        "hf_folder_logits_max_abs_diff": logit_diff,
        "seconds": {"ct_attribute": ct_info["attribute_s"],
                    "ct_prune_and_scores": ct_info["prune_score_s"],
                    "ct_imports": ct_info["imports_s"], "ct_load": ct_info["load_s"],
                    "ct_whole_subprocess": ct_whole, "fptrace_graph": fp_graph,
                    "fptrace_graph_own_clock": g.seconds, "fptrace_load_model": fp_load,
                    "fptrace_read_transcoders": fp_read,
                    "fptrace_load_read_graph": fp_load + fp_read + fp_graph},
        "speedup_attribute_vs_graph": ct_info["attribute_s"] / fp_graph,
        "peak_rss_mib": {"ct_before_attribute": ct_info["rss_before_attribute_mib"],
                         "ct_attribute": ct_info["peak_rss_attribute_mib"],
                         "fptrace_before_graph": fp_rss_before, "fptrace_graph": fp_rss},
        "fptrace_checks": {c.name: c.value for c in g.checks}, "fptrace_ok": g.ok,
        "edges": agree, "pruned": pruned,
        "scores": {"ct_replacement": ct_info["replacement"],
                   "ct_completeness": ct_info["completeness"],
                   "fptrace_replacement": g.scores.replacement,
                   "fptrace_completeness": g.scores.completeness},
        "versions": ct_info["versions"],
        "fptrace_env": {"torch": torch.__version__,
                        "transformers": __import__("transformers").__version__},
    }
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(table(res, ct_info["circuit_tracer"], args.out))


def table(res: dict, version: str, out: str) -> str:
    """The printed summary of one run."""
    s, e, p, sc = res["seconds"], res["edges"], res["pruned"], res["scores"]
    m = res["peak_rss_mib"]

    def rel(name: str, label: str) -> str:
        d = e[name]
        return (f"  {label} ({d['n']}): relative difference max {d['max']:.2e}, median "
                f"{d['median']:.2e}, p99 {d['p99']:.2e}, above 1e-4: {d['above_1e-4']}")

    rows = [("", f"circuit-tracer {version}", "fptrace"),
            ("attribution alone (s)", f"{s['ct_attribute']:.1f}", f"{s['fptrace_graph']:.1f}"),
            ("whole (s)", f"{s['ct_whole_subprocess']:.1f}",
             f"{s['fptrace_load_read_graph']:.1f}"),
            ("peak RSS (MiB)", f"{m['ct_attribute']:.0f}", f"{m['fptrace_graph']:.0f}"),
            ("  RSS before it (MiB)", f"{m['ct_before_attribute']:.0f}",
             f"{m['fptrace_before_graph']:.0f}"),
            ("latent rows computed", str(res["ct_selected"]), str(res["fptrace_computed"])),
            ("replacement", f"{sc['ct_replacement']:.4f}", f"{sc['fptrace_replacement']:.4f}"),
            ("completeness", f"{sc['ct_completeness']:.4f}",
             f"{sc['fptrace_completeness']:.4f}"),
            ("pruned nodes", str(p["ct_nodes"]), str(p["fptrace_nodes"]))]
    lines = [f"{a:<24}{b:>22}{c:>10}" for a, b, c in rows]
    lines += [f"speed: circuit-tracer's attribute / fptrace's graph = "
              f"{res['speedup_attribute_vs_graph']:.2f}x ({res['active_latents']} active latents)",
              f"fptrace's precision {res['fptrace_precision']}; its checks "
              + ", ".join(f"{k} {v:.1e}" for k, v in res["fptrace_checks"].items())
              + f" (all hold: {res['fptrace_ok']})",
              *(f"fptrace's note: {n}" for n in res["fptrace_notes"] if "float32" in n),
              f"pruned node sets the same: {p['same']} (in both {p['both']}); kinds: "
              f"circuit-tracer {p['ct_kinds']}, fptrace {p['fptrace_kinds']}",
              f"edges compared: {e['edges_nonzero_in_either']} in rows {e['rows_compared']}; "
              f"zero in one only: {e['edges_zero_in_one_only']}",
              rel("relative", "all"),
              rel("relative_edges_above_1e-3_of_row_max", ">= 1e-3 of the row's largest"),
              rel("relative_edges_above_1e-2_of_row_max", ">= 1e-2 of the row's largest"),
              rel("relative_to_row_max", "all, scaled by the row's largest"),
              f"load average: start {res['loadavg_start']}, end {res['loadavg_end']}; "
              f"wrote {out}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
