"""What `fptrace stats` keeps over many prompts: per-channel statistics of every block's
activations, tallies of massive activations and of the attention on the first positions; all of
it merges exactly, so shards, resumed runs and `--merge` give what one pass gives.

Sites, per block (the vocabulary of trace points, named by what reads them):
- attn_in: the input of the attention's first projections (q, k, v: the norm's output, or the
  stream itself in OLMo 2); z: the heads before the output projection (W_O's input);
- mlp_in: the input of the MLP's first projection(s) (gate and up, or c_fc); mlp_act: the input
  of the down projection;
- resid_post: the residual stream leaving the block;
and once, final_norm: the final norm's output, what the LM head reads. Each site keeps the
full names of the linear layers that read it (`model.layers.0.self_attn.q_proj`, ...), the keys
of SmoothQuant's activation-scales file.

Massive activations (Sun et al., 2024): an entry |x| > massive_min (100) of a block's output that
is at least massive_ratio (1000) times the median |x| of that hidden state (the block's output
for the prompt: every position and channel), tallied per (layer, channel) with where it
occurred. Attention sinks: for each layer, head and position j < sink_positions, the sum over
prompts and query positions i > j of the attention weight i gives j; divided by the number of
such queries (the queries after j, over all prompts: sink_queries counts those after position 0,
and position_tokens how many prompts reach each position, which gives the count after any j) it
is the share of the head's attention that lands on position j.

Prompt ids are numbered from 0 in the order the prompts were counted; merging B into A numbers
B's after A's, so merging shards in input order gives what one pass in input order gives.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fptrace.core.channel_stats import ChannelStats
from fptrace.errors import BadInput, param
from fptrace.jsontext import loads
from fptrace.results import SCHEMA_VERSION, result

SITES = ("attn_in", "z", "mlp_in", "mlp_act", "resid_post")  # a layer's sites, in this order
FINAL = "final_norm"
# |x| bins: decades from 1e-3 to 1e4, plus 6 (LLM.int8()'s outlier magnitude), so that the
# share of |x| >= 6 is exact; 100 is the floor of a massive activation
BINS = (0.0, 1e-3, 1e-2, 0.1, 1.0, 6.0, 10.0, 100.0, 1e3, 1e4, math.inf)
MASSIVE_MIN = 100.0
MASSIVE_RATIO = 1000.0
SINK_POSITIONS = 16
# a head is a sink when at least this share of its attention lands on one position (stats, heads)
SINK_THRESHOLD = 0.3


# ---- the JSON form (the `statistics` field of a `stats` result) ------------------------------

@result
class ChannelRecord:
    """One site's per-channel statistics, each array one value per channel."""

    width: int
    """Channels."""
    count: int
    """Token positions seen (every prompt's every position)."""
    mean: tuple[float, ...]
    """Mean of x."""
    m2: tuple[float, ...]
    """Sum of squared deviations from the mean: the population variance is m2 / count."""
    absmax: tuple[float, ...]
    """Largest |x| (-1 while nothing was seen)."""
    absmax_value: tuple[float, ...]
    """The signed value whose |x| is absmax."""
    argmax_prompt: tuple[int, ...]
    """Where absmax occurred: the prompt's index in `statistics.prompts` (the earliest prompt,
    then position, among equal values)."""
    argmax_position: tuple[int, ...]
    """... the position in that prompt (from 0)."""
    argmax_token: tuple[int, ...]
    """... and the token id there."""
    hist: tuple[tuple[int, ...], ...]
    """Per channel, how many |x| fall in each bin of `statistics.bins` ([0, e1), [e1, e2), …,
    [e_last, ∞)); each row sums to count."""


@result
class SiteRecord:
    """One site of a layer."""

    site: str
    """attn_in, z, mlp_in, mlp_act, resid_post or final_norm (see `fptrace stats` in
    docs/stats.md)."""
    modules: tuple[str, ...]
    """The full names of the linear layers that read this site (empty for resid_post)."""
    channels: ChannelRecord
    """Its per-channel statistics."""


