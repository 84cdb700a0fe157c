"""One forward pass's statistics: hooks on every block feed a fresh ActivationStats with the real
(unpadded) positions of a group of prompts.

Which linear layer reads which site is found, not listed: a pre-hook on every linear layer of a
block's attention and MLP (any module whose weight is a matrix) sees its input; the layers of
one container that receive the very same tensor share a site, the first input of the attention
being attn_in (q, k, v, or a fused qkv) and the next z (the output projection), the first of
the MLP mlp_in (gate and up, or c_fc) and the next mlp_act (down). A site's statistics are
added once, whatever number of layers read it. The LM head's input is checked to be the final
norm's output before that site is named after it.

The sites' real rows are staged and counted together: the staged sites of one width side by side
in one ChannelStats.of_batch (a few dozen tensor operations for a whole group, not per site),
then split back into the sites. Staging stops at STAGE_BYTES, so memory stays bounded whatever
the model and the group.

Attention weights come from the model's own eager attention (the pass runs under
core/hooks.py's `eager_attention`); massive activations are found in each block's output with
the median of that prompt's whole hidden state (Sun et al.'s definition). Every pass checks that
each site saw every real position once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fptrace.addresses import Site
from fptrace.core.activation_stats import FINAL, ActivationStats, MassiveTally
from fptrace.core.hooks import Hook, hooked
from fptrace.core.prompt_groups import Encoded
from fptrace.core.routing import capture_routing, moe_facts, tally
from fptrace.core.taps import hooks_at, tap_hook
from fptrace.errors import Mismatch, NonFiniteValues, UnsupportedModel, param
from fptrace.families import Tap
from fptrace.points import Point

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np
    import torch
    from torch import nn

    from fptrace.models.loading import LoadedModel

CONTAINER_SITES = {"attn": ("attn_in", "z"), "mlp": ("mlp_in", "mlp_act")}
STAGE_BYTES = 64 * 2**20  # staged activations counted together (see the module's text)


def _linears(container: Any) -> list[Any]:
    """The linear layers inside a module: leaves whose weight is a matrix (nn.Linear, GPT-2's
    Conv1D)."""
    return [m for m in container.modules() if not any(True for _ in m.children())
            and getattr(m, "weight", None) is not None and m.weight.dim() == 2]


class Collector:
    """The hooks of one loaded model; run(group) gives the group's statistics."""

    def __init__(self, lm: LoadedModel, template: ActivationStats) -> None:
        self.lm = lm
        self.template = template
        self.names = {id(m): n for n, m in lm.model.named_modules()}
        parts = lm.parts
        self.linears = [{"attn": _linears(a), "mlp": _linears(m)}
                        for a, m in zip(parts.attns, parts.mlps)]

    def run(self, group: list[Encoded]) -> ActivationStats:
        """One forward pass over the group (left-padded); its statistics, prompts numbered 0..
        in group order."""
        import numpy as np
        import torch

        from fptrace.core.trace import padded_batch

        lm, part = self.lm, self.template.empty_like()
        rows = [e.ids for e in group]
        part.prompts = [e.item.id for e in group]
        input_ids, mask, kwargs = padded_batch(lm, rows)
        kwargs["logits_to_keep"] = 1
        B, T = input_ids.shape
        n = np.array([len(r) for r in rows])
        pass_ = _Pass(self, part, rows, mask, B, T, n)
        # no_grad, not inference_mode: tensors keep their version counters, so that a staged
        # activation changed in place before it is counted is caught (see flush)
        with torch.no_grad(), hooked(pass_.hooks()), \
                capture_routing(lm.parts, lm.config) as routes:
            lm.model(input_ids, **kwargs)
            pass_.finish()
        pass_.check()
        if routes is not None and part.moe_blocks:
            moe = moe_facts(lm.parts, lm.config)
            assert moe is not None
            part.add_routing(*tally(routes, moe, None if mask is None else pass_.flat))
        part.tokens = int(n.sum())
        if part.sinks:
            part.sink_queries = int(np.maximum(n - 1, 0).sum())
            for r in rows:
                for j, t in enumerate(r[:part.sink_positions]):
                    part.position_tokens[j][int(t)] += 1
        return part


