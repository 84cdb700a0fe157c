"""Where in the model a dictionary reads (and, for a transcoder, writes): an addresses.Site, the
one place type (resid_pre, resid_post, ln2 for the MLP's input, mlp_out), and the names the
formats people download use for them (read by fptrace.addresses.parse_site, the one parser of
places).

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

from fptrace.addresses import Site, parse_site
from fptrace.errors import BadInput
from fptrace.points import Point

# the places a dictionary reads or writes, as fptrace.addresses.Site's points (the one place
# type), and the name each has in TransformerLens's hooks; the MLP's input is ln2's output
MLP_IN = Point.ln2
POINTS = (Point.resid_pre, Point.resid_post, MLP_IN, Point.mlp_out)
TL_NAMES = {Point.resid_pre: "resid_pre", Point.resid_post: "resid_post", MLP_IN: "mlp_in",
            Point.mlp_out: "mlp_out"}


def hook_name(site: Site) -> str:
    """TransformerLens's name of a dictionary's place (`blocks.15.hook_resid_post`)."""
    return f"blocks.{site.layer}.hook_{TL_NAMES[site.point]}"


def same_tensor(a: Site, b: Site) -> bool:
    """Whether two places name the same tensor (resid_post L is resid_pre L+1)."""
    return _canonical(a) == _canonical(b)


def _canonical(s: Site) -> tuple[int, Point]:
    return (s.layer + 1, Point.resid_pre) if s.point is Point.resid_post else (s.layer, s.point)


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
    # a config names its block from 0
    if place is None or place.point not in TL_NAMES or place.layer < 0:
        raise BadInput(f"{what} {text!r}: not a place fptrace knows; give "
                       "blocks.L.hook_resid_pre, blocks.L.hook_resid_post, blocks.L.hook_mlp_out, "
                       "blocks.L.hook_mlp_in, layers.L or layers.L.mlp")
    return Site(place.layer, place.point)


__all__ = ["MLP_IN", "POINTS", "TL_NAMES", "dictionary_site", "hook_name", "same_tensor"]
