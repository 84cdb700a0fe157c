"""Shape flow and parameter / memory / FLOP accounting, without reading any weights.

The model is built from its config on the meta device (no memory, any size) and run once with
hooks: every shape shown is recorded from the model's own modules and tensor operations during
that run, not taken from a template.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from fptrace.commands.shapes.notes import BEYOND_CONTEXT
from fptrace.commands.shapes.result import (
    BlockCount,
    CostReport,
    GpuPlan,
    MoeCount,
    ParamGroup,
    ShapeReport,
)
from fptrace.core.hooks import Hook, hooked
from fptrace.errors import BadInput, FptraceError, param
from fptrace.families.kinds import PositionKind
from fptrace.families.parts import dims, resolve_parts
from fptrace.results import ShapeStep, Token

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel

    from fptrace.families import Family, Moe
    from fptrace.families.parts import ModelParts
    from fptrace.models.registry import ModelSpec

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "4-bit": 0.5}

class _Recorder:
    """Timeline of one block's forward on the meta device: module outputs and tensor ops."""

    def __init__(self, block: nn.Module, attn: nn.Module, mlp: nn.Module):
        self.events: list[tuple[str, str, tuple[int, ...], str]] = []  # kind, name, shape, scope
        self.stack: list[str] = []
        self.block, self.attn, self.mlp = block, attn, mlp
        self.names = {m: n for n, m in block.named_modules()}
        self.top: dict[str, tuple] = {}  # shapes outside block 0: embeddings, final norm
        self.logits_shape: tuple[int, ...] = ()

    def scope(self) -> str:
        return self.stack[-1] if self.stack else ""


def _shape(x: object) -> tuple[int, ...] | None:
    import torch

    if isinstance(x, (tuple, list)) and x:
        x = x[0]
    return tuple(x.shape) if isinstance(x, torch.Tensor) else None


def _record_block(model: nn.Module, parts: ModelParts, input_ids: torch.Tensor) -> _Recorder:
    import torch
    from torch.overrides import TorchFunctionMode

    block = parts.blocks[0]
    rec = _Recorder(block, parts.attns[0], parts.mlps[0])
    interesting = {"matmul", "softmax", "add", "__add__", "mul", "__mul__", "expand",
                   "reshape", "transpose", "view", "cat", "truediv", "__truediv__", "div",
                   "scaled_dot_product_attention", "where", "masked_fill", "baddbmm", "bmm",
                   "split"}

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", str(func))
            shp = _shape(out)
            if name in interesting and shp is not None and rec.stack:
                others = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
                rec.events.append(("op", name, shp, rec.scope() + "|" + repr(others)))
            return out

    def pre(module, args):
        rec.stack.append(rec.names[module])

    def post(module, args, output):
        name = rec.stack.pop()
        shp = _shape(output)
        if shp is not None:
            rec.events.append(("module", name, shp, rec.scope()))

    def keep(key):
        def hook(module, args, output):
            rec.top[key] = _shape(output)
        return hook

    hooks = [Hook.after(parts.embed, keep("embed")),
             Hook.after(parts.final_norm, keep("final_norm")),
             Hook.after(parts.blocks[-1], keep("last_block"))]
    if parts.family.pos_embed:
        hooks.append(Hook.after(model.get_submodule(parts.family.pos_embed), keep("pos_embed")))
    for module in block.modules():
        hooks += [Hook.before(module, pre), Hook.after(module, post)]
    # an explicit all-ones mask keeps transformers from inspecting values (meta has none)
    mask = torch.ones(input_ids.shape, dtype=torch.long, device="meta")
    # the mode sees every tensor op of the forward; only those inside block 0 are recorded
    # (rec.stack is empty elsewhere), and a `with` block leaves it whatever happens
    with torch.no_grad(), hooked(hooks), Mode():
        out = model(input_ids, attention_mask=mask, use_cache=False, logits_to_keep=0)
    rec.logits_shape = tuple(out.logits.shape)
    return rec