@result
class MassiveRecord:
    """Massive activations of one channel in one layer's output."""

    layer: int
    """The block."""
    channel: int
    """The channel of the residual stream."""
    count: int
    """How many (prompt, position) entries were massive."""
    prompts: int
    """In how many prompts."""
    value: float
    """The largest of them, signed."""
    ratio: float
    """Its ratio to the median |x| of its hidden state (null when that median is 0)."""
    prompt: int
    """Where the largest occurred: the prompt's index in `statistics.prompts`, ..."""
    position: int
    """... the position, ..."""
    token: int
    """... and the token id."""
    positions: tuple[tuple[int, int], ...]
    """[position, count] of every position where it was massive."""
    tokens: tuple[tuple[int, int], ...]
    """[token id, count] of every token where it was massive."""


@result
class LayerRecord:
    """One block's statistics."""

    layer: int
    """The block."""
    sites: tuple[SiteRecord, ...]
    """Its sites, in the order attn_in, z, mlp_in, mlp_act, resid_post."""
    sink_sums: tuple[tuple[float, ...], ...]
    """Per head, per position j < sink_positions: the sum over prompts and over the query
    positions i > j of the attention weight i gives j (empty without sinks)."""


@result
class RouteRecord:
    """One mixture-of-experts block's routing, counted over every position."""

    layer: int
    """The block."""
    load: tuple[int, ...]
    """Per routed expert: the positions whose router chose it (a position counts once for each
    of its k experts)."""
    positions: int
    """Positions routed."""
    entropy_sum: float
    """The sum over those positions of the router's entropy (nats; the distribution of
    `run`'s routing: the softmax of its logits, or each sigmoid score over their sum)."""


@result
class FailedPrompt:
    """A prompt that is not counted."""

    id: str
    """Its id."""
    source: str
    """Where it came from (file:line)."""
    error: str
    """Why, in one line."""
    error_type: str
    """The error's class (BadInput, NonFiniteValues, ...)."""


@result
class Statistics:
    """Everything `fptrace stats` accumulates, in the form it merges from."""

    bins: tuple[float, ...]
    """The inner edges of the |x| histograms: bins [0, e1), [e1, e2), …, [e_last, ∞)."""
    massive_min: float
    """A massive activation has |x| above this ..."""
    massive_ratio: float
    """... and at least this many times the median |x| of its hidden state."""
    sink_positions: int
    """The first positions whose share of attention is tallied."""
    sinks: bool
    """Whether attention was tallied (off with --no-sinks)."""
    prompts: tuple[str, ...]
    """The ids of the prompts counted; `argmax_prompt` and `prompt` fields index this list."""
    failed: tuple[FailedPrompt, ...]
    """Prompts not counted, and why."""
    tokens: int
    """Token positions counted, over all prompts."""
    sink_queries: int
    """Query positions after the first, over all prompts. `sink_sums[j]` is a share of the
    queries after position j: this count less, for k = 1 … j, the prompts longer than k
    (`position_tokens[k]`'s counts)."""
    position_tokens: tuple[tuple[tuple[int, int], ...], ...]
    """Per position j < sink_positions, [token id, count] of the tokens found there."""
    token_texts: dict[str, str]
    """The text of every token id these statistics name."""
    layers: tuple[LayerRecord, ...]
    """Per block."""
    final: SiteRecord | None
    """The final norm's output, which the LM head reads."""
    massive: tuple[MassiveRecord, ...]
    """Massive activations, by layer then channel."""
    experts: int = 0
    """Routed experts per mixture-of-experts block (0: a dense model)."""
    routing: tuple[RouteRecord, ...] = ()
    """Per mixture-of-experts block, its routing (empty for a dense model)."""


# ---- the accumulator ------------------------------------------------------------------------

@dataclass
class SiteStats:
    """The running statistics of one site (a block's attn_in, z, mlp_in, mlp_act or resid_post,
    or the final norm): its name in the file, the linear layers that read it, its channels."""

    name: str
    modules: tuple[str, ...]
    stats: ChannelStats


