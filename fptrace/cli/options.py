"""The options several commands share, each group defined once and attached to every command
that takes it.

`@model_options()` adds --model, --random-weights, --seed, --device, --dtype, --allow-pickle,
--trust-remote-code (and, with placement=True, --device-map, --max-memory, --offload-folder) to
a Typer command and hands the command one `LoadOptions` object as its `opts` argument. A new
loading option is one edit: a field of LoadOptions and a line in OPTIONS. `@chat_options()`
adds --chat, --system, --messages, --ids and --ids-file the same way, as one `ChatOptions`
(`chat`), and `@output_options()` --plot, --html, --force, --json and --wide (those the command
writes), as one `Outputs` (`outputs`). cli.io's `@prompt_command` attaches the three groups of a
command that traces one prompt.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import Enum
from typing import Annotated

import typer

from fptrace.models.options import LoadOptions
from fptrace.models.registry import DEFAULT_MODEL, RESOLUTION_HELP

MODEL = "Model"
OUTPUT = "Output"
STATS = "Statistics"

# (name, annotation, default); the names are LoadOptions' fields
OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("model", Annotated[str, typer.Option("--model", "-m", help=RESOLUTION_HELP,
                                          rich_help_panel=MODEL)], DEFAULT_MODEL),
    ("random_weights", Annotated[bool, typer.Option(
        "--random-weights", help="Build the model's config with seeded random weights (no "
        "weights needed; predictions then mean nothing).", rich_help_panel=MODEL)], False),
    ("seed", Annotated[int, typer.Option(
        "--seed", help="Seed for --random-weights, and for the draws of commands that sample.",
        rich_help_panel=MODEL)], 0),
    ("device", Annotated[str, typer.Option("--device", help="auto, cpu, cuda, cuda:N or mps.",
                                           rich_help_panel=MODEL)], "auto"),
    ("dtype", Annotated[str, typer.Option("--dtype", help="auto, float32, bfloat16 or float16 "
                                          "(auto: float32 on CPU).", rich_help_panel=MODEL)],
     "auto"),
    ("allow_pickle", Annotated[bool, typer.Option(
        "--allow-pickle", help="Allow pickle (.bin/.pt) weights, which can run code: only for "
        "sources you trust.", rich_help_panel=MODEL)], False),
    ("trust_remote_code", Annotated[bool, typer.Option(
        "--trust-remote-code", help="Allow a model folder's own Python code to run.",
        rich_help_panel=MODEL)], False),
)
PLACEMENT: tuple[tuple[str, object, object], ...] = (
    ("device_map", Annotated[str | None, typer.Option(
        "--device-map", help="auto: load through Accelerate, spreading blocks over the GPUs, "
        "then CPU RAM, then disk (big models).", rich_help_panel=MODEL)], None),
    ("max_memory", Annotated[str | None, typer.Option(
        "--max-memory", help="With --device-map: memory per device, e.g. "
        "0=70GiB,1=70GiB,cpu=200GiB.", rich_help_panel=MODEL)], None),
    ("offload_folder", Annotated[str | None, typer.Option(
        "--offload-folder", help="With --device-map: where weights that fit nowhere else go "
        "(default: a temporary folder).", rich_help_panel=MODEL)], None),
)
TP: tuple[tuple[str, object, object], ...] = (
    ("tp", Annotated[int | None, typer.Option(
        "--tp", help="Tensor parallelism: shard the model over N processes on this machine "
        "(torch's launcher; under torchrun, fptrace uses the ranks it is given).",
        rich_help_panel=MODEL)], None),
)
QUANTIZE: tuple[tuple[str, object, object], ...] = (
    ("quantize", Annotated[str | None, typer.Option(
        "--quantize", help="int8 or int4: quantize the blocks' linear weights on load (torchao's "
        "weight-only schemes through transformers; needs torchao 0.15 or later).",
        rich_help_panel=MODEL)], None),
)
assert {n for n, _, _ in OPTIONS + PLACEMENT + TP + QUANTIZE} == \
    {f.name for f in fields(LoadOptions)}

PlotOpt = Annotated[str | None, typer.Option(
    "--plot", help="Also write a figure (.png, .svg, .pdf, .jpg or .webp; no display needed).",
    rich_help_panel=OUTPUT)]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Replace an existing output file (--plot, --html, --out, --save-vector, "
    "--save-scales) even if fptrace did not write it.", rich_help_panel=OUTPUT)]
HtmlOpt = Annotated[str | None, typer.Option(
    "--html", metavar="FILE", help="Also write this result as the interactive report page: one "
    "self-contained .html file (hover, click, keys), no network request.",
    rich_help_panel=OUTPUT)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Write the result as one JSON object on "
                                       "stdout.", rich_help_panel=OUTPUT)]
WideOpt = Annotated[bool, typer.Option(
    "--wide", help="Show every column of every table, however wide the terminal (otherwise "
    "the least important columns that do not fit are left out, and named).",
    rich_help_panel=OUTPUT)]

# what `run` shows of a trace and `batch` writes of each: one declaration for both
TopKOpt = Annotated[int, typer.Option("--top-k", "-k", min=1, help="How many next tokens.",
                                      rich_help_panel=STATS)]
SnippetOpt = Annotated[int, typer.Option("--snippet", min=0, help="First values of the last "
                                         "position kept per layer.", rich_help_panel=STATS)]


RAY = "Ray"
RayOpt = Annotated[str | None, typer.Option(
    "--ray", metavar="ADDRESS", help="Spread the work over a Ray cluster's actors: auto (the "
    "cluster `ray start` or RAY_ADDRESS names, else a local one) or its address; the results "
    "come back here, in order.", rich_help_panel=RAY)]
WorkersOpt = Annotated[int, typer.Option("--workers", help="With --ray: actors, each loading "
                                         "the model once.", rich_help_panel=RAY)]
GpusPerWorkerOpt = Annotated[float | None, typer.Option(
    "--gpus-per-worker", help="With --ray: GPUs per actor (default 1 when the cluster has "
    "GPUs, else 0).", rich_help_panel=RAY)]


@dataclass(frozen=True)
class Outputs:
    """Where a command's result goes: the JSON (--json) or the view that fits the terminal
    (--wide: every column), a figure (--plot FILE) and the page (--html FILE), which --force lets
    replace a file fptrace did not write."""

    plot: str | None = None
    html: str | None = None
    force: bool = False
    as_json: bool = False
    wide: bool = False


OUTPUT_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("plot", PlotOpt, None), ("html", HtmlOpt, None), ("force", ForceOpt, False),
    ("as_json", JsonOpt, False), ("wide", WideOpt, False))
assert [n for n, _, _ in OUTPUT_OPTIONS] == [f.name for f in fields(Outputs)]


def output_options(plot: bool = True, html: bool = True, force: bool | None = None
                   ) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Attach --json and --wide, and --plot, --html and --force where the command writes them
    (force: by default where it writes a file), after the command's own options, to a command
    whose function takes `outputs: Outputs`."""
    files = {"plot": plot, "html": html, "force": plot or html if force is None else force}
    return _group(tuple(o for o in OUTPUT_OPTIONS if files.get(o[0], True)), Outputs, "outputs",
                  last=True)


