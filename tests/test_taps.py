"""core/taps.py: one hooks_at(lm, sites, fn) reads and changes the tensor at a Site, held to the
model's own hidden states (transformers' output_hidden_states, no fptrace hook)."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny

from fptrace.addresses import Site
from fptrace.core.hooks import hooked
from fptrace.core.taps import hooks_at, received
from fptrace.models.loading import wrap_model
from fptrace.points import Point

IDS = [[5, 17, 42, 7, 9, 311]]
# a plain block, a parallel residual, post-norms with and without norms before the sublayers
FAMILIES = ("gpt2", "gpt_neox", "gemma2", "olmo2")


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return wrap_model(build_tiny(request.param), name=f"tiny-{request.param}",
                      random_weights=True)


def _hidden(lm) -> tuple[torch.Tensor, ...]:
    with torch.inference_mode():
        return lm.model(torch.tensor(IDS), output_hidden_states=True).hidden_states


def test_the_stream_and_what_it_receives_are_the_models(lm):
    """resid_pre and resid_post of every block are the model's hidden states; what the stream
    receives from attention and the MLP (received: the post-norm's output where the family has
    one) adds up to what the block added."""
    n = len(lm.parts.blocks)
    sites = [Site(i, p) for i in range(n) for p in (Point.resid_pre, Point.resid_post)]
    sites += [received(lm, i, side) for i in range(n) for side in ("attn", "mlp")]
    got: dict = {}

    def keep(site: Site, x: torch.Tensor | None) -> None:
        got[site] = x.clone()

    with hooked(hooks_at(lm, sites, keep)):
        hs = _hidden(lm)
    for i in range(n - 1):  # the last hidden state is after the final norm
        torch.testing.assert_close(got[Site(i, Point.resid_pre)], hs[i], rtol=0, atol=0)
        torch.testing.assert_close(got[Site(i, Point.resid_post)], hs[i + 1], rtol=0, atol=0)
    for i in range(n):
        added = got[received(lm, i, "attn")] + got[received(lm, i, "mlp")]
        torch.testing.assert_close(got[Site(i, Point.resid_pre)] + added,
                                   got[Site(i, Point.resid_post)], rtol=1e-5, atol=1e-5)


def test_what_fn_returns_takes_the_tensors_place(lm):
    """A changed block output is what the next block reads (and what transformers reports)."""
    d = lm.config.hidden_size
    delta = torch.linspace(-1, 1, d)

    def add(site: Site, x: torch.Tensor | None) -> torch.Tensor:
        return x + delta

    clean = _hidden(lm)
    with hooked(hooks_at(lm, [Site(0, Point.resid_post)], add), prepend=True):
        steered = _hidden(lm)
    torch.testing.assert_close(steered[1], clean[1] + delta, rtol=0, atol=1e-6)
    assert not torch.allclose(steered[2], clean[2])  # block 1 read the changed stream