class _Pass:
    """The state of one forward pass: what each hook needs, and what it has seen."""

    def __init__(self, c: Collector, part: ActivationStats, rows: list[list[int]],
                 mask: torch.Tensor | None, B: int, T: int, n: np.ndarray) -> None:
        import numpy as np
        import torch

        self.c, self.part, self.rows, self.mask, self.B, self.T, self.n = c, part, rows, mask, \
            B, T, n
        self.offsets = T - n  # (B,) left padding of each row
        self.N = int(n.sum())
        # the real rows of a (B, T, d) tensor flattened to (B*T, d), in (prompt, position) order
        flat = np.concatenate([b * T + self.offsets[b] + np.arange(k) for b, k in enumerate(n)])
        self.flat = torch.as_tensor(flat, device=c.lm.device)
        self.prompt_of = np.repeat(np.arange(B), n)
        self.position_of = np.concatenate([np.arange(k) for k in n])
        self.token_of = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows])
        # container -> [(input tensor, [module names], its version counter then)]
        self.seen: dict[str, list] = {}
        # (layer, site, modules, (N, d) rows, their version counter when staged)
        self.staged: list[tuple[int | None, str, tuple[str, ...], torch.Tensor, int]] = []
        self.staged_bytes = 0
        self.final: torch.Tensor | None = None
        self.final_fed = False
        self.weights_seen = [False] * len(c.linears)
        # (layer, (B, H, T, P) weights on j < P)
        self.sink_columns: list[tuple[int, torch.Tensor]] = []
        if part.sinks:
            P = part.sink_positions
            j = np.arange(P)
            # each row's first P real key positions (clamped: masked below) and which (query i,
            # key j) pairs count: a real query after the key, i > j, both in the prompt
            key = np.minimum(self.offsets[:, None] + j, T - 1)  # (B, P)
            query = np.arange(T)[None, :, None] - self.offsets[:, None, None]  # (B, T, 1) real
            counts = (query > j) & (j < n[:, None])[:, None, :]  # (B, T, P)
            dev = c.lm.device
            self.sink_key = torch.as_tensor(key, device=dev)
            self.sink_mask = torch.as_tensor(counts, device=dev)

    def real(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d) -> (N, d): the real positions, in (prompt, position) order."""
        x = x.reshape(self.B * self.T, x.shape[-1])
        if self.mask is None:
            return x
        if self.flat.device != x.device:  # blocks spread over devices (--device-map)
            self.flat = self.flat.to(x.device)
        return x.index_select(0, self.flat)

    def feed(self, layer: int | None, site: str, modules: tuple[str, ...], x: torch.Tensor
             ) -> None:
        """Stage a site's real rows; count the staged ones once they fill STAGE_BYTES."""
        rows = self.real(x)  # (N, d), or a view of x when nothing is padded
        self.staged.append((layer, site, modules, rows, rows._version))
        self.staged_bytes += rows.numel() * rows.element_size()
        if self.staged_bytes >= STAGE_BYTES:
            self.flush()

    def flush(self) -> None:
        """Count the staged sites: those of one width, dtype and device side by side in one
        ChannelStats, then each site's columns merged into its statistics."""
        import torch

        from fptrace.core.channel_stats import ChannelStats

        groups: dict[tuple, list] = {}
        for entry in self.staged:
            layer, site, _, rows, version = entry
            if rows._version != version:
                where = "the final norm" if layer is None else f"block {layer}"
                raise Mismatch(f"the model changed {where}'s {site} in place after its hook saw "
                               "it: fptrace stats cannot count what the model computed there")
            groups.setdefault((rows.shape[1], rows.dtype, rows.device), []).append(entry)
        resid = [(e[0], e[3]) for e in self.staged if e[1] == "resid_post"]
        self.staged, self.staged_bytes = [], 0
        if resid:
            self._massive(resid)
        for entries in groups.values():
            x = entries[0][3] if len(entries) == 1 else torch.cat([e[3] for e in entries], 1)
            try:
                both = ChannelStats.of_batch(x, self.prompt_of, self.position_of,
                                             self.token_of, self.part.bins)
            except NonFiniteValues:
                layer, site = next((e[0], e[1]) for e in entries
                                   if not bool(torch.isfinite(e[3]).all()))
                where = "the final norm" if layer is None else f"block {layer}"
                raise NonFiniteValues(f"NaN or Inf in the activations ({where}, {site})") \
                    from None
            d = x.shape[1] // len(entries)
            for k, (layer, site, modules, _, _) in enumerate(entries):
                s = self.part.site(layer, site, modules, d)
                s.stats.merge_(both.columns(k * d, (k + 1) * d))

    # ---- hooks ------------------------------------------------------------------------------

    def hooks(self) -> list[Hook]:
        lm = self.c.lm
        parts = lm.parts
        out: list[Hook] = []
        for i in range(len(parts.blocks)):
            for container, mods in self.c.linears[i].items():
                out += [tap_hook(m, Tap("", "in"), self._linear_hook(container, m))
                        for m in mods]
            if self.part.sinks:
                out += hooks_at(lm, [Site(i, Point.attn_weights)], self._attention_hook)
            out += hooks_at(lm, [Site(i, Point.resid_post)], self._block_hook)
        out.append(tap_hook(parts.final_norm, Tap(""), self._final_hook))
        out.append(tap_hook(parts.lm_head, Tap("", "in"), self._lm_head_hook))
        return out

    def _linear_hook(self, container: str, module: nn.Module) -> Callable[..., None]:
        name = self.c.names[id(module)]

        def hook(x: torch.Tensor | None) -> None:
            assert x is not None
            seen = self.seen.setdefault(container, [])
            for t, names, _ in seen:
                if t is x:
                    names.append(name)
                    return
            sites = CONTAINER_SITES[container]
            if len(seen) == len(sites):
                raise UnsupportedModel(
                    f"{name} reads a third distinct input inside its block's "
                    f"{'attention' if container == 'attn' else 'MLP'}; fptrace stats knows "
                    f"two ({', '.join(sites)})")
            seen.append((x, [name], x._version))
        return hook

    def _block_hook(self, site: Site, h: torch.Tensor | None) -> None:
        assert h is not None  # (B, T, d): the block's output
        i = site.layer
        for container, seen in self.seen.items():
            for (x, names, version), name in zip(seen, CONTAINER_SITES[container]):
                if x._version != version:
                    raise Mismatch(f"the model changed block {i}'s {name} in place after "
                                   f"{names[0]} read it: fptrace stats cannot count what "
                                   "that layer read")
                self.feed(i, name, tuple(names), x)
        self.seen = {}
        self.feed(i, "resid_post", (), h)

    def _final_hook(self, h: torch.Tensor | None) -> None:
        self.final = h  # (B, T, d)

    def _lm_head_hook(self, x: torch.Tensor | None) -> None:
        import torch

        assert x is not None  # (B, k, d): the last k positions
        h = self.final
        if h is None or x.shape[-1] != h.shape[-1] or \
                not torch.equal(x, h[:, h.shape[1] - x.shape[1]:]):
            raise Mismatch("the LM head does not read the final norm's output; fptrace stats "
                           "cannot name the LM head's input")
        self.feed(None, FINAL, (self.c.names[id(self.c.lm.parts.lm_head)],), h)
        self.final_fed = True

    def _attention_hook(self, site: Site, w: torch.Tensor | None) -> None:
        i = site.layer
        if w is None or w.dim() != 4 or w.shape[-1] != self.T:
            raise UnsupportedModel(f"block {i}'s attention returned no weights under eager "
                                   f"attention; pass {param('no_sinks')}")
        P = self.part.sink_positions
        idx = self.sink_key[:, None, None, :].expand(-1, w.shape[1], self.T, P)
        self.sink_columns.append((i, w.gather(3, idx)))  # (B, H, T, P)
        self.weights_seen[i] = True

    # ---- massive activations and sinks ------------------------------------------------------

    def _massive(self, resid: list[tuple[int, torch.Tensor]]) -> None:
        """Entries |x| > massive_min and >= massive_ratio x the median |x| of the prompt's
        hidden state (every real position and channel of the block's output), in the staged
        blocks' outputs at once: the entries above massive_min first (few), then the medians of
        the (block, prompt) pairs that have one."""
        import numpy as np
        import torch

        p = self.part
        x = torch.stack([rows for _, rows in resid])  # (L', N, d) real rows
        a = x.abs()
        where = (a > p.massive_min).nonzero()  # (k, 3): staged block, row, channel
        if where.numel() == 0:
            return
        layers = [layer for layer, _ in resid]
        starts = np.concatenate([[0], np.cumsum(self.n)])  # each prompt's rows
        li, row, ch = (v.cpu().numpy() for v in where.unbind(1))
        prompt = self.prompt_of[row]
        med = {}
        for b in sorted(set(prompt.tolist())):  # the lower median, as Sun et al. (torch.median)
            ls = sorted(set(li[prompt == b].tolist()))
            m = a[ls, starts[b]:starts[b + 1]].reshape(len(ls), -1).median(1).values
            med.update({(l, b): float(v) for l, v in zip(ls, m.double().tolist())})
        values = x[where.unbind(1)].double().cpu().numpy()
        meds = np.array([med[(l, b)] for l, b in zip(li.tolist(), prompt.tolist())])
        keep = np.abs(values) >= p.massive_ratio * meds
        pos = self.position_of[row]
        tok = self.token_of[row]
        seen: dict[tuple[int, int], set] = {}
        for k in np.flatnonzero(keep).tolist():
            key = (layers[li[k]], int(ch[k]))
            v, b, t = float(values[k]), int(prompt[k]), int(pos[k])
            tally = p.massive.setdefault(key, MassiveTally())
            if tally.beats(v, b, t):
                tally.value, tally.prompt, tally.position, tally.token = v, b, t, int(tok[k])
                tally.ratio = abs(v) / meds[k] if meds[k] > 0 else float("inf")
            tally.count += 1
            tally.positions[t] += 1
            tally.tokens[int(tok[k])] += 1
            seen.setdefault(key, set()).add(b)
        for key, bs in seen.items():
            p.massive[key].prompts += len(bs)

    def finish(self) -> None:
        """After the forward pass: count what is still staged, and the attention weights."""
        self.flush()
        self._sinks()

    def _sinks(self) -> None:
        """Per layer, head and position j < sink_positions: the sum over the query positions
        i > j of w[i, j], over the group's prompts (their own positions: padding skipped)."""
        import torch

        if not self.sink_columns:
            return
        layers = [i for i, _ in self.sink_columns]
        w = torch.stack([c for _, c in self.sink_columns])  # (L, B, H, T, P)
        sums = (w.double() * self.sink_mask[None, :, None]).sum((1, 3))  # (L, H, P)
        self.part.sink_sums[layers] += sums.cpu().numpy()

    def check(self) -> None:
        """Every site saw every real position once; the final norm and the attention weights
        were all there."""
        bad = [f"{'final' if layer is None else layer}/{s.name}: {s.stats.count}"
               for layer, s in self.part.all_sites() if s.stats.count != self.N]
        missing = [i for i, sites in enumerate(self.part.layers)
                   if not {"attn_in", "mlp_in", "resid_post"} <= set(sites)]
        if bad or missing or not self.final_fed or \
                (self.part.sinks and not all(self.weights_seen)):
            raise Mismatch(f"stats: the hooks did not see every position once ({self.N} "
                           f"expected; {', '.join(bad[:3]) or 'counts fine'}; blocks without "
                           f"their sites: {missing[:3]}; final norm seen: {self.final_fed})")


__all__ = ["Collector"]