def _block_steps(rec: _Recorder, cfg: dict, fam: Family) -> list[ShapeStep]:
    """Name the recorded events of block 0 the way a textbook walks through a block."""
    T, d, h, kv, hd = (cfg[k] for k in ("T", "d", "h", "kv", "hd"))
    steps: list[ShapeStep] = []
    attn_name = rec.names[rec.attn]
    mlp_name = rec.names[rec.mlp]
    seen: set[str] = set()

    def add(point: str, label: str, shape: tuple, once: bool = True) -> None:
        if once and label in seen:
            return
        seen.add(label)
        steps.append(ShapeStep(point, label, tuple(shape)))

    for kind, name, shape, scope in rec.events:
        in_attn = name.startswith(attn_name) if kind == "module" else \
            scope.split("|")[0].startswith(attn_name)
        if kind == "module":
            if name == "":
                continue
            if name == attn_name:
                add("attn_out" if not fam.attn_added else "block",
                    "attention output" + ("" if fam.attn_added else " (what is added)"), shape)
                continue
            if name == mlp_name:
                add("mlp_out" if not fam.mlp_added else "block",
                    "MLP output" + ("" if fam.mlp_added else " (what is added)"), shape)
                continue
            label = fam.label(name.rsplit(".", 1)[-1], name.startswith(attn_name + "."))
            if label:
                point = "resid_pre" if label == "norm before attention" else \
                    "resid_mid" if label == "norm before the MLP" else \
                    "attn_out" if name == fam.attn_added else \
                    "mlp_out" if name == fam.mlp_added else "block"
                add(point, label, shape, once=False)
            continue
        op, where = name, scope.split("|")[0]
        if in_attn:
            if op == "transpose" and len(shape) == 4 and shape[2] == T and shape[3] == hd:
                who = "Q" if shape[1] == h and "Q split into heads" not in seen else \
                    "K" if "K split into heads" not in seen else "V"
                add("block", f"{who} split into heads", shape)
            elif op == "split" and len(shape) == 3:
                add("block", "split into Q, K, V (each)", shape)
            elif op == "cat" and len(shape) == 4 and cfg["rope"]:
                add("block", "RoPE rotates Q and K (shape unchanged)", shape)
            elif op == "expand" and len(shape) == 5:
                add("block", f"repeat K/V: {kv} KV heads × {h // kv} for grouped-query attention",
                    shape)
            elif op == "reshape" and len(shape) == 4 and shape[1] == h and kv != h:
                add("block", f"K, V repeated to {h} heads", shape)
            elif op in ("matmul", "bmm", "baddbmm") and len(shape) == 4 and shape[-1] == T \
                    and shape[-2] == T:
                add("block", "scores = Q·Kᵀ", shape)
            elif op in ("mul", "__mul__", "truediv", "__truediv__", "div") and len(shape) == 4 \
                    and shape[-1] == T and shape[-2] == T:
                add("block", "scaled by 1/√d_head", shape)
            elif op in ("add", "__add__", "where", "masked_fill") and len(shape) == 4 \
                    and shape[-1] == T:
                add("block", "causal mask (−∞ above the diagonal)", shape)
            elif op == "softmax":
                add("block", "softmax over keys (rows sum to 1)", shape)
            elif op in ("matmul", "bmm") and len(shape) == 4 and shape[-1] == hd:
                add("block", "weights·V", shape)
            elif op == "scaled_dot_product_attention":
                add("block", "fused attention (scores, mask, softmax, ·V)", shape)
            elif op in ("reshape", "view") and len(shape) == 3 and shape[-1] == h * hd \
                    and "weights·V" in seen:
                add("block", "heads concatenated", shape)
        elif where == mlp_name and cfg["gated"]:
            if op in ("mul", "__mul__") and len(shape) == 3 and shape[-1] in cfg["d_mlp"]:
                add("block", "act(gate) · up", shape)
        elif where == "":
            if op in ("add", "__add__") and len(shape) == 3 and shape[-1] == d:
                label = "residual add (attention)" if "residual add (attention)" not in seen \
                    else "residual add (MLP)"
                add("resid_mid" if label.endswith("(attention)") else "resid_post", label, shape)
    return steps


