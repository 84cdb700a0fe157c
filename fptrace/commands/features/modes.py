"""What `fptrace features` does, declared once (cli/modes.py): read a prompt through
dictionaries, or, after the word `train`, train an SAE or (with a bare `--transcoder`)
transcoders; the refusals, the paragraph of `features --help` and the table of docs/features.md
come from here. What a mode needs (train's --layer and --out) stays in cli.py."""

from __future__ import annotations

from fptrace.cli.modes import Mode

TRAINING = ("--out", "--latents", "--k", "--tokens", "--batch-tokens", "--lr", "--train-seed",
            "--resume")
PAGE = ("--html", "--html is the page of a prompt's features, not of `features train`")
FOLDER = ("--transcoder DIR", "features train: --transcoder is a flag there (train "
          "transcoders), not a folder ({value!r}); put it after the prompt files")


def _sae_refuses(flag: str) -> tuple[str, str]:
    return (flag, f"{flag} is an option of transcoder training (`features train --transcoder "
                  f"{flag} ...`); an SAE trains on one block: --layer L")


MODES = (
    Mode("features train PROMPTS... --transcoder", "a TopK transcoder for each block of "
         "--layers (all by default), trained on the prompt files",
         chosen_by=("train --transcoder",), takes=("--layers", "--export", "--skip", *TRAINING),
         refuses=(PAGE, FOLDER, ("--layer", "features train --transcoder takes --layers SEL "
                                 "(all, 0-29, 3,5,7), not --layer: transcoders are trained "
                                 "block by block"))),
    Mode("features train PROMPTS...", "a TopK SAE of the stream after block --layer, trained "
         "on the prompt files", chosen_by=("train",), takes=("--layer", *TRAINING),
         refuses=(PAGE, _sae_refuses("--layers"), _sae_refuses("--export"),
                  _sae_refuses("--skip"), FOLDER)),
    Mode("features PROMPT", "the prompt read through sparse dictionaries (SAEs, transcoders), "
         "the target's logit split into one term per latent", chosen_by=(),
         takes=("--sae", "--transcoder DIR", "--site", "--latent", "--top-prompts", "--top-n",
                "--target", "--top", "--html"),
         refuses=(("--layers", "--layers is an option of `features train --transcoder`"),
                  ("--export", "--export is an option of `features train --transcoder`"),
                  ("--skip", "--skip is an option of `features train --transcoder`"),
                  ("--transcoder", "--transcoder DIR: give the folder of a transcoder to read "
                                   "(a bare --transcoder is `features train --transcoder`)"))),
)

__all__ = ["MODES"]
