"""Shape flow and parameter / memory / FLOP accounting, without reading any weights.

The model is built from its config on the meta device (no memory, any size) and run once with
hooks: every shape shown is recorded from the model's own modules and tensor operations during
that run, not taken from a template.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .errors import BadInput
from .families.parts import dims, resolve_parts
from .hooks import hooked
from .results import CostReport, ParamGroup, ShapeReport, ShapeStep, Token

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "4-bit": 0.5}

class _Recorder:
    """Timeline of one block's forward on the meta device: module outputs and tensor ops."""

    def __init__(self, block: Any, attn: Any, mlp: Any):
        self.events: list[tuple[str, str, tuple[int, ...], str]] = []  # kind, name, shape, scope
        self.stack: list[str] = []
        self.block, self.attn, self.mlp = block, attn, mlp
        self.names = {m: n for n, m in block.named_modules()}
        self.top: dict[str, tuple] = {}  # shapes outside block 0: embeddings, final norm
        self.logits_shape: tuple[int, ...] = ()

    def scope(self) -> str:
        return self.stack[-1] if self.stack else ""


def _shape(x: Any) -> tuple[int, ...] | None:
    import torch

    if isinstance(x, (tuple, list)) and x:
        x = x[0]
    return tuple(x.shape) if isinstance(x, torch.Tensor) else None


def _record_block(model: Any, parts: Any, input_ids: Any) -> _Recorder:
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

    hooks = [(parts.embed, "post", keep("embed"), False),
             (parts.final_norm, "post", keep("final_norm"), False),
             (parts.blocks[-1], "post", keep("last_block"), False)]
    if parts.family.pos_embed:
        hooks.append((model.get_submodule(parts.family.pos_embed), "post", keep("pos_embed"),
                      False))
    for module in block.modules():
        hooks += [(module, "pre", pre, False), (module, "post", post, False)]
    # an explicit all-ones mask keeps transformers from inspecting values (meta has none)
    mask = torch.ones(input_ids.shape, dtype=torch.long, device="meta")
    # the mode sees every tensor op of the forward; only those inside block 0 are recorded
    # (rec.stack is empty elsewhere), and a `with` block leaves it whatever happens
    with torch.no_grad(), hooked(hooks), Mode():
        out = model(input_ids, attention_mask=mask, use_cache=False, logits_to_keep=0)
    rec.logits_shape = tuple(out.logits.shape)
    return rec


def _block_steps(rec: _Recorder, cfg: dict, fam: Any) -> list[ShapeStep]:
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
        elif where == mlp_name and cfg["swiglu"]:
            if op in ("mul", "__mul__") and len(shape) == 3 and shape[-1] == cfg["d_mlp"]:
                add("block", "act(gate) · up", shape)
        elif where == "":
            if op in ("add", "__add__") and len(shape) == 3 and shape[-1] == d:
                label = "residual add (attention)" if "residual add (attention)" not in seen \
                    else "residual add (MLP)"
                add("resid_mid" if label.endswith("(attention)") else "resid_post", label, shape)
    return steps