@dataclass
class MassiveTally:
    """Massive activations of one (layer, channel)."""

    count: int = 0
    prompts: int = 0
    value: float = 0.0
    ratio: float = 0.0
    prompt: int = -1
    position: int = -1
    token: int = -1
    positions: Counter = field(default_factory=Counter)
    tokens: Counter = field(default_factory=Counter)

    def beats(self, value: float, prompt: int, position: int) -> bool:
        """Whether a massive value at (prompt, position) would be the new largest: larger |x|,
        then the earlier prompt and position (the order ChannelStats uses)."""
        if self.prompt < 0 or abs(value) > abs(self.value):
            return True
        return abs(value) == abs(self.value) and (prompt, position, -value) < \
            (self.prompt, self.position, -self.value)

    def merge_(self, other: MassiveTally, offset: int) -> None:
        if other.prompt >= 0 and self.beats(other.value, other.prompt + offset, other.position):
            self.value, self.ratio, self.token = other.value, other.ratio, other.token
            self.prompt, self.position = other.prompt + offset, other.position
        self.count += other.count
        self.prompts += other.prompts
        self.positions.update(other.positions)
        self.tokens.update(other.tokens)


class ActivationStats:
    """The running statistics (see the module's text)."""

    def __init__(self, n_layers: int, n_heads: int, *, sinks: bool = True,
                 sink_positions: int = SINK_POSITIONS, massive_min: float = MASSIVE_MIN,
                 massive_ratio: float = MASSIVE_RATIO, bins: tuple[float, ...] = BINS,
                 moe_blocks: tuple[int, ...] = (), n_experts: int = 0) -> None:
        import numpy as np

        # routing, per mixture-of-experts block: positions per expert, positions, the sum of
        # the router's entropy (counts add; the entropy is a sum, so merges add too)
        self.moe_blocks, self.n_experts = tuple(moe_blocks), n_experts
        self.expert_load = np.zeros((len(moe_blocks), n_experts), dtype=np.int64)
        self.route_positions = np.zeros(len(moe_blocks), dtype=np.int64)
        self.route_entropy = np.zeros(len(moe_blocks), dtype=np.float64)

        self.n_layers, self.n_heads = n_layers, n_heads if sinks else 0
        self.sinks, self.sink_positions = sinks, sink_positions
        self.massive_min, self.massive_ratio, self.bins = massive_min, massive_ratio, bins
        self.prompts: list[str] = []
        self.failed: list[FailedPrompt] = []
        self.tokens = 0
        self.layers: list[dict[str, SiteStats]] = [{} for _ in range(n_layers)]
        self.final: SiteStats | None = None
        self.massive: dict[tuple[int, int], MassiveTally] = {}
        self.sink_sums = np.zeros((n_layers, self.n_heads, sink_positions))
        self.sink_queries = 0
        self.position_tokens: list[Counter] = [Counter() for _ in range(sink_positions)]
        self.token_texts: dict[int, str] = {}

    def empty_like(self) -> ActivationStats:
        return ActivationStats(self.n_layers, self.n_heads, **self.settings(),
                               moe_blocks=self.moe_blocks, n_experts=self.n_experts)

    def add_routing(self, load: Any, positions: Any, entropy: Any) -> None:
        """Routing counted: load (blocks, experts) positions per expert, the positions routed
        (one count for every block, as one pass has, or (blocks,) counts), entropy (blocks,)
        the sums of the router's entropy over them."""
        self.expert_load += load
        self.route_positions += positions
        self.route_entropy += entropy

    def settings(self) -> dict:
        """What two statistics must share to merge."""
        return {"sinks": self.sinks, "sink_positions": self.sink_positions,
                "massive_min": self.massive_min, "massive_ratio": self.massive_ratio,
                "bins": self.bins}

    def site(self, layer: int | None, name: str, modules: tuple[str, ...],
             width: int) -> SiteStats:
        """The site `name` of block `layer` (None: the final norm), made on first use."""
        if layer is None:
            if self.final is None:
                self.final = SiteStats(name, modules, ChannelStats(width, self.bins))
            return self.final
        found = self.layers[layer].get(name)
        if found is None:
            found = SiteStats(name, modules, ChannelStats(width, self.bins))
            self.layers[layer][name] = found
        return found

    def all_sites(self) -> Iterable[tuple[int | None, SiteStats]]:
        for i, sites in enumerate(self.layers):
            for name in sorted(sites, key=_site_order):
                yield i, sites[name]
        if self.final is not None:
            yield None, self.final

    def done_ids(self) -> set[str]:
        return set(self.prompts) | {f.id for f in self.failed}

    # ---- merging ----------------------------------------------------------------------------

    def check_mergeable(self, other: ActivationStats, names: tuple[str, str] = ("this", "that")
                        ) -> None:
        """BadInput, naming both sides, unless other can merge into self."""
        a, b = names
        if self.sinks != other.sinks:  # (without sinks no heads are tallied: not another model)
            w, wo = (a, b) if self.sinks else (b, a)
            raise BadInput(f"{w} was counted with attention sinks, {wo} without "
                           f"({param('no_sinks')}): "
                           "statistics merge only when counted alike")
        if self.n_layers != other.n_layers or (self.sinks and self.n_heads != other.n_heads):
            raise BadInput(f"{a} has {self.n_layers} layers of {self.n_heads} heads, {b} "
                           f"{other.n_layers} of {other.n_heads}: statistics of different "
                           "models do not merge")
        if self.settings() != other.settings():
            diff = [k for k in self.settings() if self.settings()[k] != other.settings()[k]]
            raise BadInput(f"{a} and {b} were made with different settings ({', '.join(diff)}); "
                           "statistics merge only when made alike")
        for (layer, s) in other.all_sites():
            mine = self.final if layer is None else self.layers[layer].get(s.name)
            if mine is not None and (mine.modules, mine.stats.width) != \
                    (s.modules, s.stats.width):
                where = "the final norm" if layer is None else f"layer {layer}"
                raise BadInput(f"{a} and {b} differ at {where} {s.name} (modules or width): "
                               "statistics of different models do not merge")
        if (self.moe_blocks, self.n_experts) != (other.moe_blocks, other.n_experts) and \
                self.prompts and other.prompts:
            raise BadInput(f"{a} routes {self.n_experts} experts in blocks "
                           f"{list(self.moe_blocks)}, {b} {other.n_experts} in "
                           f"{list(other.moe_blocks)}: statistics of different models do not "
                           "merge")
        both = set(self.prompts) & set(other.prompts)
        if both:
            first = next(p for p in other.prompts if p in both)
            raise BadInput(f"{a} and {b} both count prompt {first!r} ({len(both)} prompt(s) in "
                           "common): merging would count them twice")

    def merge_(self, other: ActivationStats, names: tuple[str, str] = ("this", "that")
               ) -> ActivationStats:
        """Fold other in, its prompts numbered after ours; returns self."""
        self.check_mergeable(other, names)
        offset = len(self.prompts)
        for layer, s in other.all_sites():
            self.site(layer, s.name, s.modules, s.stats.width).stats.merge_(s.stats, offset)
        for key, t in other.massive.items():
            self.massive.setdefault(key, MassiveTally()).merge_(t, offset)
        if not other.prompts:  # nothing counted there (its routing, if any, is zeros)
            pass
        elif not self.prompts and (self.moe_blocks, self.n_experts) != \
                (other.moe_blocks, other.n_experts):  # nothing counted here yet: its layout
            self.moe_blocks, self.n_experts = other.moe_blocks, other.n_experts
            self.expert_load = other.expert_load.copy()
            self.route_positions = other.route_positions.copy()
            self.route_entropy = other.route_entropy.copy()
        else:
            self.add_routing(other.expert_load, other.route_positions, other.route_entropy)
        self.sink_sums += other.sink_sums
        self.sink_queries += other.sink_queries
        for mine, theirs in zip(self.position_tokens, other.position_tokens):
            mine.update(theirs)
        self.prompts += other.prompts
        self.failed += other.failed
        self.tokens += other.tokens
        self.token_texts.update(other.token_texts)
        return self

    # ---- what the statistics name ----------------------------------------------------------

    def referenced_tokens(self) -> set[int]:
        ids: set[int] = set()
        for _, s in self.all_sites():
            ids.update(int(t) for t in set(s.stats.argmax_token.tolist()) if t >= 0)
        for t in self.massive.values():
            ids.add(t.token)
            ids.update(t.tokens)
        for c in self.position_tokens:
            ids.update(c)
        ids.discard(-1)
        return ids

    def name_tokens(self, token_text: Any) -> None:
        """Fill token_texts for every token id named, with token_text(id)."""
        for t in self.referenced_tokens() - set(self.token_texts):
            self.token_texts[t] = token_text(t)

    # ---- JSON -------------------------------------------------------------------------------

    def to_record(self) -> Statistics:
        def site_record(s: SiteStats) -> SiteRecord:
            d = s.stats.to_dict()
            return SiteRecord(site=s.name, modules=s.modules, channels=ChannelRecord(
                width=d["width"], count=d["count"], mean=d["mean"], m2=d["m2"],
                absmax=d["absmax"], absmax_value=d["absmax_value"],
                argmax_prompt=d["argmax_prompt"], argmax_position=d["argmax_position"],
                argmax_token=d["argmax_token"], hist=d["hist"]))

        layers = tuple(LayerRecord(
            layer=i, sites=tuple(site_record(sites[n]) for n in sorted(sites, key=_site_order)),
            sink_sums=self.sink_sums[i].tolist()) for i, sites in enumerate(self.layers))
        massive = tuple(MassiveRecord(
            layer=k[0], channel=k[1], count=t.count, prompts=t.prompts, value=t.value,
            ratio=t.ratio, prompt=t.prompt, position=t.position, token=t.token,
            positions=_pairs(t.positions), tokens=_pairs(t.tokens))
            for k, t in sorted(self.massive.items()))
        return Statistics(
            bins=self.bins[1:-1], massive_min=self.massive_min,
            massive_ratio=self.massive_ratio, sink_positions=self.sink_positions,
            sinks=self.sinks, prompts=tuple(self.prompts), failed=tuple(self.failed),
            tokens=self.tokens, sink_queries=self.sink_queries,
            position_tokens=tuple(_pairs(c) for c in self.position_tokens),
            token_texts={str(k): v for k, v in sorted(self.token_texts.items())},
            layers=layers, final=None if self.final is None else site_record(self.final),
            massive=massive, experts=self.n_experts, routing=tuple(RouteRecord(
                layer=layer, load=tuple(int(x) for x in self.expert_load[j]),
                positions=int(self.route_positions[j]),
                entropy_sum=float(self.route_entropy[j]))
                for j, layer in enumerate(self.moe_blocks)))

    @classmethod
    def from_dict(cls, d: Any, where: str = "the statistics") -> ActivationStats:
        """The inverse of to_record (through JSON); BadInput naming `where` for anything that
        is not what to_record writes."""
        try:
            return _from_dict(cls, d)
        except BadInput as e:
            raise BadInput(f"{where}: {e}") from None
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise BadInput(f"{where}: not fptrace statistics ({type(e).__name__}: "
                           f"{str(e)[:120]})") from None


