"""What every field of the attribute, diff and patch outputs means (merged into
schema_fields.FIELDS)."""

from __future__ import annotations

FIELDS = {
    "Attribution": {
        "prompt": "The prompt as given.",
        "model": "The model that was run.",
        "tokens": "The prompt's tokens.",
        "target": "The token whose logit is attributed (default: the model's top-1), with its "
                  "rank, probability and logit.",
        "versus": "With `--versus`: the token whose logit is subtracted; else null.",
        "model_logit": "The model's own logit of the target (minus versus), read from the LM "
                       "head's output: before any final softcap.",
        "capped_logit": "For families with a final-logit softcap: the logit after it; else "
                        "null.",
        "total": "The sum of every contribution.",
        "difference": "total − model_logit.",
        "tolerance": "The rule the difference must meet, in words.",
        "ok": "Whether it does; `fptrace attribute` exits with 5 when not.",
        "contributions": "Every part, in stream order: the embedding, then per block each "
                         "attention head (and the W_O bias), the MLP, then the final norm's and "
                         "the LM head's biases.",
        "top": "The `--top` contributions of largest absolute value.",
        "layers": "Per block: attention and MLP.",
        "head_grid": "Per block, each head's contribution (empty for a block whose heads could "
                     "not be split exactly).",
    },
    "Contribution": {
        "component": "`embed`, `attn_head`, `attn_bias`, `attn` (a block whose heads could not "
                     "be split), `mlp`, `final_norm_bias` or `lm_head_bias`.",
        "layer": "The block, or null.",
        "head": "The attention head, or null.",
        "value": "Logits this part contributes: the part through the final norm frozen at its "
                 "actual scale for this position, then the target's unembedding row.",
        "share": "value / the sum of |value| over every part.",
    },
    "LayerAttribution": {
        "layer": "The block.",
        "attn": "Every head of this block and its W_O bias, in logits.",
        "mlp": "This block's MLP, in logits.",
    },
    "PatchResult": {
        "prompt": "The clean prompt.",
        "model": "The model that was run.",
        "tokens": "The clean prompt's tokens (the grid's columns).",
        "corrupt_tokens": "The corrupted run's tokens (the same ids, with --noise).",
        "corruption": "`noise` (Gaussian noise on the subject's embeddings) or `prompt` "
                      "(`--corrupt`).",
        "subject": "`--noise`: the subject whose tokens were noised; else null.",
        "subject_positions": "The positions the noise was added at.",
        "noise_std": "The noise's standard deviation (`--noise-scale` × the embedding's); null "
                     "with `--corrupt`.",
        "noise_scale": "`--noise-scale`.",
        "seed": "The noise's seed (`--seed`).",
        "what": "What a cell restores: `resid` (the block's output stream), `attn` or `mlp` "
                "(what they added).",
        "window": "With attn/mlp: how many layers around the row's layer are restored.",
        "target": "The token whose probability is measured, as the clean run ranks it.",
        "p_clean": "Its probability in the clean run.",
        "p_corrupt": "Its probability in the corrupted run, nothing restored.",
        "grid": "Layers × positions: its probability with that state restored.",
        "best": "The cells of highest probability, best first.",
        "forward_passes": "Forward passes run: the clean one, the corrupted one and the "
                          "batches of patched runs.",
    },
    "PatchCell": {
        "layer": "The block (the centre of the window with attn/mlp).",
        "position": "The token position.",
        "prob": "The target's probability with this state restored.",
    },
    "TraceDiff": {
        "a": "The first run.",
        "b": "The second run.",
        "layers": "The embedding, then one row per block.",
        "tolerance": "The largest relative difference that counts as the same.",
        "tolerance_reason": "Where the tolerance comes from (`--tolerance`, or the default for "
                            "the coarser dtype).",
        "first_over": "`embed` or `block N`: the first row whose relative difference exceeds "
                      "the tolerance; null when none does.",
        "comparable": "Every row has a relative difference (both traces hold the whole stream "
                      "and have the same width and number of blocks).",
        "within": "Comparable and within the tolerance at every row: `fptrace diff` exits 0, "
                  "else 1.",
        "top_k": "The tokens of both top-k lists, with ranks and probabilities in each.",
    },
    "DiffSide": {
        "label": "`a`, `b`, or the file the trace came from.",
        "prompt": "The prompt.",
        "model": "The model's name.",
        "dtype": "Its dtype.",
        "device": "Its device.",
        "random_weights": "Whether its weights were random.",
        "tokens": "The (id, text) of each token.",
    },
    "LayerDiff": {
        "layer": "The block, or null for the embedding.",
        "norm_a": "‖stream‖ at the last position in a.",
        "norm_b": "The same in b.",
        "rel_diff": "‖a − b‖ / ‖a‖ of the last position's stream; null when the traces do not "
                    "hold the whole stream or differ in width.",
        "cos": "The cosine between the two streams; null as above.",
        "lens_a": "The logit-lens top-1 token of a.",
        "lens_b": "The same of b.",
        "lens_same": "Whether they are the same token.",
    },
    "TokenDiff": {
        "id": "Token id.",
        "text": "The token's text.",
        "rank_a": "Its rank in a's top-k, or null when it is not in it.",
        "rank_b": "The same in b.",
        "prob_a": "Its probability in a, or null.",
        "prob_b": "The same in b.",
    },
}
