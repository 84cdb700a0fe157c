"""A batched steering sweep against one run per strength, in one process (target ≥ 3×).

Method (figures in benchmarks/README.md): bundled model, float32, CPU, "I think that you are"
steered with ' love' − ' hate' at block 6. After a warm-up, in one process, alternately 5 times
each: the sweep `steer(..., scales="0,1,2,4,8")` (one forward pass, 5 rows, the clean one among
them) and the same five strengths as five separate `steer(..., scales=[s])` runs (what five
invocations of `fptrace steer --scale s` compute once the model is loaded: each a forward pass
with its own clean reference row). Both with the vector given (the steering work alone) and
with the vector measured again by every run (`add=..., subtract=...`, as the command line
does). Medians; the rows are asserted equal to the sweep's.

Usage: python benchmarks/bench_steer.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

PROMPT, ADD, SUBTRACT, LAYER = "I think that you are", " love", " hate", 6
SCALES = (0.0, 1.0, 2.0, 4.0, 8.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    from fptrace.commands.steer.core import steer
    from fptrace.commands.steer.vectors import steering_vector
    from fptrace.models.loading import load_model

    lm = load_model("smollm2-135m", device="cpu")
    vec = steering_vector(lm, add=ADD, subtract=SUBTRACT, layer=LAYER)
    sources = {"vector given": dict(vector=vec),
               "vector measured by every run": dict(add=ADD, subtract=SUBTRACT, layer=LAYER)}
    steer(lm, PROMPT, vector=vec, scales=SCALES)  # warm-up
    for name, source in sources.items():
        sweep_t, loop_t = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sweep = steer(lm, PROMPT, scales=SCALES, **source)
            sweep_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            alone = [steer(lm, PROMPT, scales=[s], **source).rows[-1] for s in SCALES]
            loop_t.append(time.perf_counter() - t0)
            for a, b in zip(sweep.rows, alone):
                assert a.scale == b.scale and a.top[0].id == b.top[0].id
                assert abs(a.target.logit - b.target.logit) <= 1e-3 * max(1, abs(b.target.logit))
        s, l = statistics.median(sweep_t), statistics.median(loop_t)
        print(f"{name}: sweep of 5 {s * 1000:7.1f} ms (1 pass), five runs {l * 1000:7.1f} ms "
              f"→ {l / s:.1f}×")


if __name__ == "__main__":
    main()
