"""Routing flips: where two runs of a mixture of experts on the same tokens (float32 against
bfloat16, a quantized side, a nudged router) choose different sets of experts.

Both traces carry their routing (`run --json`'s `routing`: per MoE block and position, the
experts chosen, as each run's own router returned them). A flip is a block and position whose
chosen sets differ (the order by weight is not a flip); the first flip is the lowest block's
first position. How far the runs had parted there is read from the layer rows of the diff:
the last position's relative difference entering that block and leaving it.
"""

from __future__ import annotations

from fptrace.commands.diff.result import LayerDiff, RoutingDiff, RoutingFlip

SHOWN = 50  # flips listed (all are counted)


def routing_diff(a: dict, b: dict, rows: tuple[LayerDiff, ...] | list[LayerDiff]
                 ) -> RoutingDiff | None:
    """The routing flips of two traces (as `run --json` dicts), or None when they cannot be
    compared (one is dense, their experts differ in number, or their tokens differ)."""
    ra, rb = a.get("routing"), b.get("routing")
    if not ra or not rb or ra.get("n_experts") != rb.get("n_experts"):
        return None
    if [t["id"] for t in a["tokens"]] != [t["id"] for t in b["tokens"]]:
        return None
    texts = [t["text"] for t in a["tokens"]]
    blocks_b = {blk["layer"]: blk for blk in rb["blocks"]}
    flips: list[RoutingFlip] = []
    compared = 0
    for ba in ra["blocks"]:
        bb = blocks_b.get(ba["layer"])
        if bb is None:
            continue
        for pos, (ea, eb) in enumerate(zip(ba["experts"], bb["experts"], strict=False)):
            compared += 1
            if set(ea) != set(eb):
                flips.append(RoutingFlip(
                    layer=ba["layer"], position=pos, text=texts[pos] if pos < len(texts) else "",
                    experts_a=tuple(ea), weights_a=tuple(ba["weights"][pos]),
                    experts_b=tuple(eb), weights_b=tuple(bb["weights"][pos])))
    first = flips[0] if flips else None
    before = at = None
    if first is not None:
        rel = {r.layer: r.rel_diff for r in rows}  # None: the embedding row
        before = rel.get(first.layer - 1 if first.layer > 0 else None)
        at = rel.get(first.layer)
    return RoutingDiff(compared=compared, flipped=len(flips), flips=tuple(flips[:SHOWN]),
                       first=first, parted_before=before, parted_at=at)


__all__ = ["SHOWN", "routing_diff"]
