"""A tiny GPT-2 whose attention heads are set by hand (tests/test_heads.py): the residual stream
is four blocks of 32 dimensions (the token, the position, the previous token, a constant), each
code one-hot minus its block mean, so that LayerNorm's centring moves nothing.

- 0.0 previous-token: its query is position i − 1's code, its key position j's; it copies the
  token into the previous-token block;
- 0.1 first-token: a constant query against the first position's mark; it writes nothing;
- 1.0 induction through 0.0: its query is the token, its key the previous-token block; it copies
  the token it attends to into the token block, which the tied LM head reads;
- 0.2, 0.3, 1.1-1.3 random (seeded), writing little; the MLPs are zero.
"""

from __future__ import annotations

import torch

D, NH, HD, V, NP = 128, 4, 32, 32, 32  # width, heads, head size, vocabulary, context
TOK, POS, PREV, SPARE = 0, 32, 64, 96  # the residual's four blocks of 32


def planted_gpt2(previous: bool = True):
    """A 2-block GPT-2 whose heads are set by hand: 0.0 previous-token, 0.1 first-token,
    1.0 induction through 0.0; 0.2, 0.3, 1.1-1.3 random. previous=False: 0.0 still attends to
    the previous token but writes nothing, so 1.0 has nothing to match."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=D, n_head=NH, vocab_size=V, n_positions=NP,
                     n_inner=4, layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    m = GPT2LMHeadModel(cfg).eval()
    g = torch.Generator().manual_seed(1)
    ones = torch.ones(32) / 32

    def code(i):  # one-hot minus the block mean: zero-sum, so LayerNorm's centring is idle
        return torch.eye(32)[i] - ones

    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for n, p in m.named_parameters():
            if n.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.fill_(1.0)
        wte, wpe = m.transformer.wte.weight, m.transformer.wpe.weight
        for t in range(V):
            wte[t, TOK:TOK + 32] = code(t)
            wte[t, SPARE], wte[t, SPARE + 1] = 1.0, -1.0  # a constant direction
        for i in range(NP):
            wpe[i, POS:POS + 32] = code(i)
        s = 3.0
        W0 = m.transformer.h[0].attn.c_attn.weight  # (d, 3d): q | k | v, head h at h·hd
        P0 = m.transformer.h[0].attn.c_proj.weight  # (d, d): z → residual
        for k in range(31):  # 0.0: q_i ≈ position i − 1, k_j = position j
            W0[POS + k + 1, k] = s
        for k in range(32):
            W0[POS + k, D + k] = s
            W0[TOK + k, 2 * D + k] = 1.0  # v: the token
            P0[k, PREV + k] = 0.2 if previous else 0.0  # → the previous-token block
        W0[SPARE, HD] = s  # 0.1: q constant, k the first position's mark
        W0[POS, D + HD] = s
        W1 = m.transformer.h[1].attn.c_attn.weight
        P1 = m.transformer.h[1].attn.c_proj.weight
        for k in range(32):  # 1.0: q the token, k the previous token, v the token
            W1[TOK + k, k] = s
            W1[PREV + k, D + k] = s
            W1[TOK + k, 2 * D + k] = 1.0
            P1[k, TOK + k] = 1.0  # → the token block: predicts the copied token
        for W, P, heads in ((W0, P0, (2, 3)), (W1, P1, (1, 2, 3))):
            for h in heads:
                for part in range(3):
                    cols = slice(part * D + h * HD, part * D + (h + 1) * HD)
                    W[:, cols] = torch.randn(D, HD, generator=g) * 0.1
                P[h * HD:(h + 1) * HD] = torch.randn(HD, D, generator=g) * 0.01
    return m
