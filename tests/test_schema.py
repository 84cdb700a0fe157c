"""One JSON contract: every kind of output validates against the schema `fptrace schema`
prints, and docs/schema.md is the current rendering of it."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jsonschema
import pytest
from conftest import make_gpt2_folder
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.schema.core import json_schema, markdown
from fptrace.render.json import to_dict, to_json

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def validator():
    r = runner.invoke(app, ["schema"])
    assert r.exit_code == 0
    schema = json.loads(r.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(make_gpt2_folder(tmp_path_factory.mktemp("schema-model"))[0])


def valid(validator, data, kind):
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message[:200]}" for e in errors[:3]]
    assert data["kind"] == kind


def out_json(*args):
    r = runner.invoke(app, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_run_shapes_explain_models(validator, folder, tmp_path):
    valid(validator, out_json("run", "The cat sat", "-m", folder, "--json"), "trace")
    valid(validator, out_json("run", "The cat sat", "-m", folder, "--json", "--all-positions",
                              "--snippet", "0"), "trace")
    with_grid = out_json("run", "The cat sat", "-m", folder, "--json", "--plot",
                         str(tmp_path / "t.png"))
    assert len(with_grid["lens_grid"]) == 3 and len(with_grid["lens_grid"][0]) == 3
    valid(validator, with_grid, "trace")
    valid(validator, out_json("explain", "The cat sat", "-m", folder, "--json", "--plot",
                              str(tmp_path / "a.png")), "explain")
    valid(validator, out_json("shapes", "--model", "llama-3.1-8b", "The cat sat", "--json"),
          "shapes")
    valid(validator, out_json("shapes", "--model", "gpt2", "-T", "5", "--json"), "shapes")
    valid(validator, out_json("explain", "The cat sat", "-m", folder, "--json"), "explain")
    valid(validator, out_json("generate", "The cat sat", "-m", folder, "-n", "3", "--json",
                              "--layers", "--temperature", "0.7", "--top-k", "5"), "generation")
    valid(validator, out_json("models", "--json"), "models")
    valid(validator, out_json("attribute", "The cat sat", "-m", folder, "--json", "--plot",
                              str(tmp_path / "attr.png")), "attribution")
    valid(validator, out_json("attribute", "The cat sat", "-m", folder, "--json", "--target",
                              " on", "--versus", "#11"), "attribution")
    r = runner.invoke(app, ["diff", "The cat sat", "The dog ran", "-m", folder, "--json"])
    valid(validator, json.loads(r.stdout), "diff")


def test_batch_lines(validator, folder, tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text('{"id": "a", "prompt": "The cat sat", "answer": "mat"}\n{broken\n')
    out = tmp_path / "o.jsonl"
    r = runner.invoke(app, ["batch", str(src), "-m", folder, "-o", str(out)])
    assert r.exit_code == 1
    kinds = []
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        valid(validator, rec, rec["kind"])
        kinds.append(rec["kind"])
    assert kinds == ["trace", "error"]
    # a batch trace is not a plain trace, and the other way round
    rec = json.loads(out.read_text().splitlines()[0])
    plain = {k: v for k, v in rec.items() if k not in ("id", "source", "extra")}
    valid(validator, plain, "trace")
    with pytest.raises(AssertionError):
        valid(validator, {**plain, "surprise": 1}, "trace")


def test_nonfinite_floats_are_null_and_listed(validator, folder):
    from fptrace.core.trace import run_trace
    from fptrace.models.loading import load_model

    t = run_trace(load_model(folder), "The cat sat")
    layers = list(t.layers)
    layers[1] = dataclasses.replace(layers[1], resid_norm_last=math.nan, cos_prev=math.inf,
                                    finite=False)
    bad = dataclasses.replace(t, layers=tuple(layers), first_nonfinite="block 0")
    text = to_json(bad)  # strict JSON: NaN/Infinity would raise
    data = json.loads(text)
    assert data["layers"][1]["resid_norm_last"] is None
    assert set(data["nonfinite"]) == {"layers[1].resid_norm_last", "layers[1].cos_prev"}
    valid(validator, data, "trace")


def test_python_api_gives_the_same_objects(validator, folder):
    from fptrace import load_model, trace

    t = trace(load_model(folder), "The cat sat")
    valid(validator, to_dict(t), "trace")
    cli = out_json("run", "The cat sat", "-m", folder, "--json")
    assert to_dict(t)["tokens"] == cli["tokens"]
    assert [x["id"] for x in to_dict(t)["top_k"]] == [x["id"] for x in cli["top_k"]]


def test_every_field_is_documented_and_docs_are_current():
    schema = json_schema()
    for name, d in schema["$defs"].items():
        assert d.get("description"), name
        for key, prop in d["properties"].items():
            assert prop.get("description"), f"{name}.{key}"
    doc = (ROOT / "docs" / "schema.md").read_text(encoding="utf-8")
    assert doc == markdown(), "docs/schema.md is stale: python -m fptrace.schema --markdown"


def test_api_names_are_functions_after_every_import():
    """Importing every submodule must not shadow the API functions (a submodule named like a
    function would replace it on the package)."""
    import importlib
    import pkgutil

    import fptrace

    for m in pkgutil.walk_packages(fptrace.__path__, "fptrace."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    from fptrace import attribute, diff, explain, load_model, patch, trace, trace_many

    assert all(callable(f) and not hasattr(f, "__path__") and type(f).__name__ == "function"
               for f in (explain, load_model, trace, trace_many, attribute, patch, diff))


def test_the_kinds_of_the_registry_are_documented():
    """The texts of norm_type, mlp_type and positions name every kind the family registry
    allows (they went stale once, when Gemma's kinds were added)."""
    from fptrace.families.kinds import MlpKind, NormKind, PositionKind

    defs = json_schema()["$defs"]
    for name in ("ModelInfo", "ShapeReport"):
        props = defs[name]["properties"]
        for field, kinds in (("norm_type", NormKind), ("mlp_type", MlpKind),
                             ("positions", PositionKind)):
            for kind in kinds:
                if kind.value != "unknown":  # the generic family's, said in `unknown`
                    assert kind.value in props[field]["description"], (name, field, kind)


def test_the_version_is_the_newest_a_result_module_declares(tmp_path):
    """A command folder that adds a kind raises the minor version from its own result.py
    (SCHEMA_SINCE): results.py reads the declarations as text, and agrees with the modules."""
    from fptrace import results
    from fptrace.commands.schema.core import result_modules

    def key(v):
        return tuple(int(x) for x in v.split("."))

    declared = [m.SCHEMA_SINCE for m in result_modules() if hasattr(m, "SCHEMA_SINCE")]
    assert results.SCHEMA_VERSION == max([results.SCHEMA_BASE, *declared], key=key)
    (tmp_path / "newer").mkdir()
    (tmp_path / "newer" / "result.py").write_text('"""x"""\n\nSCHEMA_SINCE = "1.9"\n')
    (tmp_path / "older").mkdir()
    (tmp_path / "older" / "result.py").write_text('SCHEMA_SINCE = "1.1"\n')
    assert results.schema_version("1.3", tmp_path) == "1.9"
    assert results.schema_version("2.0", tmp_path) == "2.0"


def test_every_check_target_is_documented_by_its_command():
    """Check.target's description joins the CHECK_TARGETS each command declares in its result
    module, and names every target the checks of those commands use."""
    from fptrace.extensions import declared

    text = json_schema()["$defs"]["Check"]["properties"]["target"]["description"]
    found = declared("result", "CHECK_TARGETS")
    assert {name for name, _ in found} >= {"explain", "attribute", "steer", "ablate"}
    for _, targets in found:
        assert targets in text
