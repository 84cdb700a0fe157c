"""`fptrace run --engine llama.cpp`: the same table, computed from the pass llama.cpp runs."""

from __future__ import annotations

import dataclasses
from typing import Any

from fptrace.cli.io import load, prompt_of, said_of_ids
from fptrace.cli.options import ChatOptions, LoadOptions
from fptrace.errors import BadInput


def refused(opts: LoadOptions, chat: ChatOptions, **given: Any) -> str | None:
    """The first option given that llama.cpp's pass does not take, or None."""
    if chat.chat or chat.system is not None or chat.messages is not None:
        return "--chat/--system/--messages"
    for flag, value in (("--random-weights", opts.random_weights), ("--tp", opts.tp),
                        ("--quantize", opts.quantize), ("--device-map", opts.device_map)):
        if value:
            return flag
    return next((flag for flag, value in given.items() if value), None)


def trace_llamacpp(prompt: str | None, opts: LoadOptions, chat: ChatOptions, *, flash_attn: str,
                   kv_cache: str, top_k: int, snippet: int, **unsupported: Any) -> Any:
    """Check everything that costs nothing, run llama.cpp (fast), then load the same GGUF in
    transformers for the token texts and the lens, and build the Trace."""
    from fptrace.core.llamacpp_trace import gguf_path, llamacpp_trace, run_llamacpp
    from fptrace.models.llamacpp.binding import load as load_library
    from fptrace.models.llamacpp.engine import EngineOptions

    flag = refused(opts, chat, **unsupported)
    if flag is not None:
        raise BadInput(f"{flag} is not available with --engine llama.cpp")
    given = prompt_of(prompt, chat)
    path = gguf_path(opts.model)
    load_library()
    options = EngineOptions(flash_attn=flash_attn, cache_type=kv_cache)
    if isinstance(given, str):
        lm_pass = run_llamacpp(path, given, options)
        trace, _ = llamacpp_trace(load(opts), lm_pass, top_k=top_k, snippet=snippet)
        return trace
    lm_pass = run_llamacpp(path, "", options, ids=list(given))  # --ids: llama.cpp runs them
    lm = load(opts)
    said_of_ids(lm, given)
    lm_pass = dataclasses.replace(lm_pass, prompt=lm.prompt_text(given))
    trace, _ = llamacpp_trace(lm, lm_pass, top_k=top_k, snippet=snippet, given_ids=True)
    return trace
