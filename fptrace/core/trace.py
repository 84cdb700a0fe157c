"""run_trace: one forward pass of a real model, hooked on every block, as a frozen Trace."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fptrace.addresses import Sizes
from fptrace.core import stats
from fptrace.core.hooks import Capture, capture_stats, is_oom
from fptrace.core.routing import capture_routing, moe_facts, routing_of_rows
from fptrace.errors import BadInput
from fptrace.families.parts import dims
from fptrace.models.loading import LoadedModel
from fptrace.models.prompts import Prepared, Prompt
from fptrace.notes import MASSIVE, RANDOM, TIED_LENS_GRID, TIED_LENS_LAST, TRUNCATED
from fptrace.results import (
    Decomposition,
    FinalNormStats,
    LayerStats,
    LensCell,
    ModelInfo,
    PositionStats,
    ShapeStep,
    TopToken,
    Trace,
)

if TYPE_CHECKING:
    import torch


def base_notes(lm: LoadedModel) -> list[str]:
    """The notes every result about a loaded model starts with."""
    return [RANDOM()] if lm.random_weights else []


def model_info(lm: LoadedModel) -> ModelInfo:
    """Facts about the loaded model; computed once per LoadedModel (walking every parameter
    costs about a millisecond, which would show in the per-forward overhead)."""
    cached = lm.info
    if cached is not None and cached.device == str(lm.device) and \
            cached.dtype == str(lm.dtype).replace("torch.", ""):
        return cached
    lm.info = _model_info(lm)
    return lm.info


def sizes(lm: LoadedModel) -> Sizes:
    """What addresses (fptrace.addresses) are resolved against: the model's blocks, heads per
    block and, for a mixture of experts, experts per block."""
    experts = next((getattr(lm.config, k) for k in ("num_local_experts", "num_experts",
                                                     "n_routed_experts")
                    if isinstance(getattr(lm.config, k, None), int)), None)
    return Sizes(model=lm.name, blocks=len(lm.parts.blocks),
                 heads=dims(lm.config, lm.parts.family).n_heads, experts=experts)


def _model_info(lm: LoadedModel) -> ModelInfo:
    fam = lm.parts.family
    dm = dims(lm.config, fam)
    n_params = sum(p.numel() for p in lm.model.parameters())  # shared (tied) tensors count once
    in_emb, out_emb = lm.model.get_input_embeddings(), lm.model.get_output_embeddings()
    tied = out_emb is not None and in_emb is not None and \
        out_emb.weight.data_ptr() == in_emb.weight.data_ptr()
    return ModelInfo(
        name=lm.name, family=fam.name, source=lm.source,
        n_layers=len(lm.parts.blocks), d_model=dm.d_model, n_heads=dm.n_heads,
        n_kv_heads=dm.n_kv_heads, head_dim=dm.head_dim, d_mlp=dm.d_mlp,
        vocab_size=dm.vocab_size, context_length=dm.context_length,
        n_params=int(n_params), tied_embeddings=bool(tied),
        norm_type=fam.norm_type.value, mlp_type=fam.mlp_type.value,
        positions=fam.positions.value,
        parallel_residual=lm.parts.parallel_residual,
        device=str(lm.device), dtype=str(lm.dtype).replace("torch.", ""),
        random_weights=lm.random_weights, placement=lm.placement,
        inferred=lm.parts.known, unknown=lm.parts.unknown,
        tensor_parallel=lm.tensor_parallel,
        quantization=lm.quantization, quantized_weights=lm.quantized_weights,
        moe=None if (moe := moe_facts(lm.parts, lm.config)) is None else moe.header,
    )


LENS_GRID_POSITIONS = 64  # the logit-lens grid covers at most the last 64 positions
LENS_GRID_TOP = 5  # and holds the lens's top 5 tokens at each of its cells


def run_trace(lm: LoadedModel, prompt: Prompt, *, top_k: int = 10,
              snippet: int = 4, all_positions: bool = False, truncate: bool = False,
              logit_lens: bool = True, lens_grid: bool = False) -> Trace:
    """Trace one prompt (text, or a list of token ids). lens_grid: also the logit lens at
    every position (the last 64 at most), for the heatmap of --plot and the report."""
    return run_traces(lm, [prompt], top_k=top_k, snippet=snippet, all_positions=all_positions,
                      truncate=truncate, logit_lens=logit_lens, lens_grid=lens_grid)[0]


def run_traces(lm: LoadedModel, prompts: Sequence[Prompt], *, top_k: int = 10,
               snippet: int = 4, all_positions: bool = False, truncate: bool = False,
               logit_lens: bool = True, lens_grid: bool = False) -> list[Trace]:
    """Trace several prompts in one forward pass (left-padded, with an attention mask and
    position ids counted from each row's first real token). Each Trace equals the one that
    prompt gives alone, within float tolerance."""
    import torch

    if top_k < 1:  # the CLI's --top-k and --snippet are held to the same by Typer
        raise BadInput(f"top_k must be at least 1, not {top_k}")
    if snippet < 0:
        raise BadInput(f"snippet must be 0 or more, not {snippet}")
    prepared = [lm.prepare(p, truncate) for p in prompts]
    if lens_grid and len(prepared) != 1:
        raise BadInput("the logit-lens grid is computed for one prompt at a time")
    input_ids, mask, kwargs = padded_batch(lm, [p.ids for p in prepared])
    B, T = input_ids.shape
    kwargs["logits_to_keep"] = 0 if all_positions else 1
    cap = Capture(mask=mask, home=lm.device,
                  keep_positions=min(T, LENS_GRID_POSITIONS) if lens_grid else 0)
    try:
        with torch.inference_mode(), capture_stats(lm.parts, cap), \
                capture_routing(lm.parts, lm.config) as routed:
            logits = lm.model(input_ids, **kwargs).logits  # (B, 1, V) or (B, T, V)
    except Exception as e:
        if not is_oom(e):
            raise
        from fptrace.errors import OutOfMemory
        from fptrace.models.memory import out_of_memory

        raise OutOfMemory(out_of_memory(lm.config, lm.device, B, T, T if all_positions else 1,
                                        torch.empty((), dtype=lm.dtype).element_size())
                          ) from None
    # what comes from the ids alone is made before the first read of the forward's results: on
    # a GPU the forward's kernels still run meanwhile (its launches return at once), so the
    # token table and the tokenizer's notes (on a 2-core test machine 4.6 ms at 512 tokens,
    # 33 ms at 4,096, of llama-3.2-1b's tokenizer) need not add to the trace's time there
    info = model_info(lm)
    host = [(lm.tokens(p), lm.retokenized_note(p), lm.bos_note(p)) for p in prepared]
    per_row, checks = layer_stats(lm, cap, snippet=snippet, logit_lens=logit_lens)
    grid, grid_positions = _lens_grid(lm, cap, T) if lens_grid else ((), ())
    facts = moe_facts(lm.parts, lm.config) if routed is not None else None
    routing = [None] * B if routed is None or facts is None else routing_of_rows(
        routed, facts, B, T, [len(p.ids) for p in prepared], str(lm.dtype).replace("torch.", ""))
    traces = []
    for b, p in enumerate(prepared):
        ids, dropped = list(p.ids), p.dropped
        final_vec = cap.final_last[b]
        row_logits = logits[b, -1]
        first_bad = first_nonfinite(per_row[b])
        if first_bad is None and not stats.is_finite(final_vec, row_logits):
            first_bad = "final_norm"
        top_ids, top_p, top_l = stats.top_k(row_logits, top_k)
        tokens, retokenized, bos = host[b]
        positions, mean_loss = _positions(lm, p, logits[b, -len(ids):]) if all_positions \
            else ((), None)
        traces.append(Trace(
            prompt=p.text, model=info, tokens=tokens,
            shapes=_shape_steps(cap, len(ids), info.d_model, all_positions,
                                logits.shape[-1]),
            layers=per_row[b],
            final_norm=FinalNormStats(norm_last=float(stats.norms(final_vec)),
                                      snippet=tuple(float(x) for x in
                                                    final_vec[:snippet].tolist())),
            top_k=tuple(TopToken(r + 1, i, lm.token_text(i), p, lg)
                        for r, (i, p, lg) in enumerate(zip(top_ids, top_p, top_l))),
            all_positions=all_positions, truncated=dropped, first_nonfinite=first_bad,
            notes=_notes(lm, checks[b], dropped, per_row[b], ids, grid, grid_positions)
            + ((retokenized,) if retokenized else ()),
            lens_grid=grid,
            lens_positions=grid_positions, decomposition=checks[b], positions=positions,
            mean_loss=mean_loss, perplexity=None if mean_loss is None else math.exp(mean_loss),
            token_note=bos, tokenize_seconds=p.seconds, routing=routing[b]))
    return traces


def padded_batch(lm: LoadedModel, rows: Sequence[Sequence[int]]) -> tuple[Any, Any, dict]:
    """Token id rows, left-padded into one (B, T) batch on the model's device: (input_ids,
    mask or None when no row is padded, forward kwargs with the attention mask and position
    ids counted from each row's first real token)."""
    import torch

    B, T = len(rows), max(len(ids) for ids in rows)
    input_ids = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.bool)
    for b, ids in enumerate(rows):
        input_ids[b, T - len(ids):] = torch.tensor(list(ids), dtype=torch.long)
        mask[b, T - len(ids):] = True
    kwargs: dict[str, Any] = {"use_cache": False}
    if bool(mask.all()):
        return input_ids.to(lm.device), None, kwargs
    mask = mask.to(lm.device)
    kwargs["attention_mask"] = mask.long()
    kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return input_ids.to(lm.device), mask, kwargs


