"""What the statistics show: massive activations (Sun et al., 2024), LLM.int8() outlier
dimensions (Dettmers et al., 2022), each layer's top channels and the attention-sink heads, drawn
from an ActivationStats with the thresholds of StatsSettings. Pure functions of the statistics:
merged or resumed statistics give the findings one pass gives."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fptrace.commands.stats.result import (
    ExpertLoad,
    MassiveActivation,
    OutlierDimension,
    Share,
    SinkHead,
    TopChannel,
)
from fptrace.core.activation_stats import SINK_THRESHOLD, ActivationStats

OUTLIER_MIN = 6.0  # LLM.int8(): magnitude >= 6 ...
OUTLIER_POSITIONS = 0.06  # ... at >= 6 % of the positions (sequence dimensions) ...
OUTLIER_LAYERS = 0.25  # ... in >= 25 % of the layers
OUTLIER_SITES = ("attn_in", "mlp_in")  # where LLM.int8() looked: the attention and FFN inputs
SHOWN = 3  # positions and tokens listed per massive channel


def _text(stats: ActivationStats, token: int) -> str:
    return stats.token_texts.get(token, f"<{token}>") if token >= 0 else ""


def _shares(c: Counter, total: int, stats: ActivationStats | None) -> tuple[Share, ...]:
    top = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:SHOWN]
    return tuple(Share(value=int(k), text=_text(stats, k) if stats is not None else "",
                       count=int(n), share=n / total if total else 0.0) for k, n in top)


def massive_activations(stats: ActivationStats) -> tuple[MassiveActivation, ...]:
    """The tallies of every (layer, channel), one entry per channel, largest first."""
    by_channel: dict[int, list] = {}
    for (layer, channel), t in stats.massive.items():
        by_channel.setdefault(channel, []).append((layer, t))
    n_prompts = max(len(stats.prompts), 1)
    out = []
    for channel, tallies in by_channel.items():
        layer, top = min(tallies, key=lambda lt: (-abs(lt[1].value), lt[1].prompt,
                                                  lt[1].position, lt[0]))
        positions: Counter = Counter()
        tokens: Counter = Counter()
        for _, t in tallies:
            positions.update(t.positions)
            tokens.update(t.tokens)
        count = sum(t.count for _, t in tallies)
        out.append(MassiveActivation(
            channel=channel, layers=tuple(sorted(l for l, _ in tallies)), value=top.value,
            layer=layer, ratio=top.ratio if top.ratio != float("inf") else None,
            prompt=stats.prompts[top.prompt], position=top.position, count=count,
            prompt_share=max(t.prompts for _, t in tallies) / n_prompts,
            positions=_shares(positions, count, None), tokens=_shares(tokens, count, stats)))
    return tuple(sorted(out, key=lambda m: (-abs(m.value), m.channel)))


def outlier_dimensions(stats: ActivationStats) -> tuple[OutlierDimension, ...]:
    """Dimensions with |x| >= 6 at >= 6 % of the positions of the attention or MLP input in
    >= 25 % of the layers. The share is exact: 6 is an edge of the histograms."""
    import numpy as np

    edge = stats.bins.index(OUTLIER_MIN)  # bins from this one on hold |x| >= 6
    affected: dict[int, list[int]] = {}
    share: dict[int, float] = {}
    absmax: dict[int, float] = {}
    for layer, sites in enumerate(stats.layers):
        hit = None
        for name in OUTLIER_SITES:
            s = sites.get(name)
            if s is None or s.stats.count == 0:
                continue
            frac = s.stats.hist[:, edge:].sum(1) / s.stats.count  # (d,)
            ok = frac >= OUTLIER_POSITIONS
            for c in np.flatnonzero(ok).tolist():
                share[c] = max(share.get(c, 0.0), float(frac[c]))
                absmax[c] = max(absmax.get(c, 0.0), float(s.stats.absmax[c]))
            hit = ok if hit is None or len(hit) != len(ok) else hit | ok
        if hit is not None:
            for c in np.flatnonzero(hit).tolist():
                affected.setdefault(c, []).append(layer)
    need = OUTLIER_LAYERS * stats.n_layers
    out = [OutlierDimension(channel=c, layers=tuple(ls), share=share[c], absmax=absmax[c])
           for c, ls in affected.items() if len(ls) >= need]
    return tuple(sorted(out, key=lambda o: (-len(o.layers), -o.absmax, o.channel)))


def top_channels(stats: ActivationStats, k: int) -> tuple[TopChannel, ...]:
    """Per layer, the k channels of the residual stream with the largest |x|."""
    import numpy as np

    out = []
    for layer, sites in enumerate(stats.layers):
        s = sites.get("resid_post")
        if s is None or s.stats.count == 0:
            continue
        st = s.stats
        absmax, value, std, mean = st.absmax, st.absmax_value, st.std, st.mean
        prompt, position, token = st.argmax_prompt, st.argmax_position, st.argmax_token
        order = np.lexsort((np.arange(len(absmax)), -absmax))[:k]  # largest, then lowest index
        for rank, c in enumerate(order.tolist(), start=1):
            out.append(TopChannel(
                layer=layer, rank=rank, channel=c, value=float(value[c]), mean=float(mean[c]),
                std=float(std[c]), prompt=stats.prompts[int(prompt[c])],
                position=int(position[c]), token=int(token[c]),
                text=_text(stats, int(token[c]))))
    return tuple(out)


def queries_after(stats: ActivationStats) -> Any:
    """(P,): per position j < sink_positions, the query positions after j over all prompts: what
    the attention a head gives j is a share of (docs/stats.md). sink_queries counts those after
    position 0; a prompt of n tokens has n - 1 - j after j, so the count after j is sink_queries
    less, for k = 1 … j, the prompts longer than k (position_tokens counts them)."""
    import numpy as np

    longer = np.array([sum(t.values()) for t in stats.position_tokens], dtype=np.float64)
    after = stats.sink_queries - np.concatenate([[0.0], np.cumsum(longer[1:])])
    return np.maximum(after, 1.0)


def sink_heads(stats: ActivationStats, threshold: float) -> tuple[SinkHead, ...]:
    """Every head's most-attended position among the first sink_positions, with the share of
    its attention that lands there and the token found there most often."""
    if not stats.sinks or stats.sink_queries == 0:
        return ()
    mass = stats.sink_sums / queries_after(stats)[None, None, :]  # (L, H, P)
    out = []
    for layer in range(mass.shape[0]):
        for head in range(mass.shape[1]):
            row = mass[layer, head]
            j = int(row.argmax())
            tokens = stats.position_tokens[j]
            token, n = min(tokens.items(), key=lambda kv: (-kv[1], kv[0])) if tokens \
                else (-1, 0)
            out.append(SinkHead(layer=layer, head=head, position=j, mass=float(row[j]),
                                token=int(token), text=_text(stats, int(token)),
                                token_share=n / max(sum(tokens.values()), 1),
                                sink=bool(row[j] >= threshold)))
    return tuple(out)


__all__ = [
    "OUTLIER_LAYERS",
    "OUTLIER_MIN",
    "OUTLIER_POSITIONS",
    "SINK_THRESHOLD",
    "massive_activations",
    "outlier_dimensions",
    "sink_heads",
    "top_channels",
]


def expert_loads(stats: ActivationStats) -> tuple[ExpertLoad, ...]:
    """Per mixture-of-experts block: its load per expert, the experts never chosen, the
    imbalance (max/mean, coefficient of variation) and the router's mean entropy."""
    import numpy as np

    out = []
    for j, layer in enumerate(stats.moe_blocks):
        load = stats.expert_load[j].astype(np.float64)
        n = int(stats.route_positions[j])
        mean = float(load.mean()) if load.size else 0.0
        out.append(ExpertLoad(
            layer=layer, positions=n, load=tuple(int(x) for x in stats.expert_load[j]),
            never_chosen=tuple(int(e) for e in np.flatnonzero(stats.expert_load[j] == 0)),
            max_over_mean=float(load.max()) / mean if mean > 0 else float("nan"),
            cv=float(load.std()) / mean if mean > 0 else float("nan"),
            entropy=float(stats.route_entropy[j]) / n if n else float("nan")))
    return tuple(out)
