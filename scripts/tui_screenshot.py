"""Write docs/tui.svg: Textual's own SVG export of `fptrace tui` on the bundled model at 120×40,
with block 23 selected and the heads pane shown (real output of the current code).

    python scripts/tui_screenshot.py
"""

from __future__ import annotations

import asyncio
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "docs" / "tui.svg"


async def _shoot() -> str:
    from fptrace.models.loading import load_model
    from fptrace.commands.tui.app import FptraceApp

    app = FptraceApp(lm=load_model("smollm2-135m", device="cpu"),
                     prompt="The capital of France is")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press(*["down"] * 24, "h", "h", "h", "h")
        await pilot.pause()
        return app.export_screenshot(title="fptrace tui")


if __name__ == "__main__":
    OUT.write_text(asyncio.run(_shoot()), encoding="utf-8")
    print(f"wrote {OUT}")