def _from_dict(cls: Any, d: dict) -> ActivationStats:
    import numpy as np

    bins = (0.0, *(float(e) for e in d["bins"]), math.inf)
    layers = d["layers"]
    heads = len(layers[0]["sink_sums"]) if layers and d["sinks"] else 0
    routing = d.get("routing") or []
    out = cls(len(layers), heads, sinks=bool(d["sinks"]), sink_positions=int(d["sink_positions"]),
              massive_min=float(d["massive_min"]), massive_ratio=float(d["massive_ratio"]),
              bins=bins, moe_blocks=tuple(int(r["layer"]) for r in routing),
              n_experts=int(d.get("experts") or 0))
    for j, r in enumerate(routing):
        load = np.asarray(r["load"], dtype=np.int64)
        if load.shape != (out.n_experts,) or (load < 0).any():
            raise BadInput(f"block {r['layer']}'s expert load is not {out.n_experts} counts")
        out.expert_load[j] = load
        out.route_positions[j] = int(r["positions"])
        out.route_entropy[j] = float(r["entropy_sum"])

    def site(rec: dict) -> SiteStats:
        ch = dict(rec["channels"], bins=[*bins[:-1], "inf"])
        return SiteStats(str(rec["site"]), tuple(str(m) for m in rec["modules"]),
                    ChannelStats.from_dict(ch))

    for i, layer in enumerate(layers):
        if int(layer["layer"]) != i:
            raise BadInput(f"layer {i} is numbered {layer['layer']}")
        for rec in layer["sites"]:
            s = site(rec)
            out.layers[i][s.name] = s
        if out.sinks:
            sums = np.asarray(layer["sink_sums"], dtype=np.float64)
            if sums.shape != (heads, out.sink_positions):
                raise BadInput(f"layer {i}'s sink_sums are {sums.shape}, not "
                               f"({heads}, {out.sink_positions})")
            out.sink_sums[i] = sums
    out.final = None if d["final"] is None else site(d["final"])
    for m in d["massive"]:
        ratio = math.inf if m["ratio"] is None else float(m["ratio"])
        out.massive[(int(m["layer"]), int(m["channel"]))] = MassiveTally(
            count=int(m["count"]), prompts=int(m["prompts"]), value=float(m["value"]),
            ratio=ratio, prompt=int(m["prompt"]), position=int(m["position"]),
            token=int(m["token"]), positions=Counter({int(p): int(c) for p, c in m["positions"]}),
            tokens=Counter({int(t): int(c) for t, c in m["tokens"]}))
    out.prompts = [str(p) for p in d["prompts"]]
    out.failed = [FailedPrompt(**{k: str(f[k]) for k in ("id", "source", "error", "error_type")})
                  for f in d["failed"]]
    out.tokens = int(d["tokens"])
    out.sink_queries = int(d["sink_queries"])
    pt = d["position_tokens"]
    if len(pt) != out.sink_positions:
        raise BadInput(f"position_tokens has {len(pt)} positions, not {out.sink_positions}")
    out.position_tokens = [Counter({int(t): int(c) for t, c in pos}) for pos in pt]
    out.token_texts = {int(k): str(v) for k, v in d["token_texts"].items()}
    if len(set(out.prompts)) != len(out.prompts):
        raise BadInput("a prompt id appears twice")
    return out


