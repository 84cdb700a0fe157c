"""The result of `fptrace features`."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, Check, ModelInfo, Token, TopToken, result

# the targets of the checks this command's results carry (`fptrace schema` joins them)
CHECK_TARGETS = "`decomposition` (features)"
# 1.4: the features kinds arrive; 1.7: features_train_transcoders; 1.11: skip transcoders
SCHEMA_SINCE = "1.11"


@result
class LatentValue:
    """One latent of a dictionary at one position."""

    latent: int
    """The latent's index in the dictionary (0 .. d_sae − 1)."""
    activation: float
    """Its activation aᵢ: what multiplies its decoder row dᵢ."""


@result
class PositionFeatures:
    """A dictionary's readout of one position."""

    position: int
    """Position in the prompt, from 0."""
    norm: float
    """‖x‖ of the vector the dictionary reconstructs here (the stream, or for a transcoder the
    MLP's output)."""
    error_norm: float
    """‖error‖: x − (Σ aᵢ·dᵢ + b_dec), a skip transcoder's skip term x_in·W_skip included in
    what is subtracted."""
    relative_error: float
    """‖error‖² / ‖x‖²."""
    l0: int
    """How many latents are active (aᵢ ≠ 0)."""
    massive: bool
    """Whether ‖x‖ here is over ten times the median of the prompt's positions (a massive
    activation, usually the first token): left out of `fvu`, reported on its own."""
    top: tuple[LatentValue, ...]
    """The largest activations, largest first."""
    skip_norm: float | None = None
    """A skip transcoder's ‖x·W_skip‖ here (its affine term, beside the latents); null without
    one."""


@result
class LatentTerm:
    """A latent's part of the target's logit: aᵢ · (dᵢ through the frozen final norm · u)."""

    latent: int
    """The latent's index."""
    activation: float
    """Its activation at the last position."""
    logits: float
    """Its term, in logits."""


@result
class FeatureAttribution:
    """The direct logit attribution of the target at the last position, split through the
    dictionary: the stream entering the final norm is the dictionary's site plus what the later
    parts added, and the site is Σ aᵢ·dᵢ + b_dec + error; the final norm is frozen at its actual
    value (as `fptrace attribute` does), so every term is a number of logits and they sum to the
    model's logit."""

    target: TopToken
    """The target token (`--target`, default the model's top-1)."""
    model_logit: float
    """The model's own logit of the target, before any final softcap."""
    latents: tuple[LatentTerm, ...]
    """The largest latent terms by |logits|, largest first."""
    other_latents: float
    """The terms of the active latents not listed, summed."""
    latent_sum: float
    """Σ over every active latent of its term."""
    b_dec: float
    """The decoder bias's term."""
    error: float
    """The error term's: what the dictionary misses, in logits."""
    rest: float
    """Everything the stream holds besides the site (the blocks after it, or for an MLP site
    everything but that MLP's output), in logits."""
    biases: float
    """The final norm's bias and the LM head's bias for the target (0 when the model has none)."""
    total: float
    """latent_sum + skip + b_dec + error + rest + biases."""
    difference: float
    """total − model_logit."""
    tolerance: str
    """The rule `difference` is held to."""
    skip: float | None = None
    """A skip transcoder's skip term (x·W_skip, the affine part of its output), in logits; null
    without one."""


@result
class LatentTrace:
    """`--latent N`: one latent followed over the prompt's positions."""

    latent: int
    """The latent's index."""
    activations: tuple[float, ...]
    """Its activation at each position."""
    decoder_norm: float
    """‖dᵢ‖, its decoder row's norm: activation × this is how much it writes."""


