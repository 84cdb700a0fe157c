"""Examples of `fptrace graph`: its bad inputs and its notes' cases.

The transcoders here are made from seeded weights (no download): `write_transcoder` writes one
block's as an SAELens folder (cfg.json + sae_weights.safetensors), `write_transcoders` one a
block, `write_circuit_tracer_set` a set in circuit-tracer's layout (config.yaml and
layer_L.safetensors)."""

from __future__ import annotations

import json
import os

from fptrace.examples import Bench, Case, NoteCase, Said, Setup

PROMPT = [5, 6, 7, 8, 9, 10]


def write_transcoder(folder: str, block: int, d_model: int, d_sae: int, seed: int = 0,
                     k: int = 8, architecture: str = "topk_transcoder", skip: float = 0.0
                     ) -> str:
    """A TopK transcoder of block `block` (its MLP's input → its output) with seeded random
    weights, written in SAELens's layout; architecture "standard" writes an SAE of the stream
    instead (what a graph must refuse). skip > 0: a skip transcoder (`topk_skip_transcoder`),
    W_skip random of that scale, stored (d_out, d_in) as SAELens stores it."""
    import numpy as np
    from safetensors.numpy import save_file

    r = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    if skip:
        architecture = "topk_skip_transcoder"
    cfg: dict[str, object] = {"architecture": architecture, "d_in": d_model, "d_sae": d_sae,
                              "normalize_activations": "none", "dtype": "float32"}
    if architecture == "standard":
        cfg["hook_name"] = f"blocks.{block}.hook_resid_post"
    else:
        cfg.update(hook_name=f"blocks.{block}.hook_mlp_in",
                   hook_name_out=f"blocks.{block}.hook_mlp_out", k=k)
    with open(os.path.join(folder, "cfg.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    w = {"W_enc": r.normal(size=(d_model, d_sae)) / np.sqrt(d_model),
         "W_dec": r.normal(size=(d_sae, d_model)) / np.sqrt(d_sae),
         "b_enc": r.normal(size=d_sae) * 0.1, "b_dec": r.normal(size=d_model) * 0.1}
    if skip:
        w["W_skip"] = r.normal(size=(d_model, d_model)) * skip / np.sqrt(d_model)
    save_file({n: np.ascontiguousarray(v, dtype=np.float32) for n, v in w.items()},
              os.path.join(folder, "sae_weights.safetensors"))
    return folder


def write_transcoders(folder: str, blocks: range | list[int], d_model: int, d_sae: int = 32,
                      k: int = 8, skip: float = 0.0) -> str:
    """One seeded transcoder per block in folder/layer_{block} (skip > 0: skip transcoders)."""
    for b in blocks:
        write_transcoder(os.path.join(folder, f"layer_{b}"), b, d_model, d_sae, seed=b, k=k,
                         skip=skip)
    return folder


def write_circuit_tracer_set(folder: str, blocks: range | list[int], d_model: int,
                             d_sae: int = 32, threshold: float | None = 0.05, skip: float = 0.0,
                             seed: int = 0, **config: object) -> str:
    """A transcoder set in circuit-tracer's layout with seeded random weights: per block
    layer_{block}.safetensors as its SingleLayerTranscoder.to_safetensors writes them (W_enc
    and W_dec (d_sae, d_model), b_enc, b_dec, activation_function.threshold where `threshold`
    is not None, W_skip (d_model, d_model) applied as x @ W_skip.T where skip > 0) and
    config.yaml naming them by relative path in block order; `config` replaces its keys
    (model_kind, feature_input_hook, feature_output_hook, transcoders)."""
    import numpy as np
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    for b in blocks:
        r = np.random.default_rng(seed + b)
        w = {"W_enc": r.normal(size=(d_sae, d_model)) / np.sqrt(d_model),
             "W_dec": r.normal(size=(d_sae, d_model)) / np.sqrt(d_sae),
             "b_enc": r.normal(size=d_sae) * 0.1, "b_dec": r.normal(size=d_model) * 0.1}
        if threshold is not None:
            w["activation_function.threshold"] = np.full(d_sae, threshold)
        if skip:
            w["W_skip"] = r.normal(size=(d_model, d_model)) * skip / np.sqrt(d_model)
        save_file({n: np.ascontiguousarray(v, dtype=np.float32) for n, v in w.items()},
                  os.path.join(folder, f"layer_{b}.safetensors"))
    cfg: dict[str, object] = {"model_kind": "transcoder_set", "feature_input_hook": "mlp.hook_in",
                              "feature_output_hook": "mlp.hook_out",
                              "transcoders": [f"layer_{b}.safetensors" for b in blocks]}
    cfg.update(config)
    lines = []  # YAML: JSON's strings and lists are YAML's
    for key, value in cfg.items():
        if isinstance(value, list) and value:
            lines += [f"{key}:"] + [f"  - {json.dumps(v)}" for v in value]
        else:
            lines.append(f"{key}: {json.dumps(value)}")
    with open(os.path.join(folder, "config.yaml"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return folder


def _notes(bench: Bench, blocks: int | None) -> tuple[str, ...]:
    from fptrace.commands.graph.core import graph

    lm = bench.lm("llama")
    L, d = int(lm.config.num_hidden_layers), int(lm.config.hidden_size)
    folder = write_transcoders(str(bench.tmp("transcoders")), range(L if blocks is None
                                                                     else blocks), d)
    return graph(lm, PROMPT, transcoders=folder, max_nodes=8).notes


def _missing(bench: Bench) -> Said:
    return _notes(bench, None), _notes(bench, 1)


def _clamped(bench: Bench) -> Said:
    """gpt-oss at its limit (7: nothing clamps in the tiny model), and at 0.05 (many do)."""
    from fptrace.commands.graph.core import graph

    at_seven, low = bench.lm("gpt_oss"), bench.lm("gpt_oss")
    for mlp in low.parts.mlps:
        mlp.experts.limit = 0.05
    return (graph(at_seven, PROMPT, max_nodes=4).notes, graph(low, PROMPT, max_nodes=4).notes)


def _float32(bench: Bench) -> Said:
    """The same graph in float64, and with precision float32."""
    from fptrace.commands.graph.core import graph

    lm = bench.lm("llama")
    return (graph(lm, PROMPT, max_nodes=4).notes,
            graph(lm, PROMPT, max_nodes=4, precision="float32").notes)


NOTE_CASES = (NoteCase("graph_blocks_without_transcoder", _missing),
              NoteCase("graph_clamped_neurons", _clamped),
              NoteCase("graph_float32_rows", _float32))


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace graph` (rows of docs/bad-inputs.md)."""
    m = at.model
    g = ("graph", "The cat sat", *m, "--neurons")
    t = ("graph", "The cat sat", *m, "--transcoders")
    d = 32  # the width of the tiny GPT-2 the cases run on (tests/conftest.py's tiny_gpt2)
    root = at.path("graph-transcoders")
    sae = write_transcoder(os.path.join(root, "sae", "layer_0"), 0, d, 16,
                           architecture="standard")
    other = write_transcoder(os.path.join(root, "wide", "layer_0"), 0, d + 8, 16)
    twice = os.path.join(root, "twice")
    write_transcoder(os.path.join(twice, "a"), 0, d, 16)
    write_transcoder(os.path.join(twice, "b"), 0, d, 16, seed=1)
    os.makedirs(os.path.join(root, "none"), exist_ok=True)
    ct = os.path.join(root, "circuit-tracer")
    clt = write_circuit_tracer_set(os.path.join(ct, "clt"), [0], d,
                                   model_kind="cross_layer_transcoder")
    hub = write_circuit_tracer_set(os.path.join(ct, "hub"), [0], d, transcoders=[
        "hf://mntss/some-transcoders/layer_0.safetensors"])
    below = write_circuit_tracer_set(os.path.join(ct, "below"), [0], d, threshold=-0.1)
    return (
        Case(1, "graph without --neurons or --transcoders", ("graph", "The cat sat", *m)),
        Case(2, "graph: --node-threshold above 1", (*g, "--node-threshold", "1.5")),
        Case(3, "graph: --edge-threshold NaN", (*g, "--edge-threshold", "nan")),
        Case(4, "graph: --edge-threshold negative", (*g, "--edge-threshold", "-0.1")),
        Case(5, "graph: --max-nodes 0", (*g, "--max-nodes", "0")),
        Case(6, "graph: --max-nodes not a whole number", (*g, "--max-nodes", "2.5")),
        Case(7, "graph: --positions outside the prompt", (*g, "--positions", "7")),
        Case(8, "graph: a prompt beyond the context",
             ("graph", "the cat " * 40, *m, "--neurons")),
        Case(9, "graph --neurons on a family whose MLP fptrace cannot freeze",
             ("graph", "--ids", "1,2,3", "--model", at.path("starcoder2"), "--neurons")),
        Case(10, "graph: --graph-json not a .json file",
             (*g, "--graph-json", at.path("notes.txt"))),
        Case(11, "graph: --graph-json over a file fptrace did not write",
             (*g, "--graph-json", at.path("robot.json"))),
        Case(12, "graph: --neurons and --transcoders together", (*g, "--transcoders", root)),
        Case(13, "graph: --transcoders a folder that does not exist",
             (*t, os.path.join(root, "gone"))),
        Case(14, "graph: --transcoders a folder holding no transcoder",
             (*t, os.path.join(root, "none"))),
        Case(15, "graph: an SAE of the stream given as a transcoder",
             (*t, os.path.dirname(sae))),
        Case(16, "graph: transcoders of another model (another width)",
             (*t, os.path.dirname(other))),
        Case(17, "graph: two transcoders for one block", (*t, twice)),
        Case(18, "graph: --verify not a whole number (², which passes isdigit())",
             (*g, "--verify", "\u00b2")),
        Case(19, "graph: --workers 0", (*g, "--ray", "auto", "--workers", "0")),
        Case(20, "graph: --workers not a whole number (²)",
             (*g, "--ray", "auto", "--workers", "\u00b2")),
        Case(21, "graph: --gpus-per-worker negative",
             (*g, "--ray", "auto", "--gpus-per-worker", "-1")),
        Case(22, "graph: --ray at an address where no cluster answers (loopback port 1)",
             (*g, "--ray", "127.0.0.1:1")),
        Case(23, "graph: --qk negative", (*g, "--qk", "-1")),
        Case(24, "graph: --qk not a whole number (², which passes isdigit())",
             (*g, "--qk", "\u00b2")),
        Case(25, "graph: a circuit-tracer cross-layer transcoder", (*t, clt)),
        Case(26, "graph: a circuit-tracer set naming a file on the Hugging Face Hub (hf://)",
             (*t, hub)),
        Case(27, "graph: a circuit-tracer JumpReLU threshold below 0", (*t, below)),
        Case(28, "graph: --precision neither float64 nor float32", (*g, "--precision", "float16")),
        Case(29, "graph: --precision float32 with --verify",
             (*g, "--precision", "float32", "--verify", "2")),
    )
