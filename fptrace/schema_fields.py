"""What every field of the JSON output means: the text of the JSON Schema's descriptions and of
docs/schema.md. A test fails when a result type has a field that is not described here."""

from __future__ import annotations

TYPES = {
    "Trace": "`fptrace run --json`: one prompt traced through the model.",
    "ShapeReport": "`fptrace shapes --json`: shapes, parameters, memory and FLOPs of a config, "
                   "computed on the meta device without weights.",
    "Explanation": "`fptrace explain --json`: one block recomputed step by step, checked "
                   "against the model, then the end of the pass and the sampling choices.",
    "ModelList": "`fptrace models --json`: the built-in models.",
    "Generation": "`fptrace generate --json`: generation as a sequence of forward passes, "
                  "with the KV cache after each.",
    "GenStep": "One forward pass of generation: the prefill (index 0) or one decode step.",
    "BatchTrace": "A line of `fptrace batch` output for a prompt that was traced: every field "
                  "of a trace plus `id`, `source` and `extra`.",
    "BatchError": "A line of `fptrace batch` output for a prompt that could not be traced.",
    "ModelInfo": "The loaded model.",
    "Token": "One token of the prompt.",
    "ShapeStep": "The shape of the stream at one step of the forward pass.",
    "TopToken": "A candidate next token.",
    "LayerStats": "The residual stream after the embedding (layer null) or after one block, "
                  "at the last position unless noted.",
    "FinalNormStats": "The output of the final norm at the last position.",
    "PositionStats": "The model's prediction at one position (`--all-positions`).",
    "Decomposition": "The check, run on every trace, that what attention and the MLP added "
                     "equals what the block added (attn + mlp = Δ at the last position). "
                     "Where a block fails it, its `attn_norm_last` and `mlp_norm_last` are "
                     "null rather than wrong.",
    "ParamGroup": "Parameters of one part of the model.",
    "GpuPlan": "`shapes --gpu-memory`: how many GPUs of that memory the weights and the KV "
               "cache need, and the smallest valid tensor-parallel size.",
    "CostReport": "Memory and compute figures at the report's batch and sequence length.",
    "ExplainStep": "One step of the walkthrough.",
    "AttentionMatrix": "One head's (T, T) matrix; rows are query positions, columns key "
                       "positions.",
    "Check": "A fact the walkthrough checks about its own numbers.",
    "EmbeddingRow": "The embedding lookup of one token.",
    "Sampling": "The next-token choice under four strategies, side by side.",
    "SamplingRow": "One candidate token in the sampling table.",
    "ModelEntry": "One built-in model.",
    "LensCell": "The logit lens at one layer and position: top-1 of final norm + LM head.",
    "Attribution": "`fptrace attribute --json`: direct logit attribution of the target's logit "
                   "(or of target − versus) at the last position, summing to the model's own "
                   "logit.",
    "Contribution": "One part of the last position's stream, in logits of the target.",
    "LayerAttribution": "What one block's attention (all heads and the W_O bias) and MLP "
                        "contributed, in logits.",
    "TraceDiff": "`fptrace diff --json`: two traces compared layer by layer.",
    "PatchResult": "`fptrace patch --json`: causal tracing, the target's probability with one "
                   "state restored from the clean run, for every layer and position.",
    "PatchCell": "One cell of the causal-tracing grid.",
    "DiffSide": "One of the two runs compared.",
    "LayerDiff": "One layer of both runs: the last position's stream compared.",
    "TokenDiff": "A token in the top-k of either run, with its rank and probability in both.",
}

COMMON = {
    "kind": "Which output this is: trace, shapes, explain, generation, attribution, diff, "
            "patch, models or error.",
    "schema_version": "Version of this contract: the minor number grows when fields or kinds "
                      "are added, the major number when a field changes or goes.",
    "nonfinite": "Paths (e.g. `layers[3].resid_norm_last`) of the floats that were NaN or "
                 "infinite and are written as null.",
    "notes": "Sentences a reader should see with the numbers (random weights, truncation, ...).",
}