def _site_order(name: str) -> tuple[int, str]:
    return (SITES.index(name) if name in SITES else len(SITES), name)


def _pairs(c: Counter) -> tuple[tuple[int, int], ...]:
    return tuple((int(k), int(v)) for k, v in sorted(c.items()))


# ---- files ----------------------------------------------------------------------------------

def _version(v: Any) -> tuple[int, int] | None:
    try:
        major, minor = str(v).split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def read_document(path: str) -> dict:
    """A statistics file written by `fptrace stats --out` (or `--json`), as a dict: one of
    another kind, or from a newer fptrace, is refused in one line."""
    from fptrace.userfiles import read_text

    try:
        doc = loads(read_text(path, "utf-8-sig"))
    except FileNotFoundError:
        raise BadInput(f"no such file: {path}") from None
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{path} is not JSON ({type(e).__name__}: {str(e)[:80]}); a statistics "
                       f"file is what `fptrace stats {param('out')}` writes") from None
    if not isinstance(doc, dict) or doc.get("kind") != "stats":
        kind = doc.get("kind") if isinstance(doc, dict) else None
        raise BadInput(f"{path} is not an fptrace statistics file (kind {kind!r}, not 'stats'); "
                       f"it is what `fptrace stats {param('out')}` writes")
    theirs = _version(doc.get("schema_version"))
    major, minor = SCHEMA_VERSION.split(".")
    ours = int(major), int(minor)
    if theirs is None or theirs[0] < ours[0]:
        was = "no schema version" if doc.get("schema_version") is None else \
            f"schema version {doc.get('schema_version')}"
        raise BadInput(f"{path} was written by an older fptrace ({was}); this one reads "
                       f"statistics of schema "
                       f"{ours[0]}.x: count its prompts again with this fptrace")
    if theirs[0] != ours[0] or theirs > ours:
        raise BadInput(f"{path} was written with schema version {doc.get('schema_version')}; "
                       f"this fptrace reads statistics up to {SCHEMA_VERSION}: upgrade fptrace "
                       "to read it")
    return doc


def read_statistics(path: str) -> tuple[dict, ActivationStats]:
    """(the whole document, its statistics) of a statistics file."""
    doc = read_document(path)
    return doc, ActivationStats.from_dict(doc.get("statistics"), where=path)


__all__ = [
    "BINS",
    "FINAL",
    "SITES",
    "ActivationStats",
    "ChannelRecord",
    "FailedPrompt",
    "LayerRecord",
    "MassiveRecord",
    "MassiveTally",
    "RouteRecord",
    "SiteRecord",
    "SiteStats",
    "Statistics",
    "read_document",
    "read_statistics",
]
