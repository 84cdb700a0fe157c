"""Where in the model a dictionary reads (and, for a transcoder, writes): one typed value, and
the names the formats people download use for them (read by fptrace.addresses.parse_site, the
one parser of places).

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

from dataclasses import dataclass

from fptrace.addresses import parse_site
from fptrace.errors import BadInput
from fptrace.points import Point

POINTS = ("resid_pre", "resid_post", "mlp_in", "mlp_out")
# the trace point (fptrace.points) of each place a dictionary reads; mlp_in is the MLP's input,
# after its norm: ln2
OF_POINT = {Point.resid_pre: "resid_pre", Point.resid_post: "resid_post", Point.ln2: "mlp_in",
            Point.mlp_out: "mlp_out"}


@dataclass(frozen=True)
class Site:
    """One place of the stream: a block and a point of POINTS."""

    block: int
    point: str

    @property
    def name(self) -> str:
        """TransformerLens's name of the place (`blocks.15.hook_resid_post`)."""
        return f"blocks.{self.block}.hook_{self.point}"

    def same_tensor(self, other: Site) -> bool:
        """Whether the two name the same tensor (resid_post L is resid_pre L+1)."""
        return _canonical(self) == _canonical(other)

    def __str__(self) -> str:
        return self.name


def _canonical(s: Site) -> tuple[int, str]:
    return (s.block + 1, "resid_pre") if s.point == "resid_post" else (s.block, s.point)


def dictionary_site(text: str, what: str = "the hook name") -> Site:
    """The place a dictionary's hook name (in any spelling of the module's text) names, read by
    the one parser of places (fptrace.addresses.parse_site) and seen as a dictionary sees it."""
    s = str(text).strip()
    if s.endswith("mlp.hook_post"):
        raise BadInput(f"{what} {text!r}: the MLP's hidden activations are not a place of the "
                       "stream; fptrace reads dictionaries of the stream, the MLP's input and "
                       "the MLP's output")
    try:
        place = parse_site(s, what)
    except BadInput:
        place = None
    point = None if place is None else OF_POINT.get(place.point)
    if place is None or point is None or place.layer < 0:  # a config names its block from 0
        raise BadInput(f"{what} {text!r}: not a place fptrace knows; give "
                       "blocks.L.hook_resid_pre, blocks.L.hook_resid_post, blocks.L.hook_mlp_out, "
                       "blocks.L.hook_mlp_in, layers.L or layers.L.mlp")
    return Site(place.layer, point)


__all__ = ["POINTS", "Site", "dictionary_site"]