def _shape_steps(cap: Capture, n: int, d: int, all_positions: bool, vocab: int
                 ) -> tuple[ShapeStep, ...]:
    """The shape of the stream at each step, for one row of n tokens."""
    L = len(cap.resid_last)
    return (ShapeStep("input_ids", "input_ids", (1, n)),
            ShapeStep("embed", "embedding", (1, n, d)),
            *(ShapeStep("resid_post", f"block {i}", (1, n, *cap.shapes[f"block {i}"][2:]))
              for i in range(L)),
            ShapeStep("final_norm", "final norm", (1, n, *cap.shapes["final_norm"][2:])),
            ShapeStep("logits", "lm_head → logits", (1, n if all_positions else 1, vocab)))


def _notes(lm: LoadedModel, check: Decomposition, dropped: int, rows: Sequence[LayerStats],
           ids: Sequence[int], grid: tuple = (), grid_positions: tuple = ()) -> tuple[str, ...]:
    """What this run's numbers say in words (notes.py has every note and its condition)."""
    notes = base_notes(lm)
    if (withheld := check.note()) is not None:
        notes.insert(0, withheld)
    if dropped:
        notes.append(TRUNCATED(n=dropped))
    if model_info(lm).tied_embeddings and rows:
        if grid:  # the lens at every position: count where the embedding row names its input
            same = sum(cell.id == ids[p] for cell, p in zip(grid[0], grid_positions))
            if same:
                notes.append(TIED_LENS_GRID(k=same, n=len(grid_positions)))
        elif rows[0].lens_id == ids[-1]:
            notes.append(TIED_LENS_LAST(token=repr(rows[0].lens_text), p=rows[0].lens_prob))
    held = [r for r in rows if r.resid_norm_max is not None and len(ids) > 1
            and r.resid_norm_max > 10 * max(r.resid_norm_last, 1e-12)]
    # every row where the condition holds, for the position where it first holds
    if held and (pos := held[0].resid_norm_max_position) is not None:
        held = [r for r in held if r.resid_norm_max_position == pos]
        peak = max(held, key=lambda r: r.resid_norm_max or 0.0)
        notes.append(MASSIVE(
            where=row_ranges([r.layer for r in held]), position=pos,
            token=repr(lm.token_text(ids[pos])), norm=peak.resid_norm_max,
            peak=row_ranges([peak.layer]), last=peak.resid_norm_last,
            channel=peak.resid_max_channel, value=peak.resid_max_value))
    return tuple(notes)