def model_options(placement: bool = True, tp: bool = False, quantize: bool = False
                  ) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Attach the loading options to a command whose function takes `opts: LoadOptions`.

    placement: also --device-map, --max-memory and --offload-folder (commands whose work reads
    weights step by step, like explain, leave them out); tp: also --tp; quantize: also
    --quantize (commands that only hook the model's modules)."""
    return _group(OPTIONS + (PLACEMENT if placement else ()) + (TP if tp else ()) +
                  (QUANTIZE if quantize else ()), LoadOptions, "opts")


CHAT = "Chat"
PROMPT = "Prompt"


@dataclass(frozen=True)
class ChatOptions:
    """How the prompt is handed to the model: as plain text, or through its chat template."""

    chat: bool = False  # PROMPT is the user's message
    system: str | None = None  # a system message before it (implies --chat)
    messages: str | None = None  # a JSON file with the whole conversation, instead of PROMPT
    ids: str | None = None  # token ids to trace as they are, instead of PROMPT ("504,3575,282")
    ids_file: str | None = None  # a file of token ids (a JSON list, or one id a line)

    def whole(self) -> bool:
        """Whether the prompt is given whole, not as PROMPT's text: a conversation
        (--messages) or token ids (--ids, --ids-file)."""
        return self.messages is not None or self.ids is not None or self.ids_file is not None


IdsOpt = Annotated[str | None, typer.Option(
    "--ids", metavar="IDS", help="Token ids instead of the text, taken as they are, e.g. "
    "504,3575,282 (`fptrace tokens --ids` shows what they are).", rich_help_panel=PROMPT)]
IdsFileOpt = Annotated[str | None, typer.Option(
    "--ids-file", metavar="FILE", help="The token ids in FILE (a JSON list, or one id a line) "
    "instead of the text.", rich_help_panel=PROMPT)]

CHAT_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("chat", Annotated[bool, typer.Option(
        "--chat", help="PROMPT is a user's message: apply the model's chat template (with the "
        "assistant's turn opened) and trace that.", rich_help_panel=CHAT)], False),
    ("system", Annotated[str | None, typer.Option(
        "--system", help="A system message before the user's (implies --chat).",
        rich_help_panel=CHAT)], None),
    ("messages", Annotated[str | None, typer.Option(
        "--messages", help="A JSON file holding a whole conversation, "
        '[{"role": "user", "content": "..."}, ...], traced through the chat template instead '
        "of PROMPT.", rich_help_panel=CHAT)], None),
    ("ids", IdsOpt, None),
    ("ids_file", IdsFileOpt, None),
)
assert {n for n, _, _ in CHAT_OPTIONS} == {f.name for f in fields(ChatOptions)}


