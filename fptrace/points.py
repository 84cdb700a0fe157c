"""One vocabulary of trace points: the names of the tensors of a forward pass, shared by explain's
steps, `diff --deep`, the JSON and the tables.

The stream points are the residual stream between blocks and the end of the pass (the names
TransformerLens made familiar); the block points are, inside one block, what each operation
makes, in the order the data flows. `attn_out` and `mlp_out` are the sublayers' outputs (after
W_O and W_down); where a family normalises them before the residual add (Gemma 2/3, OLMo 2) the
post-norms `ln1_post` and `ln2_post` are what the stream receives.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum


class Point(str, Enum):
    """A named tensor of the forward pass (its value is the name written in the JSON)."""

    embed = "embed"
    resid_pre = "resid_pre"
    ln1 = "ln1"
    q = "q"
    k = "k"
    v = "v"
    attn_weights = "attn_weights"
    z = "z"
    attn_out = "attn_out"
    ln1_post = "ln1_post"
    resid_mid = "resid_mid"
    ln2 = "ln2"
    mlp_gate = "mlp_gate"
    mlp_up = "mlp_up"
    mlp_act = "mlp_act"
    mlp_out = "mlp_out"
    ln2_post = "ln2_post"
    resid_post = "resid_post"
    final_norm = "final_norm"
    logits = "logits"

    @property
    def title(self) -> str:
        """What a reader calls it in a sentence ("k after RoPE")."""
        return TITLES[self]

    def title_in(self, rope: bool) -> str:
        """The title in a family with rotary positions or without them: q and k are "after
        RoPE" only where the family rotates them (GPT-2's positions are added to the
        embedding, and its q and k are the projections' own)."""
        return self.value if not rope and self in (Point.q, Point.k) else TITLES[self]

    def __str__(self) -> str:
        return self.value


TITLES = {
    Point.embed: "the embedding",
    Point.resid_pre: "the block's input",
    Point.ln1: "the norm before attention",
    Point.q: "q after RoPE",
    Point.k: "k after RoPE",
    Point.v: "v",
    Point.attn_weights: "the attention weights",
    Point.z: "z (the heads before W_O)",
    Point.attn_out: "the attention output (after W_O)",
    Point.ln1_post: "the norm after attention",
    Point.resid_mid: "the stream between attention and the MLP",
    Point.ln2: "the norm before the MLP",
    Point.mlp_gate: "the MLP gate",
    Point.mlp_up: "the MLP up projection",
    Point.mlp_act: "the MLP activation",
    Point.mlp_out: "the MLP output (after W_down)",
    Point.ln2_post: "the norm after the MLP",
    Point.resid_post: "the block's output",
    Point.final_norm: "the final norm",
    Point.logits: "the logits",
}

DESCRIPTIONS = {
    Point.embed: "the stream entering block 0 (token embedding, plus positions or a scale)",
    Point.resid_pre: "the stream entering a block",
    Point.ln1: "the norm before attention (input_layernorm, ln_1)",
    Point.q: "the query heads (B, nh, T, hd), after their norm and RoPE where the family has them",
    Point.k: "the key heads (B, nkv, T, hd), likewise, before grouped-query repetition",
    Point.v: "the value heads (B, nkv, T, hd)",
    Point.attn_weights: "softmax of the scores (B, nh, T, T), after mask and softcap",
    Point.z: "the heads side by side before the output projection: W_O's input",
    Point.attn_out: "the attention output: W_O's output",
    Point.ln1_post: "the norm after attention, what the stream receives (Gemma 2/3, OLMo 2)",
    Point.resid_mid: "the stream after attention's add, which the MLP side reads",
    Point.ln2: "the norm before the MLP",
    Point.mlp_gate: "the MLP's gate projection (gated MLPs)",
    Point.mlp_up: "the MLP's up projection",
    Point.mlp_act: "the activation: W_down's input (act(gate) · up where the MLP is gated)",
    Point.mlp_out: "the MLP output: W_down's output",
    Point.ln2_post: "the norm after the MLP, what the stream receives (Gemma 2/3, OLMo 2)",
    Point.resid_post: "the stream leaving a block",
    Point.final_norm: "the final norm's output",
    Point.logits: "the LM head's output",
}

# the points of one block, in the order the data flows
BLOCK = (Point.resid_pre, Point.ln1, Point.q, Point.k, Point.v, Point.attn_weights, Point.z,
         Point.attn_out, Point.ln1_post, Point.resid_mid, Point.ln2, Point.mlp_gate,
         Point.mlp_up, Point.mlp_act, Point.mlp_out, Point.ln2_post, Point.resid_post)

# what each block point is computed from (resid_pre: the previous block, or the embedding)
INPUTS: dict[Point, tuple[Point, ...]] = {
    Point.resid_pre: (),
    Point.ln1: (Point.resid_pre,),
    Point.q: (Point.ln1,),
    Point.k: (Point.ln1,),
    Point.v: (Point.ln1,),
    Point.attn_weights: (Point.q, Point.k),
    Point.z: (Point.attn_weights, Point.v),
    Point.attn_out: (Point.z,),
    Point.ln1_post: (Point.attn_out,),
    Point.resid_mid: (Point.resid_pre, Point.ln1_post),
    Point.ln2: (Point.resid_mid,),
    Point.mlp_gate: (Point.ln2,),
    Point.mlp_up: (Point.ln2,),
    Point.mlp_act: (Point.mlp_gate, Point.mlp_up),
    Point.mlp_out: (Point.mlp_act,),
    Point.ln2_post: (Point.mlp_out,),
    Point.resid_post: (Point.resid_mid, Point.ln2_post),
}
# a parallel residual (GPT-NeoX): both sublayers read the block's input
PARALLEL = {Point.ln2: (Point.resid_pre,),
            Point.resid_post: (Point.resid_pre, Point.ln1_post, Point.ln2_post)}
# an input that is simply not there when a family lacks it (an MLP without a gate); any other
# absent point stands for its own inputs (no norm before attention: q reads the stream)
OPTIONAL = (Point.mlp_gate,)


def inputs(point: Point, present: Collection[Point], parallel: bool = False
           ) -> tuple[Point, ...]:
    """The points `point` is computed from, among those present: a point the family does not
    have (OLMo 2 has no ln1, GPT-2 no mlp_gate) stands for its own inputs."""
    graph = {**INPUTS, **PARALLEL} if parallel else INPUTS
    out: list[Point] = []
    todo = list(graph[point])
    while todo:
        p = todo.pop(0)
        if p not in present:
            todo += () if p in OPTIONAL else graph[p]
        elif p not in out:
            out.append(p)
    return tuple(out)


__all__ = ["BLOCK", "DESCRIPTIONS", "INPUTS", "TITLES", "Point", "inputs"]