def row_ranges(layers: Sequence[int | None]) -> str:
    """Rows of the trace in words: `the embedding`, `block 5`, `blocks 11–27 and 29`, `the
    embedding and blocks 0–3` (None is the embedding row)."""
    parts = ["the embedding"] if None in layers else []
    blocks = sorted(k for k in layers if k is not None)
    runs: list[list[int]] = []
    for k in blocks:
        if runs and k == runs[-1][1] + 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    if runs:
        spans = [f"{a}" if a == b else f"{a}–{b}" for a, b in runs]
        word = "block" if len(runs) == 1 and runs[0][0] == runs[0][1] else "blocks"
        parts.append(f"{word} " + (spans[0] if len(spans) == 1 else
                                   ", ".join(spans[:-1]) + " and " + spans[-1]))
    return " and ".join(parts)


def _positions(lm: LoadedModel, prepared: Prepared, logits: torch.Tensor
               ) -> tuple[tuple[PositionStats, ...], float | None]:
    """Every position's prediction (logits: (n, V) for the row's n real positions) and the
    mean cross-entropy of the predictions that have a next token, in nats."""
    import torch

    ids = prepared.ids
    logp = torch.log_softmax(logits.float(), dim=-1)  # (n, V)
    top_lp, top_id = logp.max(dim=-1)
    toks = lm.tokens(prepared)
    rows = []
    for i in range(len(ids)):
        nxt = ids[i + 1] if i + 1 < len(ids) else None
        lp = None if nxt is None else float(logp[i, nxt])
        rows.append(PositionStats(
            position=i, token=toks[i], actual=None if nxt is None else toks[i + 1],
            actual_prob=None if lp is None else math.exp(lp),
            actual_rank=None if nxt is None else stats.rank(logp[i], nxt),
            loss=None if lp is None else -lp,
            predicted=TopToken(1, int(top_id[i]), lm.token_text(int(top_id[i])),
                               math.exp(float(top_lp[i])), float(logits[i, int(top_id[i])]))))
    losses = [r.loss for r in rows if r.loss is not None]
    return tuple(rows), (sum(losses) / len(losses) if losses else None)