def chat_options() -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Attach --chat, --system, --messages, --ids and --ids-file to a command whose function
    takes `chat: ChatOptions` (cli.io.load_for turns them and PROMPT into what is traced)."""
    return _group(CHAT_OPTIONS, ChatOptions, "chat")


def _group(chosen: tuple[tuple[str, object, object], ...], cls: Callable[..., object], param: str,
           last: bool = False) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Replace the command's `param` argument by the options of `chosen` (Typer sees them:
    before the command's own options, or after them with `last`), and hand the command one
    `cls` object built from their values."""

    def attach(fn: Callable[..., object]) -> Callable[..., object]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != param]
        required = [p for p in own if p.default is inspect.Parameter.empty]
        optional = [p for p in own if p.default is not inspect.Parameter.empty]
        added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                   default=default, annotation=annotation)
                 for name, annotation, default in chosen]
        names = [name for name, _, _ in chosen]

        @functools.wraps(fn)
        def command(*args: object, **kwargs: object) -> object:
            group = cls(**{n: kwargs.pop(n) for n in names if n in kwargs})
            return fn(*args, **{param: group}, **kwargs)

        params = required + optional + added if last else required + added + optional
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return attach


SAMPLING = "Sampling"



def engine_options(side_b: bool = False
                   ) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Attach --engine (side_b: diff's --engine-b, among the engines that compare) and every
    engine's settings (fptrace/engines/: --flash-attn, --kv-cache) to a command whose function
    takes `engine: EngineChoice`; the choices and their help come from the engine folders."""
    from fptrace.engines import EngineChoice, engines

    found = engines()
    first = found[0]  # the default engine
    named = [e for e in found if not e.default and (e.compare is not None or not side_b)]
    choice = Enum("Engine", {e.name: e.name for e in [first, *named]},  # type: ignore[misc]
                  type=str)
    if side_b:
        text = "... computed by this engine: " + "; ".join(
            f"{e.name} {e.help_b}" for e in named) + "."
    else:
        text = f"{first.name} (default) or " + "; ".join(
            f"{e.name}: {e.help}" for e in named) + "."
    chosen: list[tuple[str, object, object]] = [(
        "engine_name", Annotated[choice, typer.Option(  # type: ignore[valid-type]
            "--engine-b" if side_b else "--engine", help=text, rich_help_panel=MODEL)],
        choice(first.name))]
    settings = [s for e in found for s in e.settings]
    for s in settings:
        words = Enum(s.name, {w: w for w in s.choices}, type=str)  # type: ignore[misc]
        chosen.append((s.name, Annotated[words, typer.Option(  # type: ignore[valid-type]
            s.flag, help=s.help, rich_help_panel=MODEL)], words(s.default)))

    def build(engine_name: object = None, **values: object) -> EngineChoice:
        words = {s.name: getattr(values.get(s.name), "value", s.default) for s in settings}
        name = getattr(engine_name, "value", None)
        return EngineChoice(None if name in (None, first.name) else name, words,
                            {s.flag: words[s.name] != s.default for s in settings})

    return _group(tuple(chosen), build, "engine")
