"""`fptrace diff`: do two runs compute the same? Two traces side by side, layer by layer.

The two traces come from two prompts on one model, from one prompt under two settings (another
model, dtype, device or random weights), or from two files saved by `run --json` (or `batch`
records). Each layer's row compares the last position's residual streams: both norms, the
relative difference ‖a − b‖ / ‖a‖ and the cosine (only when both traces hold the whole stream
and have the same width; a file saved without `--snippet D` holds only its first values, so the
difference is withheld, not guessed), and both logit-lens top-1 tokens.
"""

from __future__ import annotations

import json
import math

from fptrace.commands.diff import notes as notes_
from fptrace.commands.diff.result import DiffSide, LayerDiff, TokenDiff, TraceDiff
from fptrace.commands.diff.routing import routing_diff
from fptrace.errors import BadInput, param
from fptrace.jsontext import loads
from fptrace.results import Trace

# The default tolerance on the relative difference of the last position's stream, by the
# coarser of the two precisions. float16 keeps 11 significant bits, bfloat16 8; over the blocks
# of a model the rounding adds up. Measured on the bundled model (30 blocks, "The capital of
# France is"): the largest ‖a − b‖ / ‖a‖ against float32 is 2.8e-3 in float16 and 2.3e-2 in
# bfloat16, so these defaults leave a margin of about 3× and 2×.
TOLERANCE = {"float64": 1e-6, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


def default_tolerance(dtype_a: str, dtype_b: str) -> tuple[float, str]:
    worst = max((dtype_a, dtype_b), key=lambda d: TOLERANCE.get(d, TOLERANCE["bfloat16"]))
    tol = TOLERANCE.get(worst, TOLERANCE["bfloat16"])
    return tol, f"{tol:g}, the default for {worst}" + (
        f" (the coarser of {dtype_a} and {dtype_b})" if dtype_a != dtype_b else "")


def read_trace(path: str) -> dict:
    """A trace saved by `fptrace run --json` (or one `batch` record), as a dict."""
    from fptrace.userfiles import read_text

    try:
        text = read_text(path, "utf-8-sig")
    except OSError as e:
        raise BadInput(f"{path}: {e.strerror}") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    try:
        data = loads(text) if len(lines) != 1 else loads(lines[0])
    except json.JSONDecodeError as e:
        if len(lines) > 1:
            raise BadInput(f"{path} holds {len(lines)} JSON lines; diff takes a file with one "
                           "trace (e.g. `head -n 1 traces.jsonl > a.json`)") from None
        raise BadInput(f"{path} is not JSON ({e.msg}, line {e.lineno}); diff takes traces "
                       f"saved by `fptrace run {param('json')}`") from None
    if not isinstance(data, dict) or data.get("kind") != "trace" or "layers" not in data:
        kind = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise BadInput(f"{path} is not an fptrace trace (kind {kind!r}); save one with "
                       f"`fptrace run PROMPT {param('json')} > FILE`")
    return data


def _side(label: str, t: dict) -> DiffSide:
    m = t["model"]
    return DiffSide(label=label, prompt=t["prompt"], model=m["name"], dtype=m["dtype"],
                    device=m["device"], random_weights=m["random_weights"],
                    quantization=m.get("quantization"),
                    tokens=tuple((tok["id"], tok["text"]) for tok in t["tokens"]),
                    quantized_weights=m.get("quantized_weights"))


def _stream(row: dict, d: int) -> list[float] | None:
    values = row.get("snippet") or []
    return values if len(values) == d and all(v is not None for v in values) else None


def _short(row: dict, d: int) -> bool:
    """The row holds only the first values of its stream (NaN and Inf are JSON nulls: not
    short)."""
    return len(row.get("snippet") or []) != d


def _compare(a: list[float] | None, b: list[float] | None) -> tuple[float | None, float | None]:
    if a is None or b is None or len(a) != len(b):
        return None, None
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    rel = diff / na if na > 0 else (0.0 if diff == 0 else math.inf)
    cos = sum(x * y for x, y in zip(a, b)) / (na * nb) if na > 0 and nb > 0 else \
        (1.0 if na == nb else 0.0)
    return rel, cos


def diff(a: Trace | dict, b: Trace | dict, *, labels: tuple[str, str] = ("a", "b"),
         tolerance: float | None = None, same_input: bool = False) -> TraceDiff:
    """Compare two traces, Trace objects or `run --json` dicts, layer by layer (see
    diff_traces)."""
    from fptrace.render.json import to_dict

    return diff_traces(*(t if isinstance(t, dict) else to_dict(t) for t in (a, b)),
                       labels=labels, tolerance=tolerance, same_input=same_input)


def diff_traces(a: dict, b: dict, *, labels: tuple[str, str] = ("a", "b"),
                tolerance: float | None = None, same_input: bool = False) -> TraceDiff:
    """Compare two traces (as `run --json` dicts). same_input: both ran the same prompt, so
    their tokenizations must agree (else BadInput, with both shown)."""
    side_a, side_b = _side(labels[0], a), _side(labels[1], b)
    notes: list[str] = []
    if same_input and [i for i, _ in side_a.tokens] != [i for i, _ in side_b.tokens]:
        raise BadInput("the two runs tokenize the prompt differently: "
                       f"{labels[0]} {[t for _, t in side_a.tokens]} vs "
                       f"{labels[1]} {[t for _, t in side_b.tokens]}; their streams cannot be "
                       "compared position for position")
    ma, mb = a["model"], b["model"]
    if (ma["name"], ma["source"]) != (mb["name"], mb["source"]):
        notes.append(notes_.DIFF_MODELS(a=ma["name"], source_a=ma["source"], b=mb["name"],
                                        source_b=mb["source"]))
    if side_a.random_weights or side_b.random_weights:
        notes.append(notes_.DIFF_RANDOM(which=" and ".join(
            s.label for s in (side_a, side_b) if s.random_weights)))
    da, db = a["model"]["d_model"], b["model"]["d_model"]
    la, lb = a["layers"], b["layers"]
    if len(la) != len(lb):
        notes.append(notes_.DIFF_BLOCKS(a=labels[0], la=len(la) - 1, b=labels[1],
                                        lb=len(lb) - 1))
    if da != db:
        notes.append(notes_.DIFF_WIDTHS(da=da, db=db))
    rows = []
    withheld = False
    for ra, rb in zip(la, lb):
        rel, cos = _compare(_stream(ra, da), _stream(rb, db)) if da == db else (None, None)
        withheld |= rel is None and da == db and (_short(ra, da) or _short(rb, db))
        rows.append(LayerDiff(layer=ra["layer"], norm_a=ra["resid_norm_last"],
                              norm_b=rb["resid_norm_last"], rel_diff=rel, cos=cos,
                              lens_a=ra.get("lens_text"), lens_b=rb.get("lens_text"),
                              lens_same=ra.get("lens_id") == rb.get("lens_id")))
    if withheld:
        notes.append(notes_.DIFF_SNIPPET())
    for label, t in zip(labels, (a, b), strict=True):
        if t.get("first_nonfinite"):
            notes.append(notes_.DIFF_NONFINITE(label=label, where=t["first_nonfinite"]))
    if tolerance is None:
        tolerance, reason = default_tolerance(a["model"]["dtype"], b["model"]["dtype"])
    else:
        reason = f"{tolerance:g}, from --tolerance"
    first_over = next(("embed" if r.layer is None else f"block {r.layer}" for r in rows
                       if r.rel_diff is not None and not r.rel_diff <= tolerance), None)
    comparable = bool(rows) and all(r.rel_diff is not None for r in rows) and len(la) == len(lb)
    return TraceDiff(
        a=side_a, b=side_b, layers=tuple(rows), tolerance=tolerance, tolerance_reason=reason,
        first_over=first_over, comparable=comparable, within=comparable and first_over is None,
        top_k=_top_k(a, b), notes=tuple(notes), routing=routing_diff(a, b, rows))


def _top_k(a: dict, b: dict) -> tuple[TokenDiff, ...]:
    ta = {t["id"]: t for t in a["top_k"]}
    tb = {t["id"]: t for t in b["top_k"]}
    order = list(ta) + [i for i in tb if i not in ta]
    return tuple(TokenDiff(id=i, text=(ta.get(i) or tb[i])["text"],
                           rank_a=ta[i]["rank"] if i in ta else None,
                           rank_b=tb[i]["rank"] if i in tb else None,
                           prob_a=ta[i]["prob"] if i in ta else None,
                           prob_b=tb[i]["prob"] if i in tb else None) for i in order)


__all__ = ["TOLERANCE", "default_tolerance", "diff_traces", "read_trace"]
