"""`fptrace diff --stats A.json B.json`: two statistics files compared channel by channel.

For every site of every layer (the same model, or two versions of one architecture: before and
after quantization or fine-tuning), each channel's largest |x| in A and in B and how far it
moved, |absmax_b − absmax_a| / absmax_a (a channel whose |x| max is below 1 % of its site's
largest is measured against that 1 %: the moves of near-silent channels are noise); per site
the median and largest move, and over all sites the channels that moved most. Files of different shapes (layers, sites, widths) are
refused.
"""

from __future__ import annotations

from fptrace.commands.diff.notes import STATS_DIFF_PROMPTS
from fptrace.commands.diff.result import ChannelMove, SiteMove, StatsDiff
from fptrace.core.activation_stats import read_statistics
from fptrace.errors import BadInput

SHOWN = 20  # channels listed
FLOOR = 0.01  # a channel's move is relative to its |x| max, or to 1 % of the site's largest


def diff_stats(path_a: str, path_b: str, shown: int = SHOWN) -> StatsDiff:
    import numpy as np

    doc_a, a = read_statistics(path_a)
    doc_b, b = read_statistics(path_b)
    sites_a, sites_b = list(a.all_sites()), list(b.all_sites())
    shape_a = [(layer, s.name, s.stats.width) for layer, s in sites_a]
    if shape_a != [(layer, s.name, s.stats.width) for layer, s in sites_b]:
        raise BadInput(f"{path_a} and {path_b} hold statistics of differently shaped models "
                       "(layers, sites or widths differ): nothing to compare channel by channel")
    moves, candidates = [], []
    for (layer, sa), (_, sb) in zip(sites_a, sites_b):
        x, y = sa.stats, sb.stats
        if x.count == 0 or y.count == 0:
            continue
        floor = max(FLOOR * float(x.absmax.max()), 1e-30)  # tiny channels: moves of noise
        change = np.abs(y.absmax - x.absmax) / np.maximum(x.absmax, floor)  # (d,)
        c = int(change.argmax())
        moves.append(SiteMove(layer=layer, site=sa.name, median_change=float(np.median(change)),
                              max_change=float(change[c]), channel=c))
        mean_a, mean_b, std_a, std_b = x.mean, y.mean, x.std, y.std
        for k in np.argsort(-change, kind="stable")[:shown].tolist():
            candidates.append(ChannelMove(
                layer=layer, site=sa.name, channel=k, absmax_a=float(x.absmax[k]),
                absmax_b=float(y.absmax[k]), change=float(change[k]), mean_a=float(mean_a[k]),
                mean_b=float(mean_b[k]), std_a=float(std_a[k]), std_b=float(std_b[k])))
    candidates.sort(key=lambda m: -m.change)
    same = a.prompts == b.prompts
    notes = [] if same else [STATS_DIFF_PROMPTS()]
    return StatsDiff(a=path_a, b=path_b, model_a=str(doc_a.get("model", {}).get("name")),
                     model_b=str(doc_b.get("model", {}).get("name")),
                     prompts_a=len(a.prompts), prompts_b=len(b.prompts), same_prompts=same,
                     sites=tuple(moves), channels=tuple(candidates[:shown]), notes=tuple(notes))


__all__ = ["diff_stats"]
