"""Python's options against the one option schema (training/config_schema.h, issue 28): every schema option
that applies to Python is a field of TrainingConfig with the schema's help; every spec field, make_config and
TrainingSession keyword argument and stub is in the schema, so an option added in one place only fails here."""
import ast
import inspect
import pathlib

import pytest

import onnxtrain
from onnxtrain import _onnxtrain

STUBS = pathlib.Path(__file__).resolve().parents[2] / "python" / "onnxtrain" / "_onnxtrain.pyi"

# TrainingConfig fields that are not options of the schema, and why.
NOT_OPTIONS = {"device"}  # where the session runs, not how it trains; each way in names it itself
# make_config keywords that are not schema paths: a shortcut and the device.
SHORTCUTS = {"learning_rate": "optimizer.learning_rate", "device": None}


def schema():
    return _onnxtrain.config_schema()


def python_options():
    return {o["python"]: o for o in schema() if "python" in o["ways"]}


def spec_fields(obj, prefix=""):
    """Every field path of a TrainingConfig, descending into the spec objects (not into list elements)."""
    for name, value in obj.to_dict().items():
        path = prefix + name
        if hasattr(value, "to_dict"):
            yield from spec_fields(value, path + ".")
        else:
            yield path


def resolve(obj, path):
    """The object holding the field at path, and the field's name."""
    owner = obj
    for part in path.split(".")[:-1]:
        owner = getattr(owner, part)
    return owner, path.split(".")[-1]


def test_schema_entries_are_complete():
    for o in schema():
        assert set(o) >= {"key", "kind", "default", "help", "choices", "min", "max", "ways", "python", "checkpoint"}
        assert o["help"] and o["ways"], o["key"]
    assert len({o["key"] for o in schema()}) == len(schema())
    assert {o["key"] for o in schema()} >= {"distributed.overlap", "distributed.bucket_bytes",
                                             "distributed.compression", "distributed.reduce_every_micro_batch"}


def test_every_python_option_is_a_field_with_the_schema_help():
    cfg = onnxtrain.TrainingConfig()
    for path, o in python_options().items():
        owner, name = resolve(cfg, path)
        assert name in owner.to_dict(), path
        assert getattr(type(owner), name).__doc__ == o["help"], path


def test_every_spec_field_is_an_option():
    fields = set(spec_fields(onnxtrain.TrainingConfig()))
    assert fields - NOT_OPTIONS == set(python_options())


def test_make_config_keywords_are_options():
    sections = {p.split(".")[0] for p in python_options() if "." in p}
    for name in inspect.signature(onnxtrain.make_config).parameters:
        if name in SHORTCUTS:
            assert SHORTCUTS[name] is None or SHORTCUTS[name] in python_options(), name
        else:
            assert name in sections or name in python_options(), f"make_config({name}=...) is not in the schema"
    # Every section and top-level option is a keyword.
    keywords = set(inspect.signature(onnxtrain.make_config).parameters)
    assert sections | {p for p in python_options() if "." not in p} <= keywords


def test_training_session_takes_every_make_config_keyword():
    session = set(inspect.signature(onnxtrain.TrainingSession.__init__).parameters)
    assert set(inspect.signature(onnxtrain.make_config).parameters) <= session


def test_stubs_list_every_spec_field_in_order():
    tree = ast.parse(STUBS.read_text())
    stubbed = {node.name: [a.target.id for a in node.body if isinstance(a, ast.AnnAssign)]
               for node in tree.body if isinstance(node, ast.ClassDef)}
    for name in ["LossSpec", "PenaltySpec", "ParamGroup", "OptimizerSpec", "ScheduleSpec", "MixedPrecisionSpec",
                 "AdapterSpec", "MemorySpec", "DataParallelSpec", "TrainingConfig"]:
        assert stubbed.get(name) == list(getattr(onnxtrain, name)().to_dict()), name
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert "config_schema" in functions


def test_defaults_match_the_schema():
    cfg = onnxtrain.TrainingConfig()
    yaml_scalars = {"true": True, "false": False, "null": None, "[]": [], '""': ""}
    for path, o in python_options().items():
        owner, name = resolve(cfg, path)
        value = getattr(owner, name)
        text = o["default"]
        if text in yaml_scalars:
            expected = yaml_scalars[text]
        elif o["kind"] in ("integer", "number", "optional number", "optional integer"):
            expected = float(text)
        elif o["kind"] in ("string", "choice"):
            expected = text
        else:
            continue  # spelled-out list defaults ([all-linear], none) mean the empty list
        assert value == expected, path


def test_make_config_takes_distributed_options():
    cfg = onnxtrain.make_config(distributed={"overlap": False, "bucket_bytes": 4096, "compression": "bfloat16",
                                             "reduce_every_micro_batch": False})
    assert cfg.distributed == onnxtrain.DataParallelSpec(overlap=False, bucket_bytes=4096, compression="bfloat16",
                                                         reduce_every_micro_batch=False)
    assert onnxtrain.make_config().distributed == onnxtrain.DataParallelSpec()
    spec = onnxtrain.DataParallelSpec(compression="float16")
    assert onnxtrain.make_config(distributed=spec).distributed.compression == "float16"
    with pytest.raises(ValueError, match="distributed.compression: expected one of 'none', 'bfloat16', 'float16'"):
        onnxtrain.make_config(distributed={"compression": "int8"})
    with pytest.raises(TypeError, match="unknown option 'bucket'"):
        onnxtrain.make_config(distributed={"bucket": 1})
    with pytest.raises(ValueError, match="on_non_finite: expected 'raise' or 'skip', got 'ignore'"):
        onnxtrain.make_config(on_non_finite="ignore")


def test_checkpoint_docs_list_every_stored_option():
    page = (STUBS.parents[2] / "docs" / "checkpoint.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `onnxtrain.")]
    for o in schema():
        if "checkpoint" not in o["ways"]:
            continue
        key = o["checkpoint"]
        if f"| `onnxtrain.{key}` |" in page:
            continue
        assert "." in key, f"docs/checkpoint.md has no row for onnxtrain.{key}"
        section, field = key.split(".", 1)
        row = [r for r in rows if r.startswith(f"| `onnxtrain.{section}.<field>` |")]
        assert row, f"docs/checkpoint.md has no row for onnxtrain.{section}.<field>"
        listed = row[0].split("|")[2].split(":", 1)[-1].split("(")[0].replace("`", " ").split()
        assert field in listed, key


def test_make_config_defaults_are_the_schema_defaults():
    # TrainingConfig() holds the schema's defaults (test_defaults_match_the_schema); make_config's keyword
    # defaults must build the same config.
    assert onnxtrain.make_config() == onnxtrain.TrainingConfig()
