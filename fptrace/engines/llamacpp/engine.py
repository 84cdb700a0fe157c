"""The llama.cpp engine as the commands see it (ENGINE, fptrace/engines/__init__.py): `run
--engine llama.cpp` traces the pass llama.cpp computes on a GGUF file; `diff --engine-b
llama.cpp` compares it with transformers' pass of the same file; `--emulate` puts llama.cpp's
numerics on transformers' side.

llama.cpp's pass runs first (it is fast); the same GGUF loaded in transformers then supplies the
token texts, the model's facts and the lens (trace.py). It takes a text prompt or --ids, and
neither the chat template nor the options that change how transformers loads the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from fptrace.engines import Compare, Emulation, Engine, RunRequest, Setting, SideB, Traced
from fptrace.errors import BadInput, param

if TYPE_CHECKING:
    import numpy as np

    from fptrace.engines.llamacpp.capture import EngineOptions, LlamaCppPass
    from fptrace.families import LlamaCppNames
    from fptrace.models.loading import LoadedModel
    from fptrace.points import Point
    from fptrace.results import Trace

NAME = "llama.cpp"


def options_of(settings: Mapping[str, Any]) -> EngineOptions:
    """llama.cpp's settings from the engine settings given (--flash-attn, --kv-cache; and, for
    the Python API's caller, `threads`)."""
    from fptrace.engines.llamacpp.capture import EngineOptions

    options = EngineOptions(flash_attn=settings.get("flash_attn", "auto"),
                            cache_type=settings.get("kv_cache", "f16"))
    if "threads" in settings:
        options = dataclasses.replace(options, threads=int(settings["threads"]))
    return options


def trace(request: RunRequest) -> Traced:
    """Check everything that costs nothing, run llama.cpp, then load the same GGUF in
    transformers for the token texts and the lens, and build the Trace."""
    from fptrace.cli.io import load, prompt_of, said_of_ids
    from fptrace.engines.llamacpp.binding import load as load_library
    from fptrace.engines.llamacpp.trace import gguf_path, llamacpp_trace, run_llamacpp

    given = prompt_of(request.prompt, request.chat)
    path = gguf_path(request.opts.model)
    load_library()
    options = options_of(request.settings)
    if isinstance(given, str):
        lm_pass = run_llamacpp(path, given, options)
        traced, _ = llamacpp_trace(load(request.opts), lm_pass, top_k=request.top_k,
                                   snippet=request.snippet)
        return Traced(traced)
    lm_pass = run_llamacpp(path, "", options, ids=list(given))  # --ids: llama.cpp runs them
    lm = load(request.opts)
    said_of_ids(lm, given)
    lm_pass = dataclasses.replace(lm_pass, prompt=lm.prompt_text(given))
    traced, _ = llamacpp_trace(lm, lm_pass, top_k=request.top_k, snippet=request.snippet,
                               given_ids=True)
    return Traced(traced)


def prepare(side: SideB) -> str:
    """The checks that cost nothing (the combination, the files, the library): the GGUF
    llama.cpp runs (--model-b's, when it is not side a's file)."""
    from fptrace.engines.llamacpp.binding import load as load_library
    from fptrace.engines.llamacpp.trace import gguf_path

    if side.second is not None:
        raise BadInput(f"{param('engine_b')} {NAME} compares one prompt on two engines: give one "
                       f"PROMPT")
    if set(side.settings_b) - {"model"}:
        raise BadInput(f"{param('engine_b')} {NAME} runs a GGUF in llama.cpp: give it without "
                       f"{param('dtype_b')}/{param('device_b')}/{param('quantize_b')}/{param('random_weights_b')}")
    chat = side.chat
    if chat.chat or chat.system is not None or chat.messages is not None:
        raise BadInput(f"{param('engine_b')} {NAME} takes a text PROMPT, not "
                       f"{param('chat')}/{param('system')}/{param('messages')}")
    gguf_path(side.opts.model)  # side a is a GGUF too: the same checkpoint in transformers
    path = gguf_path(side.settings_b.get("model", side.opts.model))
    load_library()
    return path


