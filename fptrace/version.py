"""`fptrace --version` (and `-V`): fptrace's version, the versions of torch and transformers it
runs on, and which optional parts are installed, one line each. Read from the installed
packages' metadata and the PATH: standard library only, nothing imported, so it answers before
the Typer app (or torch) would load."""

from __future__ import annotations

import importlib.metadata as metadata
import shutil

# (distribution, what it adds): the optional parts of pyproject.toml's extras
OPTIONAL = (
    ("ray", "batch --ray"),
    ("torchao", "--quantize, diff --quantize-b"),
    ("xllamacpp", "llama.cpp: --engine llama.cpp, diff --engine-b llama.cpp"),
    ("playwright", "drives the browser of the page's test"),
)
BROWSERS = ("chromium", "chromium-browser")


def installed(name: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def describe() -> str:
    """The lines `fptrace --version` prints."""
    lines = [f"fptrace {installed('fptrace') or 'unknown (not installed as a package)'}"]
    for name in ("torch", "transformers"):
        lines.append(f"{name} {installed(name) or 'not installed'}")
    for name, what in OPTIONAL:
        lines.append(f"{name} {installed(name) or 'not installed'} ({what})")
    browser = next((p for p in map(shutil.which, BROWSERS) if p), None)
    lines.append(f"{browser.rsplit('/', 1)[-1] if browser else 'chromium'} "
                 f"{'on the PATH' if browser else 'not found'} (the page's browser test)")
    return "\n".join(lines)


__all__ = ["describe", "installed"]