FIELDS = {
    "Trace": {
        "prompt": "The prompt as given (or decoded from the token ids given).",
        "model": "The model that was run.",
        "tokens": "The token ids that were run, in order.",
        "shapes": "Shape of the stream at each step, from input ids to logits.",
        "layers": "Per-layer statistics: the embedding, then one entry per block.",
        "final_norm": "The final norm's output at the last position.",
        "top_k": "The most probable next tokens, from the model's logits at the last "
                 "position.",
        "all_positions": "Whether the LM head was applied at every position "
                         "(`--all-positions`).",
        "truncated": "Tokens dropped from the start by `--truncate` (0 if none).",
        "first_nonfinite": "Where NaN or Inf first appeared (`embed`, `block N` or "
                           "`final_norm`), or null.",
        "lens_grid": "Logit lens at every position (with `--plot` and in the report): one row "
                     "per layer (embedding first), one cell per position of `lens_positions`; "
                     "empty otherwise.",
        "lens_positions": "The positions of the grid's columns (the last 64 at most).",
        "positions": "With `--all-positions`: the prediction at every position (empty "
                     "otherwise).",
        "mean_loss": "With `--all-positions`: the mean cross-entropy (nats) of the predictions "
                     "that have a next token: the loss training averages; else null.",
        "perplexity": "exp(mean_loss), or null.",
        "token_note": "Whether position 0 is a begin-of-text token the tokenizer added, or "
                      "null when the tokenizer has none.",
        "decomposition": "Whether the attention/MLP split of every block adds up to what the "
                         "block added (see Decomposition); the split figures of a block that "
                         "fails are null.",
    },
    "Decomposition": {
        "holds": "True when every block passes: all `attn_norm_last`/`mlp_norm_last` are "
                 "shown.",
        "max_mismatch": "The largest ‖Δ − (attn + mlp)‖ / ‖Δ‖ over the blocks (null when no "
                        "block could be measured).",
        "worst_block": "The block with that largest mismatch, or null.",
        "withheld": "Blocks whose attention and MLP figures are withheld (null).",
        "tolerance": "The rule each block must meet, in words.",
    },
    "BatchTrace": {
        "id": "The prompt's id: the `id` of its .jsonl line, else `<file stem>:<line>`.",
        "source": "Where the prompt came from, as `file:line`.",
        "extra": "The other fields of the prompt's .jsonl object, unchanged.",
    },
    "BatchError": {
        "id": "The prompt's id, as for a traced prompt.",
        "source": "Where the prompt came from, as `file:line`.",
        "extra": "The other fields of the prompt's .jsonl object (empty if it did not parse).",
        "prompt": "The prompt text, or null when the line could not be read.",
        "error": "What went wrong, in one line, naming the file and line for input errors.",
        "error_type": "The error's class (BadInput, TraceFailed, ...).",
    },
    "ModelInfo": {
        "name": "The `--model` alias or the path or hub id given.",
        "family": "The architecture family (gpt2, llama, qwen2, phi3, gpt_neox, or "
                  "generic:<model_type>).",
        "source": "Where the weights came from (a file, folder, hub id, or random weights).",
        "n_layers": "Number of blocks.",
        "d_model": "Width of the residual stream.",
        "n_heads": "Query heads per attention layer.",
        "n_kv_heads": "Key/value heads (fewer than n_heads with grouped-query attention).",
        "head_dim": "Values per head.",
        "d_mlp": "Width of the MLP's hidden layer, or null if unknown.",
        "vocab_size": "Rows of the token embedding.",
        "context_length": "Longest sequence the positions allow, or null if unknown.",
        "n_params": "Parameters, counting tied tensors once.",
        "tied_embeddings": "Whether the LM head is the token embedding matrix.",
        "norm_type": "layernorm or rmsnorm.",
        "mlp_type": "gelu or swiglu.",
        "positions": "learned (absolute embeddings) or rope.",
        "parallel_residual": "Whether attention and the MLP both read the block's input "
                             "(GPT-NeoX).",
        "device": "Where the model ran (cpu, cuda:0, ...).",
        "dtype": "Precision of the weights and activations.",
        "random_weights": "True when the weights are seeded random, not trained: predictions "
                          "then mean nothing.",
        "placement": "With `--device-map`: where each range of blocks and the other parts "
                     "live (`blocks 0–13: cuda:0`, `lm_head: disk`, ...); empty otherwise.",
        "tensor_parallel": "How many processes the weights are sharded over (`--tp N` or "
                           "torchrun); 1 in one process.",
        "inferred": "For a model type no family module covers: each architecture fact "
                    "fptrace inferred, and from what (empty for registered families).",
        "unknown": "For such a model: the facts fptrace could not establish, and what it does "
                   "about each (empty for registered families).",
    },
    "Token": {
        "position": "Position in the sequence, from 0.",
        "id": "Token id.",
        "text": "The token's text (a byte fragment shows as its escaped bytes).",
    },
    "ShapeStep": {
        "point": "A trace point: input_ids, embed, resid_pre, attn_out, resid_mid, mlp_out, "
                 "resid_post, final_norm or logits (shapes also uses names of steps inside "
                 "block 0).",
        "label": "What the step is called in the tables.",
        "shape": "The tensor's shape.",
    },
    "TopToken": {
        "rank": "1 for the most probable (in `sampling.picks`: the strategy's index + 1).",
        "id": "Token id.",
        "text": "The token's text.",
        "prob": "Probability (softmax of the logits in float32).",
        "logit": "The raw logit.",
    },
    "LayerStats": {
        "layer": "Block index, or null for the embedding. The embedding row is transformers' "
                 "`hidden_states[0]`; the row of block k is the stream after block k, "
                 "`hidden_states[k + 1]` (except the last block's: transformers' last entry has "
                 "the final norm applied, see `final_norm`).",
        "point": "embed or resid_post.",
        "resid_norm_last": "L2 norm of the residual stream at the last position.",
        "resid_norm_mean": "Mean over the prompt's positions of the stream's L2 norm.",
        "added_norm_last": "L2 norm of what the block added (resid_post − resid_pre); null for "
                           "the embedding.",
        "attn_norm_last": "L2 norm of what attention added to the stream (for families that "
                          "normalise the attention output before the add, the post-norm "
                          "output); null for the embedding, and null where the decomposition "
                          "check fails for this block.",
        "mlp_norm_last": "L2 norm of what the MLP added to the stream (post-norm where the "
                         "family has one); null for the embedding, and where the decomposition "
                         "check fails.",
        "cos_prev": "Cosine between this stream and the previous one; null for the embedding.",
        "snippet": "The first values of the stream at the last position (`--snippet`).",
        "lens_id": "Logit lens: top-1 token id of final norm + LM head applied to this stream.",
        "lens_text": "The logit-lens token's text.",
        "lens_prob": "The logit-lens token's probability.",
        "finite": "False if the stream holds NaN or Inf anywhere.",
        "lens_rank": "Rank of the final top-1 token in this row's logit-lens distribution (1: "
                     "the lens already predicts it); null without the lens.",
        "lens_entropy": "Entropy of this row's logit-lens distribution, in nats.",
        "resid_norm_max": "The largest ‖stream‖ over the prompt's positions.",
        "resid_norm_max_position": "The position where it is (a position far above the others is "
                                   "an attention sink, usually position 0).",
        "lens_kl": "KL divergence from the final distribution to this row's lens distribution, "
                   "KL(final ‖ lens), in nats (0 at the last row).",
    },
    "PositionStats": {
        "position": "The position.",
        "token": "The token at this position.",
        "actual": "The token at the next position (what training scores against), or null at "
                  "the last position.",
        "actual_prob": "Its probability under this position's prediction.",
        "actual_rank": "Its rank (1: the model's top-1).",
        "loss": "The cross-entropy −log p(actual), in nats.",
        "predicted": "The model's top-1 at this position.",
    },
    "FinalNormStats": {
        "norm_last": "L2 norm of the final norm's output at the last position.",
        "snippet": "Its first values.",
    },
    "ShapeReport": {
        "model": "The `--model` alias, path or hub id.",
        "family": "The architecture family.",
        "source": "Where the config came from.",
        "n_layers": "Number of blocks.",
        "d_model": "Width of the residual stream.",
        "n_heads": "Query heads.",
        "n_kv_heads": "Key/value heads.",
        "head_dim": "Values per head.",
        "d_mlp": "Width of the MLP's hidden layer, or null when the config does not say.",
        "vocab_size": "Rows of the token embedding.",
        "context_length": "Longest sequence the positions allow, or null.",
        "norm_type": "layernorm or rmsnorm.",
        "mlp_type": "gelu or swiglu.",
        "positions": "learned or rope.",
        "tied_embeddings": "Whether the LM head is the token embedding matrix.",
        "batch": "Batch size the shapes and costs are for (`--batch`).",
        "seq_len": "Sequence length the shapes and costs are for.",
        "tokens": "The prompt's tokens, when a prompt was given.",
        "tokenizer": "The offline tokenizer used, or null.",
        "steps": "Every step of the forward pass with its shape, inside block 0 in detail.",
        "hidden_states": "[count, shape] of the `output_hidden_states` tuple.",
        "params": "Parameters per part; `count` × `times` summed over parts is `n_params`.",
        "n_params": "All parameters, counting tied tensors once.",
        "cost": "Memory and FLOP figures.",
        "dtype": "Precision the activation figures are for (`--dtype`).",
        "differences": "How this family differs from GPT-2.",
        "seconds": "Time the report took.",
        "plan": "With `--gpu-memory`: the GPU plan; else null.",
    },
    "GpuPlan": {
        "gpu_memory_bytes": "Memory of one GPU (`--gpu-memory`).",
        "weights_bytes": "The weights in the report's dtype.",
        "kv_cache_bytes": "The KV cache at the report's batch and sequence length.",
        "needed_bytes": "weights + KV cache (activations and framework overhead not counted).",
        "gpus_needed": "ceil(needed / GPU memory).",
        "tp": "The smallest tensor-parallel size of at least gpus_needed that divides both the "
              "attention and the key/value head counts; null when none does.",
        "tp_note": "The plan in words.",
    },
    "ParamGroup": {
        "name": "The parameter: `block: <path inside a block> (<what it is>)` for block 0's "
                "(× the number of blocks), else the part and `weight` or `bias`.",
        "count": "Parameters in one instance.",
        "times": "Instances (blocks) of it.",
        "shape": "The tensor's shape (nn.Linear stores (out, in); GPT-2's Conv1D (in, out)).",
        "part": "`embedding`, `block`, `final` (the final norm), `head` (the LM head) or "
                "`other`.",
    },
    "CostReport": {
        "weights_bytes": "Bytes of all weights per precision (float32, bfloat16, float16, int8, "
                         "4-bit).",
        "kv_cache_per_token_bytes": "KV-cache bytes per token, all layers.",
        "kv_cache_bytes": "KV-cache bytes at the report's batch and sequence length.",
        "residual_per_layer_bytes": "Bytes of one (B, T, d) residual stream.",
        "logits_all_numbers": "Numbers in the logits for every position.",
        "logits_all_bytes": "Their bytes.",
        "logits_last_numbers": "Numbers in the logits for the last position only.",
        "logits_last_bytes": "Their bytes.",
        "tied_saving_params": "Parameters saved by tying the LM head (0 if untied).",
        "flops_prefill": "FLOPs of one forward pass over the whole sequence (2 per "
                         "multiply-add, attention included).",
        "flops_decode_step": "FLOPs of one decoding step with a KV cache at that length.",
        "matmul_params": "Parameters that take part in matrix multiplies.",
    },
    "Explanation": {
        "prompt": "The prompt as given.",
        "model": "The model that was run.",
        "tokens": "The prompt's tokens.",
        "layer": "The block recomputed (negative `--layer` values resolved).",
        "head": "The query head whose values and matrices are shown.",
        "kv_head": "The key/value head that query head reads.",
        "steps": "Every step: the block's (sections attention and mlp), then the end of the "
                 "pass (section end).",
        "matrices": "The chosen head's masked scores and weights (prompts of at most 12 "
                    "tokens; empty otherwise).",
        "checks": "Every comparison with the model and property of the weights.",
        "sampling": "The next token under greedy, temperature, top-k and top-p.",
        "match": "True when every check passed: the walkthrough reproduces the model.",
        "embedding": "The embedding lookup, token by token: the first values of each part.",
        "head_weights": "Every head's attention weights at this layer (with `--plot` and in "
                        "the report); empty otherwise.",
    },
    "ExplainStep": {
        "index": "Step number, from 1.",
        "section": "attention, mlp or end.",
        "name": "The step, named after the checkpoint's module where there is one.",
        "formula": "How the tensor is computed, in one line.",
        "shape": "The tensor's shape.",
        "where": "Which values `preview` holds (e.g. `head 2, pos 4`).",
        "preview": "A few of the tensor's values.",
        "note": "A remark on the step, or null.",
    },
    "AttentionMatrix": {
        "name": "`scores + mask` (−∞ above the diagonal, written as null) or `weights`.",
        "head": "The query head.",
        "labels": "The token text of each position.",
        "rows": "The matrix, row by row.",
    },
    "EmbeddingRow": {
        "position": "The token's position.",
        "id": "Its id: the row of the embedding matrix it selects.",
        "text": "Its text.",
        "token_row": "The first values of that row.",
        "position_row": "GPT-2: the first values of row `position` of the position matrix; "
                        "null for families without one.",
        "scale": "Gemma: the √d the embedding is multiplied by; else null.",
        "stream": "The first values of the sum: what enters block 0.",
    },
    "Check": {
        "name": "What is checked.",
        "value": "What was measured (a max |Δ|, a count, ...).",
        "tolerance": "The rule the value must meet.",
        "ok": "Whether it does.",
        "target": "Which check: `embedding`, `softmax_rows`, `causal_zeros`, `attn_out`, `mlp_out`, `block` "
                "(the recomputed block output) or `logits`.",
        "unit": "`abs`: the value is a max absolute difference; `count`: it counts elements.",
    },
    "Sampling": {
        "temperature": "`--temperature` (0 is greedy).",
        "top_k": "`--top-k`.",
        "top_p": "`--top-p`.",
        "seed": "`--seed` of the draws.",
        "strategies": "The strategies, in the order of `kept`, `picks` and each row's `probs`.",
        "kept": "Tokens with non-zero probability under each strategy.",
        "picks": "The token each strategy chose.",
        "rows": "The most probable tokens, and any picked token beyond them.",
    },
    "SamplingRow": {
        "id": "Token id.",
        "text": "The token's text.",
        "logit": "The model's logit.",
        "probs": "Its probability under each strategy.",
    },
    "ModelList": {
        "models": "One entry per built-in alias.",
    },
    "Generation": {
        "prompt": "The prompt as given.",
        "model": "The model that was run.",
        "tokens": "The prompt's tokens.",
        "strategy": "How tokens were chosen: `greedy`, or the sampling settings in words.",
        "temperature": "`--temperature` (0 is greedy).",
        "top_k": "`--top-k`, or null when off.",
        "top_p": "`--top-p` (1 is off).",
        "seed": "`--seed` of the draws (step i draws with seed × 1000003 + i).",
        "max_new_tokens": "`-n`.",
        "steps": "One entry per forward pass, the prefill first.",
        "generated": "The new tokens, with positions continuing the prompt's.",
        "text": "The new tokens decoded.",
        "stop_reason": "`eos` (an end-of-sequence token was chosen) or `max_new_tokens`.",
        "prefill_seconds": "Time of the prefill step.",
        "decode_seconds": "Time of all decode steps.",
        "decode_tokens_per_s": "Decode steps per second, or null with no decode step.",
    },
    "GenStep": {
        "index": "0 for the prefill, then 1, 2, ...",
        "phase": "`prefill` or `decode`.",
        "input_shape": "Shape of the step's input ids: (1, T) for the prefill, then (1, 1).",
        "stream_shape": "Shape of the residual stream inside the blocks during the step.",
        "positions": "The positions this step computed.",
        "kv_shape": "Shape of one layer's cached keys (and values) after the step: (batch, "
                    "key/value heads, positions, head_dim).",
        "kv_layers": "Layers holding cached keys and values.",
        "kv_bytes": "Bytes of every cached key and value after the step.",
        "kv_layout": "Every layer's cached key shape, as ranges of layers with the same shape "
                     "(`layers 0–29: (1, 3, 6, 64)`); values have the same shapes.",
        "token": "The chosen token; its `prob` and `rank` are under the model's own "
                 "distribution (temperature 1).",
        "sample_prob": "The chosen token's probability under the sampling distribution.",
        "alternatives": "The model's most probable tokens at this step (`--alternatives`).",
        "seconds": "Wall time of the step: forward pass and choice.",
        "layers": "Per-layer statistics at the step's last position (`--layers`), else empty; "
                  "`resid_norm_mean` is over the positions this step computed.",
        "final_norm": "The final norm's output at the last position (`--layers`), else null.",
        "first_nonfinite": "Where NaN or Inf first appeared in this step, or null.",
        "decomposition": "With `--layers`: the attn + mlp = Δ check of this step (see "
                         "Decomposition); null without `--layers`.",
    },
    "LensCell": {
        "id": "Token id.",
        "text": "The token's text.",
        "prob": "Its probability.",
    },
    "ModelEntry": {
        "alias": "The `--model` name.",
        "family": "The architecture family.",
        "n_layers": "Number of blocks.",
        "d_model": "Width of the residual stream.",
        "n_heads": "Query heads.",
        "n_kv_heads": "Key/value heads.",
        "vocab_size": "Vocabulary size.",
        "context_length": "Longest sequence, or null.",
        "tokenizer": "The offline tokenizer available, or null.",
        "weights": "Where weights are available on this machine.",
        "hub_id": "The Hugging Face repository of the config.",
        "description": "What the model is.",
        "source": "Where the stored config comes from.",
    },
}


# the fields of attribute, diff and patch (schema_fields_analysis.py), in the same tables
from .schema_fields_analysis import FIELDS as _ANALYSIS  # noqa: E402

FIELDS.update(_ANALYSIS)