def shape_report(name: str, prompt: str | None = None, seq_len: int | None = None, batch: int = 1,
                 dtype: str = "float32", warn: Callable[[str], object] | None = None,
                 gpu_memory: str | None = None) -> ShapeReport:
    import torch
    from transformers import AutoModelForCausalLM

    from fptrace.models.registry import resolve
    from fptrace.models.sources import load_config

    t0 = time.perf_counter()
    gpu_bytes = None
    if gpu_memory is not None:
        from fptrace.models.devices import parse_size

        gpu_bytes = parse_size(gpu_memory, param("gpu_memory"))
        if gpu_bytes <= 0:
            raise BadInput(f"{param('gpu_memory')} must be above 0")
    if batch < 1:
        raise BadInput(f"{param('batch')} must be at least 1")
    if dtype not in BYTES or dtype in ("int8", "4-bit"):
        raise BadInput(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    if seq_len is not None and seq_len < 1:
        raise BadInput(f"{param('seq_len')} must be at least 1")
    spec = resolve(name)
    config = load_config(spec)
    tokens, tokenizer_name = _tokens(spec, config, prompt, seq_len)
    seq_len = len(tokens) if tokens else (seq_len or 8)
    ctx = getattr(config, "max_position_embeddings", None)
    notes = []
    if ctx and seq_len > ctx:
        msg = BEYOND_CONTEXT(n=seq_len, model=spec.name, ctx=ctx)
        notes.append(msg)
        if warn:
            warn(msg)
    with torch.device("meta"):  # eager attention materializes the scores, so their shape is seen
        # batched_mm: the experts' matmuls in any dtype on any device (the default grouped_mm
        # wants bfloat16 and real memory)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                 **_experts_eager(config))
    model.eval()
    parts = resolve_parts(model)
    fam = parts.family
    dm = dims(config, fam)
    d, h, kv, hd, V = dm.d_model, dm.n_heads, dm.n_kv_heads, dm.head_dim, dm.vocab_size
    L = len(parts.blocks)
    ids = torch.zeros((batch, seq_len), dtype=torch.long, device="meta")
    rec = _record_block(model, parts, ids)
    # the recorded block's MLP width: the config's, or (DeepSeek-V3's dense first blocks, wider
    # than its experts) that of block 0's own up projection
    up = getattr(parts.mlps[0], "up_proj", None)
    widths = {dm.d_mlp, getattr(up, "out_features", dm.d_mlp)}
    cfg = dict(B=batch, T=seq_len, d=d, h=h, kv=kv, hd=hd, d_mlp=widths,
               rope=fam.positions is PositionKind.rope, gated=fam.mlp_type.gated)
    steps = _flow(rec, cfg, fam, batch, seq_len, L, V, d)
    n_hidden = L + 1

    groups, total = _param_groups(model, parts, L)
    tied = _tied(model)
    moe = fam.moe(config) if fam.moe else None
    moe_count, matmul = _moe_count(model, parts, moe, L, tied) if moe else (None, None)
    cost = _costs(groups, total, L=L, d=d, h=h, kv=kv, hd=hd, V=V, T=seq_len, B=batch,
                  dtype=dtype, tied=tied, matmul=matmul,
                  kv_values=fam.kv_cache_values(config) if fam.kv_cache_values else None,
                  qk_hd=fam.qk_head_dim(config) if fam.qk_head_dim else None)
    return ShapeReport(
        model=spec.name, family=fam.name, source=spec.known.source if spec.known else
        (spec.path or spec.hub_id or ""),
        n_layers=L, d_model=d, n_heads=h, n_kv_heads=kv, head_dim=hd, d_mlp=dm.d_mlp,
        vocab_size=V, context_length=ctx, norm_type=fam.norm_type.value,
        mlp_type=fam.mlp_type.value, positions=fam.positions.value, tied_embeddings=tied, batch=batch, seq_len=seq_len,
        tokens=tokens, tokenizer=tokenizer_name, steps=tuple(steps),
        hidden_states=(n_hidden, (batch, seq_len, d)),
        params=tuple(groups), n_params=total, cost=cost, dtype=dtype,
        differences=tuple(fam.differences(h, kv, config)), notes=tuple(notes),
        seconds=time.perf_counter() - t0,
        plan=None if gpu_bytes is None else gpu_plan(gpu_bytes, cost, dtype, h, kv),
        moe=moe_count)


def _flow(rec: _Recorder, cfg: dict, fam: Family, batch: int, seq_len: int, L: int, V: int,
          d: int) -> list[ShapeStep]:
    """The steps of the flow: input ids, the embedding, block 0 in detail, the stream after the
    last block, the final norm, the LM head at every position and at the last one."""
    steps = [ShapeStep("input_ids", "input_ids", (batch, seq_len))]
    top = rec.top
    if fam.pos_embed:
        steps.append(ShapeStep("embed", "token embedding", top["embed"]))
        pos = tuple(top["pos_embed"])
        if batch > 1 and pos[0] == 1:
            steps.append(ShapeStep("embed", f"+ position embedding {_fmt(pos)}, broadcast over "
                                   "the batch", pos))
            steps.append(ShapeStep("embed", "= embedding (token + position)",
                                   (batch, *pos[1:])))
        else:
            steps.append(ShapeStep("embed", "+ position embedding", pos))
    else:
        steps.append(ShapeStep("embed", "token embedding (no position embedding: RoPE "
                               "inside attention)" if cfg["rope"] else "token embedding",
                               top["embed"]))
    steps += _block_steps(rec, cfg, fam)
    steps.append(ShapeStep("resid_post", f"× {L} blocks: the stream after the last one",
                           top["last_block"]))
    steps.append(ShapeStep("final_norm", "final norm", top["final_norm"]))
    steps.append(ShapeStep("logits", f"LM head W_U {_fmt((V, d))} → logits at every position "
                           "(what training scores)", rec.logits_shape))
    steps.append(ShapeStep("final_norm", "last position only: h[:, −1]", (batch, 1, d)))
    steps.append(ShapeStep("logits", f"LM head W_U {_fmt((V, d))} → next-token logits",
                           (batch, 1, V)))
    return steps


def gpu_plan(gpu_bytes: int, cost: CostReport, dtype: str, heads: int, kv: int) -> GpuPlan:
    """GPUs of gpu_bytes each for the weights (in dtype) plus the KV cache, and the smallest
    --tp that splits the model over at least that many (a divisor of both head counts)."""
    weights = cost.weights_bytes[dtype]
    needed = weights + cost.kv_cache_bytes
    gpus = max(1, math.ceil(needed / gpu_bytes))
    tp = next((n for n in range(gpus, min(heads, kv) + 1) if heads % n == 0 and kv % n == 0),
              None)
    if tp is None:
        note = (f"no tensor-parallel size of at least {gpus} divides both {heads} attention heads "
                f"and {kv} key/value heads: more GPUs than tensor parallelism can use alone "
                "(add pipeline parallelism, a smaller dtype, or GPUs with more memory)")
    elif tp == gpus:
        note = f"--tp {tp}: the smallest valid split onto {gpus} GPU" + ("s" if gpus > 1 else "")
    else:
        note = (f"--tp {tp}: {gpus} GPUs would hold it, but {gpus} does not divide {heads} "
                f"attention heads and {kv} key/value heads; {tp} is the next size that does")
    return GpuPlan(gpu_memory_bytes=gpu_bytes, weights_bytes=weights,
                   kv_cache_bytes=cost.kv_cache_bytes, needed_bytes=needed, gpus_needed=gpus,
                   tp=tp, tp_note=note + "; activations and framework overhead not counted")


def _fmt(shape: tuple) -> str:
    return "(" + ", ".join(str(x) for x in shape) + ")"


def _tokens(spec: ModelSpec, config: PretrainedConfig, prompt: str | None, seq_len: int | None
            ) -> tuple[tuple[Token, ...], str | None]:
    """The prompt's tokens from the model's offline tokenizer (never weights), and the
    tokenizer's name; none without a prompt."""
    from fptrace.models.loading import tokenizer_for
    from fptrace.models.tokenizers import encode_prompt

    if prompt is None:
        return (), None
    tok = tokenizer_for(spec, config, lambda m: None)  # local files only, never weights
    if tok is None:
        if seq_len is None:
            raise BadInput(f"no tokenizer for {spec.name} is available offline; "
                           f"give {param('seq_len')} instead of a prompt")
        return (), None
    ids = encode_prompt(tok, prompt)
    return tuple(Token(i, t, tok.token_text(t)) for i, t in enumerate(ids)), tok.name


def _experts_eager(config: PretrainedConfig) -> dict:
    """from_config's argument that runs a model's experts as batched matmuls (shapes only: on
    the meta device), for a model whose class lets the experts' implementation be chosen."""
    from transformers import AutoModelForCausalLM

    cls = AutoModelForCausalLM._model_mapping.get(type(config), None)
    if cls is not None and cls._can_set_experts_implementation():
        return {"experts_implementation": "batched_mm"}
    return {}


def _tied(model: PreTrainedModel) -> bool:
    i, o = model.get_input_embeddings(), model.get_output_embeddings()
    return o is not None and i is not None and o.weight is i.weight


def _block_kinds(model: nn.Module, blocks: str, L: int) -> list[list[int]]:
    """The blocks grouped by their parameters (names and shapes): one group for most models,
    two for DeepSeek-V3 (dense first blocks, MoE blocks after), in order of first block."""
    sig: dict[int, list] = {i: [] for i in range(L)}
    for pname, p in model.named_parameters():
        if pname.startswith(blocks + "."):
            idx_str, rel = pname[len(blocks) + 1:].split(".", 1)
            sig[int(idx_str)].append((rel, tuple(p.shape)))
    kinds: dict[tuple, list[int]] = {}
    for i in range(L):
        kinds.setdefault(tuple(sig[i]), []).append(i)
    return list(kinds.values())


def _span(ids: list[int]) -> str:
    """`blocks 3–60`, `block 0`, `blocks 0, 2, 4` (the blocks of one kind)."""
    if len(ids) == 1:
        return f"block {ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"blocks {ids[0]}–{ids[-1]}"
    return "blocks " + ", ".join(str(i) for i in ids)


def _param_groups(model: nn.Module, parts: ModelParts, L: int) -> tuple[list[ParamGroup], int]:
    """One row per parameter tensor a student can reconcile: the embeddings, every weight and
    bias of block 0 (× L), the final norm and the LM head, each with its shape. Blocks that
    differ (DeepSeek-V3's dense first blocks) are listed once per kind, named by their span."""
    names = {m: n for n, m in model.named_modules()}
    fam = parts.family
    tops = [(names[parts.embed], "token embedding W_E"),
            (fam.pos_embed, "position embedding W_P"), (names[parts.final_norm], "final norm"),
            (names[parts.lm_head], "LM head W_U")]
    blocks = names[parts.blocks[0]].rsplit(".", 1)[0]
    attn_rel = names[parts.attns[0]][len(names[parts.blocks[0]]) + 1:]
    kinds = _block_kinds(model, blocks, L)
    first = {ids[0]: ids for ids in kinds}
    groups: list[ParamGroup] = []
    for pname, p in model.named_parameters():  # shared (tied) tensors are listed once
        n, shape = p.numel(), tuple(int(x) for x in p.shape)
        if pname.startswith(blocks + "."):
            idx_str, rel = pname[len(blocks) + 1:].split(".", 1)
            ids = first.get(int(idx_str))
            if ids is not None:
                owner = rel.rsplit(".", 1)[0]
                label = fam.label(owner.rsplit(".", 1)[-1], rel.startswith(attn_rel + "."))
                where = "block" if len(kinds) == 1 else _span(ids)
                groups.append(ParamGroup(f"{where}: {rel}" + (f" ({label})" if label else ""),
                                         n, len(ids), shape, "block"))
            continue
        where = next((label for prefix, label in tops
                      if prefix and pname.startswith(prefix + ".")), "other")
        groups.append(ParamGroup(f"{where}: {pname.rsplit('.', 1)[-1]}", n, 1, shape,
                                 "head" if where.startswith("LM head") else
                                 "embedding" if "embedding" in where else
                                 "final" if where == "final norm" else "other"))
    if parts.lm_head.weight is parts.embed.weight:
        groups.append(ParamGroup("LM head W_U: weight, tied to W_E (no new parameters)", 0, 1,
                                 tuple(int(x) for x in parts.lm_head.weight.shape), "head"))
    order = {"embedding": 0, "block": 1, "final": 2, "head": 3, "other": 4}
    groups.sort(key=lambda g: order[g.part])  # stable: each part keeps the model's order
    total = sum(g.count * g.times for g in groups)
    check = sum(p.numel() for p in model.parameters())
    if total != check:
        raise FptraceError(f"shapes: the parameter rows add up to {total:,}, the model has "
                           f"{check:,}")
    return groups, total


def _expert_share(model: nn.Module, parts: ModelParts, moe: Moe
                  ) -> tuple[dict[str, float], list[int]]:
    """For an MoE model: the routed experts' parameter tensors, each with the share of it one
    token uses (top_k / n_experts), and the indices of the MoE blocks (those whose MLP has a
    router)."""
    fam = parts.family
    names = {m: n for n, m in model.named_modules()}
    share: dict[str, float] = {}
    moe_blocks = []
    for i, (blk, mlp) in enumerate(zip(parts.blocks, parts.mlps)):
        experts = _get_child(mlp, fam.experts)
        if _get_child(mlp, fam.router) is None or experts is None:
            continue
        moe_blocks.append(i)
        for pname, p in experts.named_parameters():
            if p.shape[0] != moe.n_experts:
                raise FptraceError(f"shapes: {names[experts]}.{pname} has {p.shape[0]} rows, "
                                   f"not one per expert ({moe.n_experts})")
            share[f"{names[experts]}.{pname}"] = moe.top_k / moe.n_experts
    return share, moe_blocks


def _get_child(module: nn.Module, path: str | None) -> nn.Module | None:
    if not path:
        return None
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def _moe_count(model: nn.Module, parts: ModelParts, moe: Moe, L: int, tied: bool
               ) -> tuple[MoeCount, int]:
    """Total and active parameters (per token), per kind of block and in all, and the active
    matrices' parameters (what a token multiplies). The convention: a parameter is active for
    a token when that token's forward pass reads it; the token embedding and the LM head are
    counted (as Mixtral's card counts them), and the figure without the token embedding (a
    lookup, not a multiply: gpt-oss's card leaves it out) is given beside it."""
    share, moe_blocks = _expert_share(model, parts, moe)
    names = {m: n for n, m in model.named_modules()}
    blocks = names[parts.blocks[0]].rsplit(".", 1)[0]
    embed = names[parts.embed] + "."
    total = active = embed_params = matmul = 0
    per_block_total = [0] * L
    per_block_active = [0] * L
    for pname, p in model.named_parameters():
        n = p.numel()
        f = share.get(pname, 1.0)
        used = int(round(n * f))  # an expert tensor is E equal slices: exact
        total += n
        active += used
        if pname.startswith(embed):
            embed_params += n
        if pname.startswith(blocks + "."):
            i = int(pname[len(blocks) + 1:].split(".", 1)[0])
            per_block_total[i] += n
            per_block_active[i] += used
            if (p.dim() == 2 and pname not in share) or p.dim() == 3:
                matmul += used  # the blocks' matrices (experts: the chosen ones), no biases
    matmul += parts.lm_head.weight.numel()
    kinds = []
    for ids in _block_kinds(model, blocks, L):
        kinds.append(BlockCount(blocks=_span(ids), count=len(ids), moe=ids[0] in moe_blocks,
                                total=per_block_total[ids[0]],
                                active=per_block_active[ids[0]]))
    no_embed = active - (0 if tied else embed_params)
    return MoeCount(
        n_experts=moe.n_experts, top_k=moe.top_k, n_shared=moe.n_shared,
        d_expert=moe.d_expert, moe_blocks=len(moe_blocks), total_params=total,
        active_params=active, active_params_no_embedding=no_embed, blocks=tuple(kinds),
        active_weights_bytes={k: int(math.ceil(active * v)) for k, v in BYTES.items()},
        convention=("active: every parameter one token's forward pass reads, the routed experts "
                    f"counted {moe.top_k} of {moe.n_experts}; the token embedding and the LM head "
                    "counted in both figures; 'without the token embedding' leaves out the "
                    "lookup table" + (" (tied to the LM head here, so it stays)" if tied
                                      else ""))), matmul


def _costs(groups: list[ParamGroup], total: int, *, L: int, d: int, h: int, kv: int, hd: int,
           V: int, T: int, B: int, dtype: str, tied: bool, matmul: int | None = None,
           kv_values: int | None = None, qk_hd: int | None = None) -> CostReport:
    """matmul: the parameters one token multiplies, where the groups cannot say (an MoE model:
    the chosen experts only); kv_values: the values a block caches per token, where it is not
    K and V of every key/value head; qk_hd: the values a head's query and key have, where it is
    not hd (DeepSeek-V3: 192, its values 128)."""
    b = BYTES[dtype]
    weights = {k: int(math.ceil(total * v)) for k, v in BYTES.items()}
    # K and V, every layer (or what the family caches instead: kv_values a layer)
    kv_per_token = (2 * kv * hd if kv_values is None else kv_values) * L * b
    # parameters that multiply each token (matrices of blocks and the LM head, not the
    # embedding lookup, norms or biases counted separately)
    block_mats = sum(g.count * g.times for g in groups  # the blocks' matrices, not their
                     if g.part == "block" and len(g.shape) == 2)  # norms or biases
    head = V * d
    matmul_params = block_mats + head if matmul is None else matmul
    # Q·Kᵀ (qk_hd values a head) and weights·V (hd) over the full T×T
    per_pair = 2 * h * ((qk_hd or hd) + hd)
    attn_prefill = L * B * T * T * per_pair
    prefill = 2 * B * T * matmul_params + attn_prefill
    decode = 2 * B * matmul_params + L * B * T * per_pair
    return CostReport(
        weights_bytes=weights, kv_cache_per_token_bytes=kv_per_token,
        kv_cache_bytes=kv_per_token * B * T, residual_per_layer_bytes=B * T * d * b,
        logits_all_numbers=B * T * V, logits_all_bytes=B * T * V * b,
        logits_last_numbers=B * V, logits_last_bytes=B * V * b,
        tied_saving_params=head if tied else 0,
        flops_prefill=prefill, flops_decode_step=decode, matmul_params=matmul_params)
