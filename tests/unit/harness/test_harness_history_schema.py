"""The typed history: one model per event type (harness/events.py), the schema generated from them
(schemas/history.schema.json), real stored histories that validate against it, and every writer of the harness
naming only fields its type's model names."""
from __future__ import annotations

import ast
import json
import typing
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from harness import events
from harness.history import EVENT_TYPES, History, HistoryWriter

ROOT = Path(__file__).resolve().parents[3]
SCHEMA_PATH = ROOT / "schemas" / "history.schema.json"
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "histories"
WRITER_METHODS = ("append", "append_if_open", "_record")


def validator() -> Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def invalid_lines(path: Path) -> list[tuple[int, str, str]]:
    v = validator()
    out = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if raw.strip():
            line = json.loads(raw)
            out += [(number, line.get("type"), e.message) for e in v.iter_errors(line)]
    return out


# --- the models and the schema agree ----------------------------------------------------------------------------------

def test_schema_file_is_the_one_generated_from_the_models():
    """Adding a field to a model and not regenerating (or editing the file by hand) fails here:
    `python -m harness.events > schemas/history.schema.json`."""
    assert SCHEMA_PATH.read_text(encoding="utf-8") == events.schema_text()


def test_the_schema_names_each_models_fields_with_their_required_ones():
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert set(schema["$defs"]) == set(events.MODELS) == EVENT_TYPES
    for type_, model in events.MODELS.items():
        fields = events.field_types(type_)
        definition = schema["$defs"][type_]
        assert set(definition["properties"]) == set(fields), type_
        assert set(definition["required"]) == {n for n, (_, req) in fields.items() if req}, type_
        assert set(events.COMMON_FIELDS) <= set(definition["required"]), type_
        assert typing.get_args(typing.get_type_hints(model)["type"]) == (type_,), type_
        assert definition["properties"]["type"] == {"const": type_}
    assert set(typing.get_args(events.AnyEvent)) == set(events.MODELS.values())


def test_a_field_added_to_a_model_changes_the_generated_schema(monkeypatch):
    """The agreement test above can fail: a model with one more field generates a different schema."""
    before = events.schema_text()
    grown = typing.TypedDict("Grown", {"seq": typing.Required[int], "t": typing.Required[float],  # type: ignore[misc]
                                       "wall": typing.Required[float], "type": typing.Required[typing.Literal["note"]],
                                       "message": typing.Required[str], "new_field": int}, total=False)
    monkeypatch.setitem(events.MODELS, "note", grown)
    after = events.schema_text()
    assert after != before
    assert json.loads(after)["$defs"]["note"]["properties"]["new_field"] == {"type": "integer"}


# --- real histories validate; the schema refuses what is not in it ---------------------------------------------------

FIXTURE_FILES = sorted(FIXTURES.glob("*.jsonl"))


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=[p.stem for p in FIXTURE_FILES])
def test_every_line_of_a_stored_real_history_validates(path):
    assert not invalid_lines(path)


def test_the_stored_histories_cover_most_types_and_three_implementations():
    """The fixtures are real runs of the reference, the Go and the TypeScript examples and a broken variant: the
    validation above saw these types, not an empty file."""
    seen = {e["type"] for p in FIXTURE_FILES for e in History.load(p)}
    suts = {e.get("sut") for p in FIXTURE_FILES for e in History.load(p) if e["type"] == "note" and e.get("sut")}
    assert len(FIXTURE_FILES) >= 5
    assert {"invoke", "ok", "fail", "transition", "state", "message", "delivery", "queue", "consumer", "fault",
            "role", "phase", "observe", "note", "object", "metrics", "snapshot", "versions", "version_snapshot",
            "tamper", "unroutable", "info"} <= seen
    assert {"reference", "go-pipeline", "ts-pipeline"} <= suts


def test_the_check_command_reports_a_refused_line_and_passes_a_real_history(tmp_path, capsys):
    real = FIXTURE_FILES[0]
    assert events.main([str(real)]) == 0
    bad = tmp_path / "history.jsonl"
    bad.write_text(real.read_text(encoding="utf-8").splitlines()[0][:-1] + ', "surprise": 1}\n', encoding="utf-8")
    assert events.main([str(bad)]) == 1
    assert "surprise" in capsys.readouterr().out