def _lens_grid(lm: LoadedModel, cap: Capture, T: int) -> tuple[tuple, tuple]:
    """The stream at every kept position (the last 64 at most) of row 0, layer by layer: the
    logit lens (its top LENS_GRID_TOP tokens), ‖stream‖, and what each block, its attention
    and its MLP added there; attention's and the MLP's norms are null at a position where the
    two do not make up what the block added (the decomposition check, position by position)."""
    import torch

    n = cap.keep_positions
    streams = torch.stack(cap.streams)  # (L+1, n, d) float32
    with torch.inference_mode():
        L1, _, d = streams.shape
        logits = lm.parts.project(streams.reshape(L1 * n, d).to(lm.dtype)).float()  # (L1*n, V)
        top_logits, top_ids = logits.topk(min(LENS_GRID_TOP, logits.shape[-1]), dim=-1)
        # the softmax of the top k without a second (L1*n, V) tensor: x − logsumexp(x)
        top_lp = top_logits - torch.logsumexp(logits, dim=-1, keepdim=True)  # (L1*n, k)
    ids = top_ids.reshape(L1, n, -1).tolist()
    probs = top_lp.exp().reshape(L1, n, -1).tolist()
    values = top_logits.reshape(L1, n, -1).tolist()
    resid = stats.norms(streams).tolist()  # (L+1, n)
    added = stats.norms(streams[1:] - streams[:-1]).tolist()  # (L, n)
    measured = [a is not None and m is not None
                for a, m in zip(cap.attn_positions, cap.mlp_positions, strict=True)]
    zero = torch.zeros_like(streams[0])  # (n, d)
    attn = torch.stack([a if ok else zero  # (L, n, d)
                        for a, ok in zip(cap.attn_positions, measured, strict=True)])
    mlp = torch.stack([m if ok else zero  # (L, n, d)
                       for m, ok in zip(cap.mlp_positions, measured, strict=True)])
    mismatch, bound = stats.decomposition(streams[:-1], streams[1:], attn, mlp,
                                          str(lm.dtype).replace("torch.", ""))  # (L, n)
    holds = ((mismatch <= bound) & torch.tensor(measured, device=mismatch.device)[:, None]
             ).tolist()
    attn_n, mlp_n = stats.norms(attn).tolist(), stats.norms(mlp).tolist()  # (L, n)
    texts: dict[int, str] = {}

    def text(i: int) -> str:
        if i not in texts:
            texts[i] = lm.token_text(i)
        return texts[i]

    def cell(k: int, j: int) -> LensCell:
        top = tuple(TopToken(r + 1, i, text(i), p, v) for r, (i, p, v)
                    in enumerate(zip(ids[k][j], probs[k][j], values[k][j], strict=True)))
        split = k > 0 and holds[k - 1][j]
        return LensCell(top[0].id, top[0].text, top[0].prob, top_k=top,
                        resid_norm=resid[k][j],
                        added_norm=None if k == 0 else added[k - 1][j],
                        attn_norm=attn_n[k - 1][j] if split else None,
                        mlp_norm=mlp_n[k - 1][j] if split else None)

    grid = tuple(tuple(cell(k, j) for j in range(n)) for k in range(L1))
    return grid, tuple(range(T - n, T))


