"""fptrace tui: time from Enter to the layer table being rendered, for the second and later
prompts, on the bundled model (target < 0.5 s on 2 cores).

Method (figures in benchmarks/README.md): Textual's headless driver (App.run_test, 120×40) with
the bundled model loaded once; a first prompt warms up; then for each of 9 prompts the prompt is
set, Enter is pressed, and the clock stops when the table holds the new trace's rows and the
screen has been refreshed (pilot.pause waits for the pending messages and the repaint). Median.

Usage: python benchmarks/bench_tui.py
"""

from __future__ import annotations

import asyncio
import statistics
import time

PROMPTS = ["The capital of France is", "The capital of Italy is", "Water boils at",
           "The largest planet is", "Once upon a time", "The cat sat on the",
           "Paris is the capital of", "Two plus two equals", "The opposite of hot is"]


def main() -> None:
    from fptrace.models.loading import load_model
    from fptrace.commands.tui.app import FptraceApp

    lm = load_model("smollm2-135m", device="cpu")

    async def go() -> list[float]:
        app = FptraceApp(lm=lm, prompt="Hello there")
        times = []
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            for prompt in PROMPTS:
                app.query_one("#prompt").value = prompt
                await pilot.press("escape", "slash")
                t0 = time.perf_counter()
                await pilot.press("enter")
                await pilot.pause()
                assert app.trace.prompt == prompt
                times.append(time.perf_counter() - t0)
        return times

    times = asyncio.run(go())
    print(f"Enter → table rendered: median {statistics.median(times) * 1000:.0f} ms, "
          f"max {max(times) * 1000:.0f} ms over {len(times)} prompts")


if __name__ == "__main__":
    main()
