"""The frozen passes a graph's rows come from: the whole prompt's (the query positions' logits
kept) and each prefix's (core.prefix_ends: its first `end` positions, its last logit kept),
each made once, when a batch first asks for it. The process that builds the graph and each
worker of `graph --ray` (pool.py) make theirs with this one class, from the same float64 copy
of the same model (or, with precision float32, the same float32 copy: copied_passes), so that the
passes, and the rows computed from them, are the same."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fptrace.commands.graph.freezing import MlpSites, Pass, frozen

if TYPE_CHECKING:
    import torch

    from fptrace.commands.graph.transcoders import TranscoderSet
    from fptrace.families.parts import ModelParts
    from fptrace.models.loading import LoadedModel


class FrozenPasses:
    """passes(end): the frozen pass (freezing.py) of the prompt's first `end` positions, made
    on first use and kept; end = len(ids) is the whole prompt's, whose logits are the query
    positions'. model: the float64 copy (model64.float64_copy; copied_passes: a float32 one),
    parts its ModelParts, sites
    the MLP sites (None with transcoders, a TranscoderSet); outputs: each head's output kept
    too (freezing.frozen's `outputs`: graph --qk, in the process that builds the graph)."""

    def __init__(self, model: torch.nn.Module, parts: ModelParts, sites: MlpSites | None,
                 transcoders: TranscoderSet | None, ids: list[int], queries: list[int],
                 outputs: bool = False) -> None:
        self.model, self.parts, self.sites, self.transcoders = model, parts, sites, transcoders
        self.outputs = outputs
        self.ids, self.queries = list(ids), list(queries)
        self._made: dict[int, Pass] = {}

    def __call__(self, end: int) -> Pass:
        if end not in self._made:
            import torch

            device = self.parts.embed.weight.device
            keep: int | torch.Tensor = 1  # a prefix's pass: its last logit (no target reads it)
            if end == len(self.ids):
                keep = torch.tensor(self.queries, device=device)
            with frozen(self.model, self.parts, self.sites, self.transcoders,
                        outputs=self.outputs) as p:
                self.model(torch.tensor([self.ids[:end]], device=device), use_cache=False,
                           logits_to_keep=keep)
            self._made[end] = p
        return self._made[end]


def copied_passes(lm: LoadedModel, precision: str, sites: MlpSites | None,
                  transcoders: TranscoderSet | None, ids: list[int], queries: list[int]
                  ) -> FrozenPasses:
    """The frozen passes of a copy of the model (and of the transcoders) in `precision`:
    "float64", a `graph --ray` worker's (the copy core.py's real pass also runs on); "float32",
    graph(precision="float32")'s candidate rows, each checked against its float64 value by
    core.py (inputs.check_precision says which precisions there are)."""
    import torch

    from fptrace.commands.graph.model64 import model_copy

    dtype = getattr(torch, precision)
    model, parts = model_copy(lm, dtype)
    return FrozenPasses(model, parts, sites,
                        None if transcoders is None else transcoders.cast(dtype), ids, queries)


__all__ = ["FrozenPasses", "copied_passes"]
