"""Where `fptrace steer`'s vector comes from, declared once (cli/modes.py): each source, the
options that choose it and those it takes; the refusals, the paragraph of `steer --help` and
the table of docs/steer.md come from here. One source must be given: there is no default."""

from __future__ import annotations

from fptrace.cli.modes import Mode

MODES = (
    Mode("steer --sae DIR --latent N", "latent N's decoder row, added where the SAE writes",
         chosen_by=("--sae", "--latent"), takes=()),
    Mode("steer --vector FILE", "a saved vector, one per block or one for --layer",
         chosen_by=("--vector",), takes=("--layer",)),
    Mode("steer --pairs FILE", "the mean (or first principal) difference of contrastive pairs' "
         "streams", chosen_by=("--pairs",), takes=("--layer", "--method", "--mean-positions")),
    Mode("steer --add A --subtract B", "the stream of one text minus another's",
         chosen_by=("--add", "--subtract"), takes=("--layer", "--mean-positions")),
    Mode("steer --token T", "the LM head's row of a token", chosen_by=("--token",),
         takes=("--layer",)),
)
MISSING = "give one source of the steering vector"

__all__ = ["MISSING", "MODES"]