def test_the_schema_refuses_an_unknown_field_a_missing_one_and_a_wrong_type():
    v = validator()
    ok = {"seq": 3, "t": 1.5, "wall": 1.7e9, "type": "state", "attachment_id": "a", "state": "ready",
          "attempt": 1, "error_code": None}
    assert not list(v.iter_errors(ok))
    assert list(v.iter_errors({**ok, "surprise": 1}))
    assert list(v.iter_errors({k: x for k, x in ok.items() if k != "attempt"}))
    assert list(v.iter_errors({**ok, "attempt": "1"}))
    assert list(v.iter_errors({**ok, "type": "nonsense"}))
    transition = {"seq": 1, "t": 0.1, "wall": 1.7e9, "type": "transition", "attachment_id": "a", "attempt": 1,
                  "event_seq": 4, "from": None, "to": "queued", "actor": "api", "reason": None, "at_server": "x"}
    assert not list(v.iter_errors(transition))
    assert list(v.iter_errors({k: x for k, x in transition.items() if k != "from"}))


# --- the writer -------------------------------------------------------------------------------------------------------

def test_a_strict_writer_refuses_a_field_the_model_does_not_name_and_a_run_writer_keeps_it(tmp_path, monkeypatch):
    monkeypatch.delenv("HARNESS_HISTORY_STRICT", raising=False)
    strict = HistoryWriter(tmp_path / "strict.jsonl", strict=True)
    strict.append("note", message="fine", seed=7)
    with pytest.raises(ValueError, match="surprise"):
        strict.append("note", message="x", surprise=1)
    strict.close()
    lenient = HistoryWriter(tmp_path / "run.jsonl")
    assert not lenient.strict
    lenient.append("note", message="x", surprise=1)
    lenient.close()
    assert History.load(tmp_path / "run.jsonl").events[0]["surprise"] == 1
    monkeypatch.setenv("HARNESS_HISTORY_STRICT", "1")
    assert HistoryWriter(tmp_path / "env.jsonl").strict


def test_unit_tests_write_histories_strictly(tmp_path):
    """tests/unit/conftest.py turns the strict writer on for every unit test."""
    with HistoryWriter(tmp_path / "h.jsonl") as h, pytest.raises(ValueError):
        h.append("phase", name="heal", surprise=True)


def test_a_strict_writers_lines_validate(tmp_path):
    with HistoryWriter(tmp_path / "h.jsonl", strict=True) as h:
        h.append("invoke", op="u1", f="upload", kind="good", retry_of=None)
        h.append("ok", op="u1", f="upload", status=202, attachment_id="a", job_id="j")
        h.append("fault", action="kill", phase="start", fault=0, role="worker", pid=12)
    assert not invalid_lines(tmp_path / "h.jsonl")


# --- every writer in the code names only modelled fields -------------------------------------------------------------

def unmodelled_fields(source: str, where: str) -> list[str]:
    """Each ``<x>.append("<type>", field=...)`` (or append_if_open / _record) of a known type naming a field its model
    does not; a call whose type is a variable (``append(kind, ...)``) must name fields some model names."""
    any_model = set().union(*(events.fields_of(t) for t in events.MODELS))
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in WRITER_METHODS and node.args):
            continue
        first = node.args[0]
        names = [k.arg for k in node.keywords if k.arg is not None]
        if isinstance(first, ast.Constant) and first.value in events.MODELS:
            out += [f"{where}:{node.lineno} {first.value}.{n}" for n in events.unknown_fields(first.value, names)]
        elif isinstance(first, ast.Name) and names and {"op", "f"} <= set(names):  # an operation's outcome
            out += [f"{where}:{node.lineno} ?.{n}" for n in names if n not in any_model]
    return out


def test_every_append_call_in_harness_chaos_and_load_names_modelled_fields():
    found, calls = [], 0
    for folder in ("harness", "chaos", "load"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            calls += source.count('.append("')
            found += unmodelled_fields(source, str(path.relative_to(ROOT)))
    assert calls > 100  # the scan read the writers
    assert not found, "add these fields to harness/events.py and regenerate the schema: " + ", ".join(found)


def test_the_call_scan_finds_an_unmodelled_field():
    source = ('self.history.append("fault", action="kill", phase="start", surprise=1)\n'
              'ctx.history.append(kind, op="r1", f="replay", nonsense=2)\n'
              'rows.append("fault")\n')
    assert unmodelled_fields(source, "x.py") == ["x.py:1 fault.surprise", "x.py:2 ?.nonsense"]
