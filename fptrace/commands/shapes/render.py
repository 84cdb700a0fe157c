"""Rich tables for `fptrace shapes`."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from fptrace.commands.shapes.result import ShapeReport
from fptrace.models.memory import human_bytes
from fptrace.render.fit import Col, RowStyle, fit_table
from fptrace.render.tables import token_table
from fptrace.render.text import shape


def _flops(n: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} FLOP"


def header(r: ShapeReport) -> RenderableType:
    kv = f"{r.n_heads} / {r.n_kv_heads} KV"
    text = Text()
    text.append(f"{r.model}", style="bold")
    text.append(f"  family {r.family} ({r.norm_type}, {r.mlp_type} MLP, {r.positions} "
                f"positions)\n")
    text.append(f"{r.n_layers} blocks · d_model {r.d_model} · heads {kv} · head_dim "
                f"{r.head_dim} · d_mlp {r.d_mlp or '?'} · vocab {r.vocab_size:,} · context "
                f"{r.context_length or '?'}\n")
    text.append(f"weights not read: the model was built on the meta device in "
                f"{r.seconds:.2f} s\n", style="dim")
    text.append(f"source: {r.source}", style="dim")
    return Panel(text, title="fptrace shapes", title_align="left", expand=False)


def tokens(r: ShapeReport, width: int | None = None) -> RenderableType:
    if not r.tokens:
        return Text(f"No prompt: sequence length {r.seq_len}, batch {r.batch}\n")
    return token_table(r.tokens, f"Tokens ({r.tokenizer})", width)


FLOW_COLS = (Col("#", 1, "right", style="dim"), Col("step", 0, wrap=True, min_width=16),
             Col("shape", 0, style="cyan"), Col("trace point", 2, style="dim"))


def flow(r: ShapeReport, width: int | None = None) -> RenderableType:
    rows = [[str(i), s.label, shape(s.shape), s.point if s.point != "block" else ""]
            for i, s in enumerate(r.steps)]
    n, hs = r.hidden_states
    return fit_table(FLOW_COLS, rows, width,
                     title=f"Shape flow of one forward pass (B={r.batch}, T={r.seq_len}); "
                     "block 0 in detail, recorded on the meta device", title_justify="left",
                     caption=f"output_hidden_states would give {n} tensors of {shape(hs)}; the "
                     "last one after the final norm", caption_justify="left")


PARAM_COLS = (Col("parameter", 0, wrap=True, min_width=16), Col("shape", 1),
              Col("each", 1, "right"), Col("×", 1, "right"), Col("total", 0, "right"),
              Col("share", 2, "right"))


def params(r: ShapeReport, width: int | None = None) -> RenderableType:
    """Every parameter tensor (block 0's × the number of blocks), a per-block subtotal and the
    total: each row reconciles with the matrix shapes of the flow. Blocks of different kinds
    (DeepSeek-V3's dense first blocks) get a subtotal each."""
    rows: list = []
    sections = []
    block = [g for g in r.params if g.part == "block"]
    kinds: dict[str, list] = {}
    for g in block:
        kinds.setdefault(g.name.split(":", 1)[0], []).append(g)
    for k, g in enumerate(r.params):
        total = g.count * g.times
        rows.append([g.name, shape(g.shape) if g.shape else "", f"{g.count:,}", str(g.times),
                     f"{total:,}", f"{100 * total / r.n_params:.1f}%"])
        kind = kinds.get(g.name.split(":", 1)[0]) if g.part == "block" else None
        if kind and g is kind[-1]:
            per_block = sum(x.count for x in kind)
            what = "per block" if len(kinds) == 1 else f"per block of {g.name.split(':')[0]}"
            rows.append(RowStyle([f"{what}, all of the above ({len(kind)} tensors)", "",
                                  f"{per_block:,}", str(g.times), f"{per_block * g.times:,}",
                                  f"{100 * per_block * g.times / r.n_params:.1f}%"], "bold"))
            sections.append(len(rows))
    sections.append(len(rows))
    rows.append(RowStyle(["total (= sum of the model's parameters)", "", "", "",
                          f"{r.n_params:,}", "100%"], "bold"))
    caption = (f"tying the LM head to the embedding saves {r.cost.tied_saving_params:,} "
               "parameters") if r.tied_embeddings else None
    return fit_table(PARAM_COLS, rows, width, sections=sections, title="Parameters",
                     title_justify="left", caption=caption, caption_justify="left")


MOE_COLS = (Col("blocks", 0), Col("MLP", 1), Col("× blocks", 1, "right"),
            Col("total, one block", 0, "right"), Col("active per token", 0, "right"),
            Col("active share", 2, "right"))


def experts(r: ShapeReport, width: int | None = None) -> RenderableType:
    """A mixture-of-experts model's total and active parameters, per kind of block and in all."""
    m = r.moe
    assert m is not None  # shown for a mixture of experts only
    shared = f" (+ {m.n_shared} shared)" if m.n_shared else ""
    rows: list = [[b.blocks, "experts" if b.moe else "dense", str(b.count), f"{b.total:,}",
                   f"{b.active:,}", f"{100 * b.active / b.total:.1f}%"] for b in m.blocks]
    rows.append(RowStyle(["all parameters", "", "", f"{m.total_params:,}", f"{m.active_params:,}",
                          f"{100 * m.active_params / m.total_params:.1f}%"], "bold"))
    rows.append(["without the token embedding", "", "", "",
                 f"{m.active_params_no_embedding:,}", ""])
    return fit_table(MOE_COLS, rows, width, sections=[len(m.blocks)],
                     title=f"Mixture of experts: {m.n_experts} experts, {m.top_k} active{shared}, "
                     f"d_expert {m.d_expert}; {m.moe_blocks} of {r.n_layers} blocks",
                     title_justify="left", caption=m.convention + "; one decoding step reads "
                     f"{human_bytes(m.active_weights_bytes[r.dtype])} of weights per token in "
                     f"{r.dtype}", caption_justify="left")


COST_COLS = (Col("what", 0, wrap=True, min_width=16), Col("size", 0, "right"))


def cost(r: ShapeReport, width: int | None = None) -> RenderableType:
    c = r.cost
    rows = [[f"weights in {prec}", human_bytes(b)] for prec, b in c.weights_bytes.items()]
    rows += [
        ["KV cache per token (K and V, all layers)", human_bytes(c.kv_cache_per_token_bytes)],
        [f"KV cache at T={r.seq_len}, B={r.batch}", human_bytes(c.kv_cache_bytes)],
        ["residual stream, one layer (B×T×d)", human_bytes(c.residual_per_layer_bytes)],
        [f"logits for all positions: {c.logits_all_numbers:,} numbers",
         human_bytes(c.logits_all_bytes)],
        [f"logits for the last position: {c.logits_last_numbers:,} numbers",
         human_bytes(c.logits_last_bytes)],
        [f"FLOPs of the prefill (T={r.seq_len})", _flops(c.flops_prefill)],
        ["FLOPs of one decode step", _flops(c.flops_decode_step)]]
    experts = r.moe is not None
    if r.moe is not None:
        rows.insert(len(c.weights_bytes), [f"weights one token reads in {r.dtype} (active "
                                           "experts)",
                                           human_bytes(r.moe.active_weights_bytes[r.dtype])])
    return fit_table(COST_COLS, rows, width, title=f"Memory and compute (activations in "
                     f"{r.dtype})", title_justify="left",
                     caption="FLOPs: 2 per multiply-add over the block matrices and the LM head"
                     + (" (of the routed experts, the chosen ones)" if experts else "") + ", "
                     "plus Q·Kᵀ and weights·V over the full T×T (no causal saving); norms, "
                     "softmax and activations not counted. 4-bit: 0.5 byte per weight, scales "
                     "not counted.", caption_justify="left")


def differences(r: ShapeReport) -> RenderableType:
    if not r.differences:
        return Text("")
    text = Text(f"How {r.model} differs from GPT-2:\n", style="bold")
    for d in r.differences:
        text.append(f"• {d}\n")
    for n in r.notes:
        text.append(f"• {n}\n", style="yellow")
    return text


def plan(r: ShapeReport) -> RenderableType:
    p = r.plan
    if p is None:
        return Text("")
    text = Text(f"GPUs of {human_bytes(p.gpu_memory_bytes)}: the weights in {r.dtype} "
                f"({human_bytes(p.weights_bytes)}) and the KV cache at T={r.seq_len}, B={r.batch} "
                f"({human_bytes(p.kv_cache_bytes)}) need {human_bytes(p.needed_bytes)}: "
                f"{p.gpus_needed} GPU" + ("s" if p.gpus_needed > 1 else "") + "\n", style="bold")
    text.append(p.tp_note)
    return Panel(text, title="Plan", title_align="left", expand=False)


def shape_view(r: ShapeReport, width: int | None = 120) -> RenderableType:
    parts = [header(r), tokens(r, width), flow(r, width), differences(r), params(r, width)]
    if r.moe is not None:  # a dense model's view stays as it was
        parts.append(experts(r, width))
    return Group(*parts, cost(r, width), plan(r))
