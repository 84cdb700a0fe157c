"""The result of `fptrace ablate`."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, Check, ModelInfo, Token, TopToken, result

# 1.8: AblatedRun.experts (the parts are typed where they are made; no label is read back)
SCHEMA_SINCE = "1.8"

# the targets of the checks this command's results carry (Check.target; `fptrace schema` joins
# every command's, in the order of `fptrace --help`)
CHECK_TARGETS = ("`ablated_attention`, `ablated_block`, `ablated_experts` or `ablated_latent` "
                 "(ablate)")


@result
class AblatedRun:
    """One run with some parts removed, and what the target's logit did."""

    parts: tuple[str, ...]
    """The parts removed together in this run: `L.H` for attention head H of block L, `mlp L` for
    the MLP of block L, `LnEm` for routed expert m of block n's mixture of experts (`--expert`),
    `latent N (site)` for what latent N of an SAE wrote (`--sae --latent`)."""
    logit: float
    """The target's logit with them removed (before any final softcap, like `fptrace attribute`)."""
    prob: float
    """The target's probability with them removed."""
    rank: int
    """The target's rank with them removed (1: still the top-1)."""
    logit_change: float
    """The total effect: logit minus the clean logit (negative: the parts were pushing the target
    up)."""
    prob_change: float
    """prob minus the clean probability."""
    direct: float | None
    """The direct effect: the change their writes into the stream make straight through the final
    norm (frozen at its clean value) and the LM head, without later blocks reacting: minus their
    contributions in `fptrace attribute` (mean mode: minus the contribution of the part minus that
    of its mean); for experts, the change their removal makes to their block's output at the last
    position (the block's input unchanged: minus their weighted outputs, plus what the other
    experts' new weights add) through the same frozen norm. Null for heads of a block whose heads
    do not add up to its attention output."""
    indirect: float | None
    """logit_change − direct: what later blocks did with the change (and the final norm's
    rescaling); null with direct."""
    top: TopToken
    """The top-1 next token with the parts removed."""
    experts: bool = False
    """Whether a routed expert is among the parts (its removal takes it out of its router's
    choice)."""


@result
class Ablation:
    """`fptrace ablate --json`: the target's logit with attention heads or MLPs removed (their output
    set to zero or to its mean), the total effect next to the direct effect from attribution."""

    prompt: str
    """The prompt as given."""
    model: ModelInfo
    """The model that was run."""
    tokens: tuple[Token, ...]
    """The prompt's tokens."""
    mode: str
    """`zero` (a removed part outputs zeros) or `mean` (its output averaged over positions)."""
    mean_over: str | None
    """With `mean`: the file of prompts averaged over (`--mean-over`), or null for the prompt's own
    positions."""
    mean_positions: int | None
    """With `mean`: how many positions were averaged; else null."""
    target: TopToken
    """The token whose logit is followed (`--target`, default the clean top-1), as the clean run
    ranks it."""
    clean_logit: float
    """Its clean logit (before any final softcap)."""
    runs: tuple[AblatedRun, ...]
    """`--head`/`--mlp`: each part alone, then (more than one) all of them together."""
    head_grid: tuple[tuple[float, ...], ...]
    """`--all-heads`: blocks × heads, the target's logit change with that one head removed (empty
    otherwise)."""
    mlp_column: tuple[float, ...]
    """`--all-mlps`: per block, the target's logit change with that MLP removed (empty otherwise)."""
    largest: tuple[AblatedRun, ...]
    """The grid's runs of largest |logit change|, largest first (empty without a grid)."""
    checks: tuple[Check, ...]
    """Checks of this run's own numbers: at the first block a run changes, what the stream
    received from attention is the clean attention output minus the removed heads' writes through
    W_O plus their replacement (`ablated_attention`), and what the block added is its attention and
    MLP outputs, the replaced MLP output included (`ablated_block`); where only experts are removed
    at that block, its MoE output is the clean one with the removed experts' weighted outputs
    taken out and the new weights' put in, each expert run alone by the model's own experts
    module (`ablated_experts`); with `--sae --latent`, after
    the SAE's block the ablated stream differs from the clean one by exactly −aᵢ·dᵢ at the last
    position (`ablated_latent`)."""
    ok: bool
    """Whether every check passes; `fptrace ablate` exits with 5 when not."""
    forward_passes: int
    """Forward passes run: the clean one, the means (mean mode), and the batches of ablated runs."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers (random weights, softcaps, ...)."""
    kind: str = "ablation"
    schema_version: str = SCHEMA_VERSION