@result
class DictionaryReadout:
    """One dictionary's readout of the prompt."""

    path: str
    """The folder given (`--sae`/`--transcoder`)."""
    format: str
    """saelens, gemmascope or sparsify."""
    activation: str
    """Its activation function: relu, jumprelu, topk or batchtopk."""
    role: str
    """sae (reconstructs what it reads) or transcoder (reads the MLP's input, reconstructs its
    output)."""
    site: str
    """Where it reads, TransformerLens's name (`blocks.15.hook_resid_post`)."""
    out_site: str
    """What it reconstructs (the same as `site` for an SAE)."""
    d_sae: int
    """Latents in the dictionary."""
    k: int | None
    """TopK: latents kept per position; else null."""
    positions: tuple[PositionFeatures, ...]
    """Per position, the readout."""
    fvu: float | None
    """Fraction of variance unexplained, Σ‖error‖² / Σ‖x − mean x‖², over the positions that are
    not massive; null with fewer than two such positions."""
    l0: float
    """Mean active latents per position."""
    decomposition_gap: float
    """max over positions of ‖Σ aᵢ·dᵢ (active latents) + b_dec (+ x_in·W_skip) + error − x‖ /
    max(1, ‖x‖), computed in float64 from the float32 encoding: the decomposition's check."""
    attribution: FeatureAttribution | None
    """The target's logit split through this dictionary; null where it does not sum (the note
    says by how much) or when the dictionary's site is not part of the final stream."""
    latent: LatentTrace | None
    """`--latent N`: that latent over the positions; else null."""
    skip: bool = False
    """Whether it is a skip transcoder: its output a·W_dec + b_dec + x·W_skip, the skip term
    counted in the decomposition and the logit split as its own term."""


@result
class TopActivation:
    """`--top-prompts`: one of the places where a latent is largest."""

    prompt_id: str
    """The prompt's id (file stem:line, or a .jsonl id)."""
    position: int
    """The position in that prompt."""
    token: str
    """The token there."""
    activation: float
    """The latent's activation there."""
    context: str
    """The prompt's text up to and including that token (the last 60 characters)."""


@result
class Features:
    """`fptrace features --json`: the stream read through sparse dictionaries (SAEs, transcoders),
    with the part each misses, summing exactly."""

    prompt: str
    """The prompt as given."""
    model: ModelInfo
    """The model that was run."""
    tokens: tuple[Token, ...]
    """The prompt's tokens."""
    dictionaries: tuple[DictionaryReadout, ...]
    """One per `--sae`/`--transcoder`, in the order given."""
    top_prompts: tuple[TopActivation, ...]
    """`--top-prompts FILE --latent N`: the places over those prompts where latent N of the first
    dictionary is largest, largest first; else empty."""
    prompts_read: int
    """`--top-prompts`: prompts run; else 0."""
    checks: tuple[Check, ...]
    """The decomposition of each dictionary (target `decomposition`): latents + b_dec + error
    reproduce the vector it reads to 1e-6 relative."""
    ok: bool
    """Whether every check passes; `fptrace features` exits with 5 when not."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers."""
    kind: str = "features"
    schema_version: str = SCHEMA_VERSION


@result
class TrainResult:
    """`fptrace features train --json`: a TopK SAE trained on the stream after one block,
    written in the SAELens layout."""

    out: str
    """The folder written: cfg.json and sae_weights.safetensors (SAELens's layout), and the
    trainer's state for --resume."""
    model: ModelInfo
    """The model whose stream it was trained on."""
    layer: int
    """The block after which the stream was read."""
    site: str
    """That place's name (`blocks.L.hook_resid_post`), written as hook_name in cfg.json."""
    latents: int
    """Latents (d_sae)."""
    k: int
    """Latents kept per token (TopK)."""
    prompts: int
    """Training prompts."""
    held_out_prompts: int
    """Prompts held out for the evaluation."""
    train_tokens: int
    """Positions collected from the training prompts (each prompt's first position left out:
    the massive activation)."""
    held_out_tokens: int
    """Positions of the held-out prompts (first positions left out)."""
    steps: int
    """Optimiser steps in all."""
    resumed_from: int
    """The step an interrupted run was resumed from (0: a fresh run)."""
    tokens_seen: int
    """Training tokens the optimiser saw (steps × batch; the positions are reused epoch after
    epoch when there are fewer)."""
    first_loss: float
    """The first step's loss (the batch's FVU, plus the AuxK term when latents are dead)."""
    last_loss: float
    """The mean loss of the last ten steps."""
    loss_curve: tuple[float, ...]
    """The loss at about fifty evenly spaced steps."""
    fvu: float
    """Fraction of variance unexplained on the held-out positions: Σ‖x − x̂‖² / Σ‖x − mean‖²."""
    l0: float
    """Mean active latents per held-out position."""
    dead_latents: int
    """Latents that fire on no held-out position."""
    seconds: float
    """Training time (the collection of the stream not included)."""
    kind: str = "features_train"
    schema_version: str = SCHEMA_VERSION


