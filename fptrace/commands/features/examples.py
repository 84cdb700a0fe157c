"""Examples of `fptrace features`: its golden view, its bad inputs, its notes' cases.

The dictionaries here are made from seeded weights (no download): `seeded` in memory, and
`write_seeded` as an SAELens folder for the command line.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

PROMPT = "The cat sat on the mat"


def seeded(d_model: int, d_sae: int, hook: str = "blocks.1.hook_resid_pre", seed: int = 0,
           kind: str = "relu", k: int | None = None) -> Any:
    """An SAE of width d_model with seeded random weights (decoder rows scaled down), in
    memory."""
    import torch

    from fptrace.core.dictionaries import Dictionary
    from fptrace.core.dictionary_sites import dictionary_site

    g = torch.Generator().manual_seed(seed)
    site = dictionary_site(hook)
    return Dictionary(
        path=f"seeded-{seed}", format="saelens", kind=kind, role="sae", site=site, out_site=site,
        W_enc=torch.randn(d_model, d_sae, generator=g),
        b_enc=torch.randn(d_sae, generator=g) * 0.5,
        W_dec=torch.randn(d_sae, d_model, generator=g) * 0.1,
        b_dec=torch.randn(d_model, generator=g) * 0.1, k=k, shift_input=True)


def write_seeded(folder: str, d_model: int, d_sae: int, hook: str = "blocks.1.hook_resid_pre",
                 seed: int = 0) -> str:
    """seeded(...) written as an SAELens folder (cfg.json + sae_weights.safetensors)."""
    import numpy as np
    from safetensors.numpy import save_file

    d = seeded(d_model, d_sae, hook, seed)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "cfg.json"), "w", encoding="utf-8") as f:
        json.dump({"architecture": "standard", "d_in": d_model, "d_sae": d_sae,
                   "hook_name": hook, "apply_b_dec_to_input": True,
                   "normalize_activations": "none", "dtype": "float32"}, f)
    save_file({n: np.ascontiguousarray(getattr(d, n).numpy()) for n in
               ("W_enc", "W_dec", "b_enc", "b_dec")},
              os.path.join(folder, "sae_weights.safetensors"))
    return folder


def _notes(lm: LoadedModel, **kw: Any) -> tuple[str, ...]:
    from fptrace.commands.features.core import features

    d = int(lm.config.hidden_size)
    kw.setdefault("saes", [seeded(d, 4 * d)])
    return features(lm, [5, 6, 7, 8], **kw).notes


def _massive(bench: Bench) -> Said:
    return _notes(bench.lm("llama")), None


def _withheld(bench: Bench) -> Said:
    return _notes(bench.lm("llama")), None


def _not_in_stream(bench: Bench) -> Said:
    lm = bench.lm("llama")
    d = int(lm.config.hidden_size)
    return _notes(lm), _notes(lm, saes=[seeded(d, 4 * d, "blocks.1.hook_mlp_in")])


def _softcap(bench: Bench) -> Said:
    return _notes(bench.lm("llama")), _notes(bench.lm("gemma2"))


NOTE_CASES = (NoteCase("features_massive", _massive),
              NoteCase("features_attribution_withheld", _withheld),
              NoteCase("features_not_in_stream", _not_in_stream),
              NoteCase("features_softcap", _softcap))


def _view(lm: LoadedModel, bench: Bench) -> Render:
    from fptrace.commands.features.core import features
    from fptrace.commands.features.render import features_view

    d = int(lm.config.hidden_size)
    r = features(lm, PROMPT, saes=[seeded(d, 4 * d, "blocks.0.hook_resid_post"),
                                   seeded(d, 4 * d, "blocks.1.hook_resid_post", seed=1,
                                          kind="topk", k=8)], top=3, latent=2)
    return lambda w: features_view(r, w)


VIEWS = (View("features", _view),)


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace features` (rows of docs/bad-inputs.md); the dictionary folders
    they read are written here, under the script's temporary folder."""
    m = at.model
    root = at.path("features")
    good = write_seeded(os.path.join(root, "sae"), 32, 64)
    os.makedirs(os.path.join(root, "empty"), exist_ok=True)
    wide = write_seeded(os.path.join(root, "wide"), 48, 64)
    cut = write_seeded(os.path.join(root, "cut"), 32, 64)
    weights = os.path.join(cut, "sae_weights.safetensors")
    with open(weights, "rb") as f:
        data = f.read()
    with open(weights, "wb") as f:
        f.write(data[:len(data) // 2])
    hostile = _hostile_dictionaries(root)
    return (
        Case(1, "features: a folder without a config",
             ("features", "The cat sat", *m, "--sae", os.path.join(root, "empty"))),
        Case(2, "features: a dictionary of another width",
             ("features", "The cat sat", *m, "--sae", wide)),
        Case(3, "features: a truncated safetensors file",
             ("features", "The cat sat", *m, "--sae", cut)),
        Case(4, "features: a latent index out of range",
             ("features", "The cat sat", *m, "--sae", good, "--latent", "64")),
        Case(5, "features: the site against the config (after the block, not before)",
             ("features", "The cat sat", *m, "--sae", good, "--site",
              "blocks.1.hook_resid_post")),
        Case(6, "features: a Gemma Scope W_enc of three dimensions",
             ("features", "The cat sat", *m, "--sae", hostile["cube"])),
        Case(7, "features: a dictionary whose cfg.json is a named pipe (FIFO)",
             ("features", "The cat sat", *m, "--sae", hostile["fifo"])),
        Case(8, "features: a Gemma Scope file of 0 latents",
             ("features", "The cat sat", *m, "--sae", hostile["empty"])),
        Case(9, "features: TopK with k larger than the latents",
             ("features", "The cat sat", *m, "--sae", hostile["k"])),
        Case(10, 'features: apply_b_dec_to_input "false" (a string, not a JSON boolean)',
             ("features", "The cat sat", *m, "--sae", hostile["switch"])),
        Case(11, "features: a transposed W_dec",
             ("features", "The cat sat", *m, "--sae", hostile["turned"])),
        Case(12, "features: --sae a symlink loop",
             ("features", "The cat sat", *m, "--sae", hostile["loop"])),
        Case(21, "features: an SAE holding a skip connection (W_skip), refused, not ignored",
             ("features", "The cat sat", *m, "--sae", hostile["skip"])),
        Case(13, "features train: --latents too large for the memory (refused before the load)",
             ("features", "train", at.path("prompts.txt"), *m, "--layer", "1", "--out",
              os.path.join(root, "huge"), "--latents", "99999999999")),
        Case(14, "features train: --resume on another model's weights",
             ("features", "train", os.path.join(root, "two.txt"), *m, "--layer", "1", "--out",
              hostile["resume"], "--resume", *TRAIN_ARGS)),
        *_transcoder_cases(at, root),
    )


def _transcoder_cases(at: Setup, root: str) -> tuple[Case, ...]:
    """The bad inputs of `features train --transcoder` (issue 43), rows 15-19: nothing is
    written by any of them."""
    two = os.path.join(root, "two.txt")
    mine = os.path.join(root, "mine")
    os.makedirs(mine, exist_ok=True)
    with open(os.path.join(mine, "notes.txt"), "w", encoding="utf-8") as f:
        f.write("my notes\n")
    new = os.path.join(root, "transcoders")
    train = ("features", "train", two, *at.model)
    return (
        Case(15, "features train: --transcoder with --layer (transcoders take --layers)",
             (*train, "--transcoder", "--layer", "1", "--out", new)),
        Case(16, "features train --transcoder: --layers beyond the model's blocks",
             (*train, "--transcoder", "--layers", "0-5", "--out", new)),
        Case(17, "features train: --layers without --transcoder",
             (*train, "--layers", "all", "--out", new)),
        Case(18, "features train --transcoder: --export circuit-tracer for some blocks only",
             (*train, "--transcoder", "--layers", "1", "--export", "circuit-tracer", "--out",
              new)),
        Case(19, "features train --transcoder: --out a folder holding someone else's files",
             (*train, "--transcoder", "--out", mine)),
        Case(20, "features train: --skip without --transcoder (a skip is a transcoder's)",
             (*train, "--skip", "--layer", "1", "--out", new)),
    )


TRAIN_ARGS = ("--latents", "32", "--k", "2", "--tokens", "640", "--batch-tokens", "64")


def _hostile_dictionaries(root: str) -> dict[str, str]:
    """The hostile dictionary folders of issue 41 (rows 6-12 and 14), written under `root`."""
    import numpy as np
    from safetensors.numpy import save_file

    from fptrace.commands.features.train import TrainOptions

    d = seeded(32, 64)
    w = {n: np.ascontiguousarray(getattr(d, n).numpy()) for n in
         ("W_enc", "W_dec", "b_enc", "b_dec")}
    w["threshold"] = np.zeros(64, np.float32)
    out = {}

    def gemmascope(name: str, tensors: dict) -> str:
        folder = os.path.join(root, "gemma-scope-res", "layer_1", name)
        os.makedirs(folder, exist_ok=True)
        np.savez(os.path.join(folder, "params.npz"), **tensors)
        return folder

    def cfg(name: str, **changes: Any) -> str:
        folder = write_seeded(os.path.join(root, name), 32, 64)
        path = os.path.join(folder, "cfg.json")
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        with open(path, "w", encoding="utf-8") as f:
            json.dump({**doc, **changes}, f)
        return folder

    out["cube"] = gemmascope("cube", {**w, "W_enc": w["W_enc"][None]})
    out["skip"] = gemmascope("skip", {**w, "W_skip": np.eye(32, dtype=np.float32)})
    out["empty"] = gemmascope("empty", {**{n: v[:0] for n, v in w.items()},
                                        "W_enc": w["W_enc"][:, :0], "b_dec": w["b_dec"]})
    out["fifo"] = os.path.join(root, "fifo")
    pipe = os.path.join(out["fifo"], "cfg.json")
    if os.path.lexists(pipe):  # made by an earlier run: writing to it would wait for a reader
        os.remove(pipe)
    write_seeded(out["fifo"], 32, 64)
    os.remove(pipe)
    os.mkfifo(pipe)
    out["k"] = cfg("k", architecture="topk", k=65)
    out["switch"] = cfg("switch", apply_b_dec_to_input="false")
    out["turned"] = cfg("turned")
    save_file({**{n: v for n, v in w.items() if n != "threshold"},
               "W_dec": np.ascontiguousarray(w["W_dec"].T)},
              os.path.join(out["turned"], "sae_weights.safetensors"))
    out["loop"] = os.path.join(root, "loop")
    if not os.path.lexists(out["loop"]):
        os.symlink(out["loop"], out["loop"])
    # an interrupted training's state, written as if on other weights of the same width
    out["resume"] = os.path.join(root, "resume")
    os.makedirs(out["resume"], exist_ok=True)
    with open(os.path.join(root, "two.txt"), "w", encoding="utf-8") as f:
        f.write("The cat sat on the mat\nA dog ran to the park\n")
    n = dict(zip(TRAIN_ARGS[::2], TRAIN_ARGS[1::2], strict=True))
    opts = TrainOptions(layer=1, latents=int(n["--latents"]), k=int(n["--k"]),
                        tokens=int(n["--tokens"]), batch_tokens=int(n["--batch-tokens"]))
    with open(os.path.join(out["resume"], "trainer_state.json"), "w", encoding="utf-8") as f:
        json.dump({"step": 5, "losses": [], "options": opts.__dict__, "model": "tiny-gpt2",
                   "weights": "0" * 32, "inputs": "0" * 32, "prompts": 2}, f)
    return out