def shape_report(name: str, prompt: str | None = None, seq_len: int | None = None,
                 batch: int = 1, dtype: str = "float32", warn: Any = None) -> ShapeReport:
    import torch
    from transformers import AutoModelForCausalLM

    from .models.registry import resolve
    from .models.sources import load_config

    t0 = time.perf_counter()
    if batch < 1:
        raise BadInput("--batch must be at least 1")
    if dtype not in BYTES or dtype in ("int8", "4-bit"):
        raise BadInput(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    if seq_len is not None and seq_len < 1:
        raise BadInput("--seq-len must be at least 1")
    spec = resolve(name)
    config = load_config(spec)
    tokens, tokenizer_name = _tokens(spec, config, prompt, seq_len)
    seq_len = len(tokens) if tokens else (seq_len or 8)
    ctx = getattr(config, "max_position_embeddings", None)
    notes = []
    if ctx and seq_len > ctx:
        msg = f"sequence length {seq_len} is beyond the context window of {spec.name} ({ctx})"
        notes.append(msg)
        if warn:
            warn(msg)
    with torch.device("meta"):  # eager attention materializes the scores, so their shape is seen
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.eval()
    parts = resolve_parts(model)
    fam = parts.family
    dm = dims(config, fam)
    d, h, kv, hd, V = dm.d_model, dm.n_heads, dm.n_kv_heads, dm.head_dim, dm.vocab_size
    L = len(parts.blocks)
    ids = torch.zeros((batch, seq_len), dtype=torch.long, device="meta")
    rec = _record_block(model, parts, ids)
    cfg = dict(B=batch, T=seq_len, d=d, h=h, kv=kv, hd=hd, d_mlp=dm.d_mlp,
               rope=fam.positions == "rope", swiglu=fam.mlp_type == "swiglu")
    steps = [ShapeStep("input_ids", "input_ids", (batch, seq_len))]
    top = rec.top
    if fam.pos_embed:
        steps.append(ShapeStep("embed", "token embedding", top["embed"]))
        steps.append(ShapeStep("embed", "+ position embedding", top["pos_embed"]))
    else:
        steps.append(ShapeStep("embed", "token embedding (no position embedding: RoPE "
                               "inside attention)" if cfg["rope"] else "token embedding",
                               top["embed"]))
    steps += _block_steps(rec, cfg, fam)
    steps.append(ShapeStep("resid_post", f"× {L} blocks: the stream after the last one",
                           top["last_block"]))
    steps.append(ShapeStep("final_norm", "final norm", top["final_norm"]))
    steps.append(ShapeStep("logits", "LM head → logits (all positions)", rec.logits_shape))
    steps.append(ShapeStep("logits", "logits, last position only", (batch, 1, V)))
    n_hidden = L + 1

    groups, total = _param_groups(model, parts, L)
    tied = _tied(model)
    cost = _costs(groups, total, L=L, d=d, h=h, kv=kv, hd=hd, V=V, T=seq_len, B=batch,
                  dtype=dtype, tied=tied)
    return ShapeReport(
        model=spec.name, family=fam.name, source=spec.known.source if spec.known else
        (spec.path or spec.hub_id or ""),
        n_layers=L, d_model=d, n_heads=h, n_kv_heads=kv, head_dim=hd, d_mlp=dm.d_mlp,
        vocab_size=V, context_length=ctx, norm_type=fam.norm_type, mlp_type=fam.mlp_type,
        positions=fam.positions, tied_embeddings=tied, batch=batch, seq_len=seq_len,
        tokens=tokens, tokenizer=tokenizer_name, steps=tuple(steps),
        hidden_states=(n_hidden, (batch, seq_len, d)),
        params=tuple(groups), n_params=total, cost=cost, dtype=dtype,
        differences=tuple(fam.differences(h, kv, config)), notes=tuple(notes),
        seconds=time.perf_counter() - t0)


def _tokens(spec: Any, config: Any, prompt: str | None, seq_len: int | None
            ) -> tuple[tuple[Token, ...], str | None]:
    """The prompt's tokens from the model's offline tokenizer (never weights), and the
    tokenizer's name; none without a prompt."""
    from .models.loading import tokenizer_for
    from .models.tokenizers import encode_prompt

    if prompt is None:
        return (), None
    tok = tokenizer_for(spec, config, lambda m: None)  # local files only, never weights
    if tok is None:
        if seq_len is None:
            raise BadInput(f"no tokenizer for {spec.name} is available offline; "
                           "give --seq-len instead of a prompt")
        return (), None
    ids = encode_prompt(tok, prompt)
    return tuple(Token(i, t, tok.token_text(t)) for i, t in enumerate(ids)), tok.name


def _tied(model: Any) -> bool:
    i, o = model.get_input_embeddings(), model.get_output_embeddings()
    return o is not None and i is not None and o.weight is i.weight


def _param_groups(model: Any, parts: Any, L: int) -> tuple[list[ParamGroup], int]:
    names = {m: n for n, m in model.named_modules()}
    embed = names[parts.embed]
    pos = parts.family.pos_embed
    final = names[parts.final_norm]
    head = names[parts.lm_head]
    blocks = names[parts.blocks[0]].rsplit(".", 1)[0]
    attn_rel = names[parts.attns[0]][len(names[parts.blocks[0]]) + 1:]
    mlp_rel = names[parts.mlps[0]][len(names[parts.blocks[0]]) + 1:]
    per_block: dict[str, int] = {}
    counts = {"token embedding": 0, "position embedding": 0, "final norm": 0, "LM head": 0,
              "other": 0}
    block_totals = [0] * L
    for pname, p in model.named_parameters():  # shared (tied) tensors are listed once
        n = p.numel()
        if pname.startswith(blocks + "."):
            idx_str, rel = pname[len(blocks) + 1:].split(".", 1)
            block_totals[int(idx_str)] += n
            if int(idx_str) != 0:
                continue
            owner = rel.rsplit(".", 1)[0]  # the module holding the parameter
            if rel.startswith(attn_rel + ".") and "norm" not in owner.rsplit(".", 1)[-1]:
                leaf = rel[len(attn_rel) + 1:]
                key = "attention: output projection W_O" if leaf.split(".")[0] in \
                    parts.family.w_o else "attention: Q, K, V projections"
            elif rel.startswith(mlp_rel + "."):
                key = "MLP matrices"
            elif "norm" in rel or rel.startswith("ln_"):
                key = "norms"
            else:
                key = "other (block)"
            per_block[key] = per_block.get(key, 0) + n
        elif pname.startswith(embed + "."):
            counts["token embedding"] += n
        elif pos and pname.startswith(pos + "."):
            counts["position embedding"] += n
        elif pname.startswith(final + "."):
            counts["final norm"] += n
        elif pname.startswith(head + "."):
            counts["LM head"] += n
        else:
            counts["other"] += n
    if len(set(block_totals)) != 1:
        raise BadInput("the blocks of this model differ in size; fptrace shapes cannot "
                       "summarize them as one block × N")
    groups = [ParamGroup("token embedding", counts["token embedding"], 1)]
    if counts["position embedding"]:
        groups.append(ParamGroup("position embedding", counts["position embedding"], 1))
    order = ["attention: Q, K, V projections", "attention: output projection W_O", "norms",
             "MLP matrices", "other (block)"]
    for key in order:
        if key in per_block:
            groups.append(ParamGroup(f"per block: {key}", per_block[key], L))
    groups.append(ParamGroup("final norm", counts["final norm"], 1))
    groups.append(ParamGroup("LM head", counts["LM head"], 1))
    if counts["other"]:
        groups.append(ParamGroup("other", counts["other"], 1))
    total = sum(g.count * g.times for g in groups)
    check = sum(p.numel() for p in model.parameters())
    assert total == check, (total, check)
    return groups, total


def _costs(groups: list[ParamGroup], total: int, *, L: int, d: int, h: int, kv: int, hd: int,
           V: int, T: int, B: int, dtype: str, tied: bool) -> CostReport:
    b = BYTES[dtype]
    weights = {k: int(math.ceil(total * v)) for k, v in BYTES.items()}
    kv_per_token = 2 * L * kv * hd * b  # K and V, every layer
    # parameters that multiply each token (matrices of blocks and the LM head, not the
    # embedding lookup, norms or biases counted separately)
    block_mats = sum(g.count * g.times for g in groups
                     if g.name.startswith("per block:") and "norms" not in g.name)
    head = V * d
    matmul_params = block_mats + head
    attn_prefill = 2 * 2 * L * B * T * T * h * hd  # Q·Kᵀ and weights·V over the full T×T
    prefill = 2 * B * T * matmul_params + attn_prefill
    decode = 2 * B * matmul_params + 2 * 2 * L * B * T * h * hd
    return CostReport(
        weights_bytes=weights, kv_cache_per_token_bytes=kv_per_token,
        kv_cache_bytes=kv_per_token * B * T, residual_per_layer_bytes=B * T * d * b,
        logits_all_numbers=B * T * V, logits_all_bytes=B * T * V * b,
        logits_last_numbers=B * V, logits_last_bytes=B * V * b,
        tied_saving_params=head if tied else 0,
        flops_prefill=prefill, flops_decode_step=decode, matmul_params=matmul_params)