def layer_stats(lm: LoadedModel, cap: Capture, *, snippet: int = 4, logit_lens: bool = True
                ) -> tuple[list[tuple[LayerStats, ...]], list[Decomposition]]:
    """The per-layer rows (embedding, then each block) of every batch row, from what the hooks
    captured in one forward pass, and each row's decomposition check: a block whose attention
    and MLP outputs do not add up to what it added gets null for both."""
    import torch

    L = len(lm.parts.blocks)
    streams = torch.stack([cap.embed_last, *cap.resid_last])  # (L+1, B, d) float32
    mean_norms, max_norms = cap.norm_summary()  # (L+1, B), (L+1, B, 4)
    B = streams.shape[1]
    lens_ids = lens_probs = metrics = None
    if logit_lens:
        lens_ids, lens_probs, metrics = _logit_lens(lm, streams)  # (L+1, B) each

    resid_norms = stats.norms(streams)  # (L+1, B)
    added = streams[1:] - streams[:-1]  # (L, B, d)
    added_norms = stats.norms(added)
    measured = [cap.attn_last[i] is not None and cap.mlp_last[i] is not None for i in range(L)]
    zero = torch.zeros_like(streams[0])  # (B, d)
    attn = torch.stack([a if ok else zero for a, ok in zip(cap.attn_last, measured)])  # (L,B,d)
    mlp = torch.stack([m if ok else zero for m, ok in zip(cap.mlp_last, measured)])  # (L, B, d)
    attn_norms, mlp_norms = stats.norms(attn), stats.norms(mlp)
    dtype = str(lm.dtype).replace("torch.", "")
    mismatch, bound = stats.decomposition(streams[:-1], streams[1:], attn, mlp, dtype)  # (L, B)
    holds = (mismatch <= bound) & torch.tensor(measured, device=mismatch.device)[:, None]
    relative = mismatch / added_norms.clamp(min=torch.finfo(torch.float32).tiny)  # (L, B)
    cos_prev = stats.cosine(streams[1:], streams[:-1])  # (L, B)
    finite_layer = torch.isfinite(streams).all(dim=-1) & torch.isfinite(mean_norms)  # (L+1, B)
    # every figure reaches the host in one copy per tensor (on a GPU each read of one element
    # would be a copy and a wait of its own)
    got: dict[str, list] = {name: t.tolist() for name, t in (
        ("resid", resid_norms), ("mean", mean_norms), ("max", max_norms), ("added", added_norms),
        ("attn", attn_norms), ("mlp", mlp_norms), ("cos", cos_prev), ("holds", holds),
        ("relative", relative), ("finite", finite_layer), ("snippet", streams[..., :snippet]))}
    lens: dict[str, list] = {} if lens_ids is None or lens_probs is None else {
        "id": lens_ids.tolist(), "prob": lens_probs.tolist()}
    if metrics is not None:
        lens.update(rank=metrics[0].tolist(), entropy=metrics[1].tolist(),
                    kl=metrics[2].tolist())
    rows, checks = [], []
    for b in range(B):
        layers = []
        for k in range(L + 1):
            blk = k - 1
            split = k > 0 and got["holds"][blk][b]
            top = got["max"][k][b]
            layers.append(LayerStats(
                layer=None if k == 0 else blk,
                point="embed" if k == 0 else "resid_post",
                resid_norm_last=got["resid"][k][b],
                resid_norm_mean=got["mean"][k][b],
                added_norm_last=None if k == 0 else got["added"][blk][b],
                attn_norm_last=got["attn"][blk][b] if split else None,
                mlp_norm_last=got["mlp"][blk][b] if split else None,
                cos_prev=None if k == 0 else got["cos"][blk][b],
                snippet=tuple(got["snippet"][k][b]),
                lens_id=lens["id"][k][b] if lens else None,
                lens_text=lm.token_text(lens["id"][k][b]) if lens else None,
                lens_prob=lens["prob"][k][b] if lens else None,
                lens_rank=lens["rank"][k][b] if "rank" in lens else None,
                lens_entropy=lens["entropy"][k][b] if "entropy" in lens else None,
                lens_kl=lens["kl"][k][b] if "kl" in lens else None,
                resid_norm_max=top[0],
                resid_norm_max_position=int(top[1]),
                resid_max_channel=int(top[2]),
                resid_max_value=top[3],
                finite=got["finite"][k][b],
            ))
        rows.append(tuple(layers))
        checks.append(_decomposition([r[b] for r in got["relative"]],
                                     [h[b] for h in got["holds"]], measured, dtype))
    return rows, checks