@dataclasses.dataclass(frozen=True)
class GraphPass:
    """llama.cpp's pass as diff compares it (an EnginePass): its trace, and each block's
    points read from the graph's tensors through the family's llama.cpp names."""

    trace: Trace
    points: frozenset[Point]
    captured: LlamaCppPass
    names: LlamaCppNames

    def block(self, layer: int, n_heads: int, n_kv_heads: int) -> dict[Point, np.ndarray]:
        from fptrace.engines.llamacpp.trace import block_points

        return block_points(self.captured, self.names, layer, n_heads, n_kv_heads)

    def stream(self, layer: int) -> np.ndarray:
        from fptrace.engines.llamacpp.trace import squeeze
        from fptrace.points import Point

        p = self.names.points
        name = p[Point.embed] if layer < 0 else f"{p[Point.resid_post]}-{layer}"
        return squeeze(self.captured.tensors[name], 2)


def run_pass(lm: LoadedModel, path: str, prompt: Any, settings: Mapping[str, str]) -> GraphPass:
    """llama.cpp's pass of `prompt` (a text: llama.cpp tokenizes it too, and a difference is
    named; ids: both engines run exactly these) on the GGUF at `path`, traced."""
    from fptrace.engines.llamacpp.trace import llamacpp_trace, names_for, run_llamacpp

    options = options_of(settings)
    ids = lm.encode(prompt)
    if isinstance(prompt, str):
        captured = run_llamacpp(path, prompt, options, ids=ids)
    else:
        captured = dataclasses.replace(run_llamacpp(path, "", options, ids=ids),
                                       prompt=lm.prompt_text(prompt))
    names = names_for(captured)
    traced, _ = llamacpp_trace(lm, captured, snippet=int(lm.config.hidden_size),
                               given_ids=True)
    return GraphPass(traced, frozenset(names.points) | frozenset(names.parts), captured, names)


def parse(text: str) -> tuple[str, ...]:
    from fptrace.engines.llamacpp.emulate import parse_steps

    return parse_steps(text)


def ladder(steps: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    from fptrace.engines.llamacpp.emulate import ladder as rungs

    return rungs(steps)


def emulating(lm: LoadedModel, path: str, steps: Sequence[str],
              settings: Mapping[str, str]) -> AbstractContextManager[str | None]:
    from fptrace.engines.llamacpp.emulation import emulating as hooked

    cache, kernel = described(settings)
    return hooked(lm, path, steps, cache=cache, flash=kernel == "flash")


def described(settings: Mapping[str, str]) -> tuple[str, str]:
    """(the K/V cache type, the attention kernel) the settings give."""
    options = options_of(settings)
    return options.cache_type, "plain" if options.flash_attn == "off" else "flash"


# llama.cpp's own settings that change its numbers (binding.FLASH_ATTN and CACHE_TYPES hold
# what each word means to it; a test holds the two to the same words)
SETTINGS = (
    Setting("flash_attn", "--flash-attn", ("auto", "on", "off"), "auto",
            "llama.cpp's flash attention (its default, auto, turns it on on CPU)."),
    Setting("kv_cache", "--kv-cache", ("f16", "f32", "bf16"), "f16",
            "llama.cpp's K/V cache type (its default: f16)."),
)

ENGINE = Engine(
    name=NAME, order=10,
    help="run the GGUF in llama.cpp (the [llamacpp] extra) and trace the numbers it computes",
    help_b="runs the same GGUF in llama.cpp (the [llamacpp] extra) and compares it with "
    "transformers",
    takes=frozenset(), settings=SETTINGS,
    trace=trace, compare=Compare(prepare=prepare, run_pass=run_pass),
    emulation=Emulation(
        parse=parse, ladder=ladder, emulating=emulating, described=described,
        help="With --engine-b llama.cpp: put llama.cpp's numerics on the transformers side, "
        "steps separated by commas, added in that order: kv (K/V rounded to the --kv-cache "
        "type), act-q8 (each quantized product's input in llama.cpp's 8-bit blocks), norm "
        "(RMSNorm summed in double), attn (llama.cpp's attention kernel), or all."))
