"""The result of `fptrace steer`."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, Check, ModelInfo, Token, TopToken, result

# the targets of the checks this command's results carry (Check.target; `fptrace schema` joins
# every command's, in the order of `fptrace --help`)
CHECK_TARGETS = "`steered_stream` or `lens_logits` (steer)"


@result
class SteeringVectorInfo:
    """The vector added to the stream: where it came from and how large it is."""

    source: str
    """`prompts` (`--add` minus `--subtract`), `pairs` (`--pairs`), `file` (`--vector`), `token`
    (`--token`: the LM head's row of that token) or `latent` (`--sae DIR --latent N`: that
    latent's decoder row)."""
    description: str
    """Where it came from, in words."""
    layers: tuple[int, ...]
    """The blocks whose output receives it (a GGUF's `direction.N` goes to block N)."""
    norms: tuple[float, ...]
    """‖v‖ of the vector added at each of those blocks (at strength 1, after `--norm-match`)."""
    stream_norms: tuple[float, ...]
    """‖stream‖ of the clean run after each of those blocks, at the last position: what the vector's
    norm compares with."""
    norm_matched: bool
    """Whether `--norm-match` scaled each block's vector to that stream norm."""
    method: str | None
    """`--pairs`: `mean` (mean difference) or `pca` (first principal direction); else null."""
    pairs: int | None
    """`--pairs`: how many pairs; else null."""
    path: str | None
    """`--vector` or `--pairs`: the file; else null."""


@result
class SteerRow:
    """One strength of the sweep: the steered run at the last position."""

    scale: float
    """The strength: scale × the vector is added."""
    clean: bool
    """True for the unsteered reference (scale 0), which is part of the same batch."""
    top: tuple[TopToken, ...]
    """The most probable next tokens of the steered run."""
    target: TopToken
    """The target token as the steered run ranks it."""
    logit_change: float
    """The target's logit minus its clean logit."""
    prob_change: float
    """The target's probability minus its clean probability."""
    kl: tuple[float, ...]
    """KL(steered ‖ clean), in nats, of the logit lens at the last position after each block of
    `kl_layers` (final norm and LM head applied to the stream there); the last one is the model's
    own output."""
    lens_top: tuple[str, ...]
    """The logit lens's top-1 token after each block of `kl_layers`."""
    first_changed: int | None
    """The first block whose logit-lens top-1 differs from the clean run's at that block; null when
    none does."""
    continuation: tuple[Token, ...]
    """With `-n N`: the greedy continuation of N tokens (up to an end-of-text token), steered the
    same way; else empty."""
    continuation_text: str | None
    """The continuation decoded as text, or null."""


@result
class Steering:
    """`fptrace steer --json`: a vector added to the residual stream at one or more blocks, at a sweep
    of strengths run in one batched forward pass, and what changed."""

    prompt: str
    """The prompt as given."""
    model: ModelInfo
    """The model that was run."""
    tokens: tuple[Token, ...]
    """The prompt's tokens."""
    vector: SteeringVectorInfo
    """The steering vector."""
    positions: tuple[int, ...] | None
    """The prompt positions the vector is added at; null: every position, generated tokens
    included."""
    target: TopToken
    """The target token (`--target`, default the clean top-1) as the clean run ranks it."""
    rows: tuple[SteerRow, ...]
    """One per strength, the clean reference first when `--scale` did not include 0."""
    kl_layers: tuple[int, ...]
    """The blocks of each row's `kl` and `lens_top`: from the first steered block to the last."""
    new_tokens: int
    """`-n`: tokens of greedy continuation per strength (0: none)."""
    checks: tuple[Check, ...]
    """Checks of this run's own numbers: the stream after the first steered block differs from the
    clean one by exactly scale × the vector (target `steered_stream`), and the logit lens of the last
    block is the model's own logits (target `lens_logits`)."""
    ok: bool
    """Whether every check passes; `fptrace steer` exits with 5 when not."""
    forward_passes: int
    """Forward passes run: measuring the vector, the clean norms (`--norm-match`), the sweep (one,
    every strength a row of it) and the continuation steps."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers (random weights, llama.cpp, ...)."""
    kind: str = "steering"
    schema_version: str = SCHEMA_VERSION
