"""Where in the model a dictionary reads (and, for a transcoder, writes): one typed value, and
the one parser of the hook names the formats people download use.

    blocks.L.hook_resid_pre     the stream entering block L            (SAELens, TransformerLens)
    blocks.L.hook_resid_post    the stream leaving block L
    blocks.L.hook_mlp_out       what block L's MLP adds to the stream
    blocks.L.hook_mlp_in        the MLP's input (after its norm); also blocks.L.ln2.hook_normalized
    layers.L                    the output of block L, i.e. resid_post  (EleutherAI sparsify)
    layers.L.mlp                block L's MLP: its output (an SAE) or input → output (transcoder)
    model.layers.L[.output]     the output of block L (Hugging Face module names)

resid_post of block L and resid_pre of block L+1 are the same tensor; the printer writes the name
the dictionary's own config used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fptrace.errors import BadInput
from fptrace.numbers import parse_int

POINTS = ("resid_pre", "resid_post", "mlp_in", "mlp_out")

_TL = re.compile(r"blocks\.([^.]+)\.(hook_resid_pre|hook_resid_post|hook_mlp_out|hook_mlp_in|"
                 r"ln2\.hook_normalized|mlp\.hook_post)")
_HF = re.compile(r"(?:model\.)?layers\.([^.]+)(\.output|\.mlp(?:\.output)?|\.mlp\.input)?")
_TL_POINT = {"hook_resid_pre": "resid_pre", "hook_resid_post": "resid_post",
             "hook_mlp_out": "mlp_out", "hook_mlp_in": "mlp_in", "ln2.hook_normalized": "mlp_in"}


@dataclass(frozen=True)
class Site:
    """One place of the stream: a block and a point of POINTS."""

    block: int
    point: str

    @property
    def name(self) -> str:
        """TransformerLens's name of the place (`blocks.15.hook_resid_post`)."""
        return f"blocks.{self.block}.hook_{self.point}"

    def same_tensor(self, other: "Site") -> bool:
        """Whether the two name the same tensor (resid_post L is resid_pre L+1)."""
        return _canonical(self) == _canonical(other)

    def __str__(self) -> str:
        return self.name


def _canonical(s: Site) -> tuple[int, str]:
    return (s.block + 1, "resid_pre") if s.point == "resid_post" else (s.block, s.point)


def parse_site(text: str, what: str = "the hook name") -> Site:
    """A hook name in one of the spellings of the module's text (`layers.L.mlp` is the MLP's
    output; a transcoder's reader takes its input side from there)."""
    s = str(text).strip()
    m = _TL.fullmatch(s)
    if m is not None:
        if m.group(2) == "mlp.hook_post":
            raise BadInput(f"{what} {text!r}: the MLP's hidden activations are not a place of the "
                           "stream; fptrace reads dictionaries of the stream, the MLP's input "
                           "and the MLP's output")
        return Site(parse_int(m.group(1), f"{what} {text!r}: block", low=0), _TL_POINT[m.group(2)])
    m = _HF.fullmatch(s)
    if m is not None:
        block = parse_int(m.group(1), f"{what} {text!r}: block", low=0)
        tail = m.group(2) or ""
        if tail.startswith(".mlp"):
            return Site(block, "mlp_in" if tail == ".mlp.input" else "mlp_out")
        return Site(block, "resid_post")
    raise BadInput(f"{what} {text!r}: not a place fptrace knows; give blocks.L.hook_resid_pre, "
                   "blocks.L.hook_resid_post, blocks.L.hook_mlp_out, blocks.L.hook_mlp_in, "
                   "layers.L or layers.L.mlp")


__all__ = ["Site", "parse_site", "POINTS"]