def _decomposition(relative: list[float], holds: list[bool], measured: list[bool], dtype: str
                   ) -> Decomposition:
    """One row's check: relative (L,) mismatch / ‖Δ‖, holds (L,)."""
    import math

    rel = [r if m else math.nan for r, m in zip(relative, measured)]
    finite = [(r, i) for i, r in enumerate(rel) if math.isfinite(r)]
    worst = max(finite) if finite else None
    return Decomposition(
        holds=all(holds), max_mismatch=None if worst is None else worst[0],
        worst_block=None if worst is None else worst[1],
        withheld=tuple(i for i, ok in enumerate(holds) if not ok),
        tolerance=stats.decomposition_rule(dtype))


def first_nonfinite(layers: Sequence[LayerStats]) -> str | None:
    return next((("embed" if l.layer is None else f"block {l.layer}")
                 for l in layers if not l.finite), None)


def ranked_token(lm: LoadedModel, logits: torch.Tensor, i: int) -> TopToken:
    """Token i of a row of logits (V,): its rank, text, probability (float32 softmax), logit."""
    import torch

    row = logits.float()
    return TopToken(stats.rank(row, i), i, lm.token_text(i), float(torch.softmax(row, -1)[i]),
                    float(row[i]))


def lens_top_k(lm: LoadedModel, stream: Sequence[float], k: int = 10) -> tuple[TopToken, ...]:
    """The logit lens of one stream vector (e.g. a row's whole `snippet`): the model's final
    projection, then the top k tokens."""
    import torch

    if len(stream) != int(lm.config.hidden_size):
        raise BadInput("the lens needs the whole stream (trace with snippet = d_model)")
    with torch.inference_mode():
        x = torch.tensor([list(stream)], dtype=lm.dtype, device=lm.device)
        logits = lm.parts.project(x)[0].float()
    ids, probs, values = stats.top_k(logits, k)
    return tuple(TopToken(r + 1, i, lm.token_text(i), p, v)
                 for r, (i, p, v) in enumerate(zip(ids, probs, values)))


def _logit_lens(lm: LoadedModel, streams: Any, metrics: bool = True
                ) -> tuple[Any, Any, tuple[Any, Any, Any] | None]:
    """The model's final projection (final norm, LM head, final softcap where the family has
    one) on each layer's last-position stream: top-1 id and probability, and (metrics) three
    measures against the final distribution (the last row's, which is the model's own): the
    rank of the final top-1 token in each row's lens (1: it is the lens's top-1), the lens's
    entropy and KL(final ‖ lens), both in nats. Each (L+1, B)."""
    import torch

    L1, B, d = streams.shape
    with torch.inference_mode():
        x = streams.reshape(L1 * B, d).to(lm.dtype)
        logp = torch.log_softmax(lm.parts.project(x).float(), dim=-1).reshape(L1, B, -1)
        top_lp, idx = logp.max(dim=-1)
        if not metrics:
            return idx.cpu(), top_lp.exp().cpu(), None
        p = logp.exp()  # (L+1, B, V)
        top_p = top_lp.exp()
        final_logp = logp[-1]  # (B, V)
        final_top = final_logp.argmax(dim=-1)  # (B,)
        at_final = logp.gather(-1, final_top[None, :, None].expand(L1, B, 1))  # (L+1, B, 1)
        rank = (logp > at_final).sum(dim=-1) + 1
        entropy = -(p * logp).sum(dim=-1)
        kl = (final_logp.exp()[None] * (final_logp[None] - logp)).sum(dim=-1)
    return idx.cpu(), top_p.cpu(), (rank.cpu(), entropy.cpu(), kl.clamp(min=0).cpu())


__all__ = ["model_info", "run_trace", "run_traces", "sizes"]