@result
class TranscoderLayer:
    """One block's transcoder, trained by `features train --transcoder`."""

    layer: int
    """The block whose MLP it replaces."""
    folder: str
    """Its folder (SAELens's layout: cfg.json + sae_weights.safetensors), `layer_{layer}` inside
    the run's folder."""
    site: str
    """What it reads: the MLP's input, after the norm before it (`blocks.L.hook_mlp_in`)."""
    out_site: str
    """What it rebuilds: what the MLP adds to the stream (`blocks.L.hook_mlp_out`)."""
    fvu: float
    """Fraction of the MLP output's variance it leaves unexplained on the held-out positions:
    Σ‖y − ŷ‖² / Σ‖y − mean y‖²."""
    l0: float
    """Mean active latents per held-out position (k, unless a position has fewer than k positive
    pre-activations)."""
    dead_latents: int
    """Latents that fire on no held-out position."""
    steps: int
    """Optimiser steps."""
    resumed_from: int
    """The step this run resumed the block's training from (0: from the start)."""
    kept: bool
    """Whether the block was trained by an earlier, interrupted run and kept as it was
    (`--resume`); its figures are that run's."""
    first_loss: float
    """The first step's loss (the batch's FVU, plus the AuxK term when latents are dead)."""
    last_loss: float
    """The mean loss of the last ten steps."""
    seconds: float
    """Training time of this block (in the run that trained it)."""
    export_threshold: float | None
    """`--export circuit-tracer`: the JumpReLU threshold θ the export uses instead of TopK (one
    for every latent: the value that fires k latents a position on average over the training
    positions); else null."""
    export_fvu: float | None
    """`--export circuit-tracer`: the held-out FVU of the exported JumpReLU transcoder; else
    null."""
    export_l0: float | None
    """`--export circuit-tracer`: the exported transcoder's mean active latents per held-out
    position; else null."""


@result
class TranscodersResult:
    """`fptrace features train --transcoder --json`: one TopK transcoder per block, each
    reading the MLP's input and rebuilding its output, trained from one collection pass."""

    out: str
    """The run's folder: `layer_{L}` per block (SAELens's layout), transcoders.json (the run's
    state, for --resume) and, with --export circuit-tracer, `circuit-tracer/`."""
    model: ModelInfo
    """The model whose MLPs were read."""
    layers: tuple[TranscoderLayer, ...]
    """One per block trained, in block order."""
    latents: int
    """Latents of each transcoder (d_sae)."""
    k: int
    """Latents kept per token (TopK)."""
    prompts: int
    """Training prompts."""
    held_out_prompts: int
    """Prompts held out for the evaluation."""
    train_tokens: int
    """Positions collected from the training prompts (each prompt's first position left out)."""
    held_out_tokens: int
    """Positions of the held-out prompts (first positions left out)."""
    tokens_seen: int
    """Training tokens each block's optimiser saw (steps × batch)."""
    fvu_median: float
    """The median over the blocks of the held-out FVU."""
    collected: bool
    """Whether this run collected the MLPs' inputs and outputs (false: a resumed run reused the
    collection an interrupted one had finished, or had every block already)."""
    collect_seconds: float
    """Time of the collection pass in this run (0 when it was reused)."""
    seconds: float
    """Time of this run's training and writing (the collection not included)."""
    export: str | None
    """`circuit-tracer` with --export circuit-tracer; else null."""
    export_folder: str | None
    """The exported folder (layer_{L}.safetensors + config.yaml); else null."""
    skip: bool = False
    """Skip transcoders (--skip): each output is a·W_dec + b_dec + x·W_skip, the FVU counting
    the skip term."""
    kind: str = "features_train_transcoders"
    schema_version: str = SCHEMA_VERSION
