"""What `fptrace ablate` removes, declared once (cli/modes.py): parts of the model (heads, MLPs,
routed experts, or every head or MLP in turn) or one latent of an SAE; the refusals, the
paragraph of `ablate --help` and the table of docs/ablate.md come from here. The rules within a
mode (--route with --expert, --mean-over with --mode mean) stay in core.py."""

from __future__ import annotations

from fptrace.cli.modes import Mode

MODES = (
    Mode("ablate --sae DIR --latent N", "what one latent of an SAE wrote, removed at every "
         "position", chosen_by=("--sae", "--latent"), takes=()),
    Mode("ablate", "heads, MLPs or routed experts removed, each alone and then together, or "
         "every head or MLP in turn", chosen_by=(),
         takes=("--head", "--mlp", "--expert", "--all-heads", "--all-mlps", "--mode",
                "--mean-over", "--route")),
)

__all__ = ["MODES"]
