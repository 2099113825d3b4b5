"""Facts the docs take from the code stay true as the code changes:

- every `harness …` command in a code block of the docs parses with the harness's own parser, and every scenario it
  names exists;
- every scenario named in backticks in CONTRACT.md and the guides exists in the catalogue;
- the adapter file shown in CONTRACT §9 validates against schemas/adapter.schema.json (keys the harness knows);
- counts quoted for the Go example's grade ("31 scenarios run, 14 skipped") are what the catalogue plans for it;
- the checklist size CONTRACT §11 quotes is the checklist's;
- the outputs the guides show (a `harness scenarios` listing, a grade's first line) are what the code prints, the
  TypeScript example's grade size is the catalogue's, every adapter file or part in a toml block validates against
  the adapter schema, every `--flag` quoted is an option of the tool that takes it, and the glossary keeps its terms.

Nothing here starts a service.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from harness import adapter as adapter_mod
from harness.checklist import ITEMS
from harness.cli import build_parser
from harness.scenarios import catalogue, for_grade
from harness.schemas import errors

REPO = Path(__file__).resolve().parents[3]
DOCS = sorted([*(REPO / "docs").rglob("*.md"), REPO / "README.md", *REPO.glob("examples/*/README.md"),
               REPO / "reference" / "README.md"])
GO_ADAPTER = REPO / "examples" / "go-pipeline" / "adapter.toml"
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
SCENARIO_NAMES = {s.name for s in catalogue()}


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def harness_commands():
    """(doc, line, argv) of every `harness …` command in a fenced code block of the docs."""
    out = []
    for doc in DOCS:
        for block in FENCE.findall(doc.read_text(encoding="utf-8")):
            for line in block.splitlines():
                line = line.split(" # ", 1)[0].strip().rstrip("\\").strip()
                for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
                    words = part.split()
                    if not words or not re.fullmatch(r"(?:\S*/)?harness", words[0]):
                        continue
                    if any(mark in part for mark in ("<", "…", "...", "$", "{")):
                        continue  # a placeholder, not a command to run as is
                    try:
                        argv = shlex.split(part)
                    except ValueError:
                        continue
                    out.append((rel(doc), line, argv[1:]))
    return out


COMMANDS = harness_commands()


def test_the_docs_show_harness_commands():
    assert len(COMMANDS) > 10


@pytest.mark.parametrize("doc, line, argv", COMMANDS, ids=[f"{d}:{' '.join(a)[:60]}" for d, _, a in COMMANDS])
def test_every_documented_command_parses(doc, line, argv):
    parser = build_parser()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code != 0:  # --help exits 0
                pytest.fail(f"{doc}: `{line}` does not parse: {err.getvalue().strip()}")
            return
    scenario = getattr(args, "scenario", None)
    if isinstance(scenario, str) and argv[0] == "run":
        assert scenario in SCENARIO_NAMES, f"{doc}: `{line}` names no scenario of the catalogue"


def test_every_scenario_the_contract_and_guides_name_exists():
    suffixes = ("-failpoint", "-sigkill")
    stems = {n.rsplit("-", 1)[0] for n in SCENARIO_NAMES if n.endswith(suffixes)}
    missing = []
    for doc in [REPO / "docs" / "CONTRACT.md", REPO / "docs" / "HARNESS.md", *(REPO / "docs" / "guides").glob("*.md")]:
        for name in set(re.findall(r"`([a-z][a-z0-9]*(?:-[a-z0-9]+){1,5})`", doc.read_text(encoding="utf-8"))):
            looks_like_scenario = any(name.startswith(p) for p in ("window-", "expiry-", "pipeline-", "batch-",
                                                                    "poison-", "dead-letter", "clock-skew",
                                                                    "lease-", "worker-", "retry-", "prefetch-",
                                                                    "permuted-", "concurrent-", "redelivery-",
                                                                    "stale-", "backlog-", "cluster-", "database-",
                                                                    "broker-", "s3-", "hostile-", "slow-",
                                                                    "unparseable-", "network-"))
            if looks_like_scenario and name not in SCENARIO_NAMES and name not in stems and name != "window-…":
                missing.append(f"{rel(doc)}: {name}")
    assert not missing, missing


def test_the_contracts_adapter_example_uses_only_known_keys():
    text = (REPO / "docs" / "CONTRACT.md").read_text(encoding="utf-8")
    section = text.split("## 9. The adapter file", 1)[1].split("## 10.", 1)[0]
    example = next(b for b in FENCE.findall(section) if "adapter_version" in b)
    raw = tomllib.loads(example)
    assert errors("adapter.schema.json", raw) == []


def go_plan(level: int) -> tuple[int, int]:
    chosen, skipped = for_grade(catalogue(), adapter_mod.load(GO_ADAPTER), level)
    return len(chosen), len(skipped)


def test_the_go_examples_grade_size_quoted_in_the_docs_is_the_catalogues():
    run4, skipped4 = go_plan(4)
    quoted = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"at level 4: (\d+) scenarios run, (\d+) skipped", text):
            quoted.append((rel(doc), int(m.group(1)), int(m.group(2))))
        for m in re.finditer(r"Go example: (\d+) scenarios, (\d+) skipped", text):
            quoted.append((rel(doc), int(m.group(1)), int(m.group(2))))
        for m in re.finditer(r"Go\s+example's level-4 grade runs (\d+) scenarios", text):
            quoted.append((rel(doc), int(m.group(1)), skipped4))
    assert quoted, "the docs quote the Go example's grade size somewhere"
    wrong = [q for q in quoted if (q[1], q[2]) != (run4, skipped4)]
    assert not wrong, f"the catalogue plans {run4} run, {skipped4} skipped for the Go example at level 4: {wrong}"


def test_the_checklist_size_the_contract_quotes_is_the_checklists():
    text = (REPO / "docs" / "CONTRACT.md").read_text(encoding="utf-8")
    m = re.search(r"the checklist: (\d+) rows", text)
    assert m and int(m.group(1)) == len([i for i in ITEMS if i.level <= 4])


# --- outputs the guides show, and the TypeScript example's grade size ------------------------------------------

TS_ADAPTER = REPO / "examples" / "ts-pipeline" / "adapter.toml"
ADAPTERS_BY_SUT = {"my-pipeline/adapter.toml": GO_ADAPTER, "examples/go-pipeline/adapter.toml": GO_ADAPTER,
                   "examples/ts-pipeline/adapter.toml": TS_ADAPTER}
FENCED = re.compile(r"```([a-z]*)\n(.*?)```", re.S)


def shown_outputs(command: str):
    """(doc, argv, output) for every fenced block holding one `harness COMMAND …` line and followed by a plain
    fenced block (the output the doc shows for it)."""
    out = []
    for doc in DOCS:
        blocks = FENCED.findall(doc.read_text(encoding="utf-8"))
        for (_, first), (lang, second) in zip(blocks, blocks[1:]):
            lines = [ln.strip() for ln in first.strip().splitlines()]
            if len(lines) == 1 and lang == "" and re.match(rf"^(?:\S*/)?harness {command}\b", lines[0]):
                out.append((rel(doc), shlex.split(lines[0].split(" # ", 1)[0])[1:], second))
    return out


def test_every_scenario_listing_the_docs_show_is_what_the_command_prints(capsys):
    from harness.cli import main

    shown = shown_outputs("scenarios")
    assert shown, "the guides show a `harness scenarios` listing"
    for doc, argv, output in shown:
        capsys.readouterr()
        assert main(argv) == 0
        printed = [ln.rstrip() for ln in capsys.readouterr().out.strip().splitlines()]
        assert [ln.rstrip() for ln in output.strip().splitlines()] == printed, f"{doc}: `harness {' '.join(argv)}`"


def test_every_grade_line_the_docs_show_is_the_plans():
    """`grading NAME at level L, seed S: A scenarios, B skipped` after a `harness grade --sut …` command: what the
    grade plans for that adapter (with its --only)."""
    from harness.grade import plan

    checked = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"harness grade --sut (\S+)((?: --\S+ \S+)*)\n```\s*```\n"
                             r"grading \S+ at level (\d), seed \d+: (\d+) scenarios, (\d+) skipped", text):
            sut, flags, level, run, skipped = m.groups()
            options = dict(re.findall(r"--(\S+) (\S+)", flags))
            path = next(p for suffix, p in ADAPTERS_BY_SUT.items() if sut.endswith(suffix))
            only = options["only"].split(",") if "only" in options else None
            chosen, skipped_entries, _, _ = plan(adapter_mod.load(path), int(level), only)
            checked.append(rel(doc))
            assert (int(run), int(skipped)) == (len(chosen), len(skipped_entries)), (
                f"{rel(doc)}: the docs show {run} run, {skipped} skipped; the plan: {len(chosen)}, "
                f"{len(skipped_entries)}")
    assert checked, "the adapter guide shows a grade's first line"


def test_the_typescript_examples_grade_size_quoted_in_its_readme_is_the_catalogues():
    chosen, skipped = for_grade(catalogue(), adapter_mod.load(TS_ADAPTER), 4)
    text = (REPO / "examples" / "ts-pipeline" / "README.md").read_text(encoding="utf-8")
    quoted = [int(n) for n in re.findall(r"(\d+) scenarios in \d+ s", text)]
    assert quoted, "the README quotes the measured grade's size"
    assert set(quoted) == {len(chosen)}, f"the catalogue plans {len(chosen)} scenarios for the TypeScript example"


GLOSSARY_TERMS = ["tenant", "tap", "firehose", "nemesis", "exercised", "@producers", "@consumers", "track 5",
                  "approximate / exact window", "seed", "adapter", "unknown", "vocabulary"]


def test_the_glossary_defines_the_words_the_docs_use_without_explaining():
    text = (REPO / "docs" / "GLOSSARY.md").read_text(encoding="utf-8")
    defined = re.findall(r"^\*\*([^*]+)\*\*", text, re.M)
    missing = [t for t in GLOSSARY_TERMS if not any(t in d for d in defined)]
    assert not missing, f"docs/GLOSSARY.md defines no entry for {missing}"
    seed = text.split("**seed**", 1)[1].split("\n\n", 1)[0]
    assert "random seed" in seed and "requirement documents" in seed, "both meanings of 'seed'"


def toml_blocks():
    """(doc, line, text) of every ```toml block of the docs: adapter files or parts of one."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"```toml\n(.*?)```", text, re.S):
            out.append((rel(doc), text[:m.start()].count("\n") + 1, m.group(1)))
    return out


TOML_BLOCKS = toml_blocks()


def merged(base: dict, part: dict) -> dict:
    out = dict(base)
    for key, value in part.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


@pytest.mark.parametrize("doc, line, text", TOML_BLOCKS, ids=[f"{d}:{n}" for d, n, _ in TOML_BLOCKS])
def test_every_adapter_file_or_part_the_docs_show_uses_keys_the_schema_knows(doc, line, text):
    """A whole adapter (it has adapter_version) validates as it is; a part validates once put into the reference's
    adapter (each table the part shows replaces or extends the reference's)."""
    part = tomllib.loads(text)
    raw = part if "adapter_version" in part else merged(
        tomllib.loads((REPO / "reference" / "adapter.toml").read_text(encoding="utf-8")), part)
    assert errors("adapter.schema.json", raw) == [], f"{doc}:{line}"


def test_the_docs_show_adapter_parts():
    assert len(TOML_BLOCKS) >= 10 and any("adapter_version" in t for _, _, t in TOML_BLOCKS)


# Flags of other tools the docs quote: a container runtime's and useradd's.
OTHER_TOOLS_FLAGS = {"--privileged", "--system"}


def parser_flags(parser) -> set[str]:
    import argparse

    flags = set()
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= parser_flags(sub)
    return flags


def test_every_flag_the_docs_quote_is_an_option_of_the_tool_that_takes_it():
    """A `--flag` in backticks anywhere in the docs is an option of the harness, of the reference's CLI, of the test
    suite (tests/conftest.py), or one of the few other tools' flags listed above: a renamed or removed option
    cannot stay documented."""
    from reference.cli import build_parser as reference_parser

    conftest = (REPO / "tests" / "conftest.py").read_text(encoding="utf-8")
    known = (parser_flags(build_parser()) | parser_flags(reference_parser())
             | set(re.findall(r"addoption\(\"(--[a-z0-9-]+)\"", conftest)) | OTHER_TOOLS_FLAGS)
    unknown = []
    for doc in DOCS:
        for span in re.findall(r"`([^`\n]+)`", doc.read_text(encoding="utf-8")):
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", span):
                if flag not in known:
                    unknown.append(f"{rel(doc)}: {flag}")
    assert not unknown, unknown
    assert "--only" in known and "--seed" in known  # the parsers were walked


def test_every_checklist_size_the_docs_quote_is_the_checklists():
    rows = len([i for i in ITEMS if i.level <= 4])
    level5 = len([i for i in ITEMS if i.level == 5])
    words = {"three": 3, "four": 4, "two": 2}
    quoted = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"\b(\d+) (?:verification items|checklist rows|rows for levels 3 and 4|items\s+over "
                             r"BE-JOB|rows, `BE-JOB)", text):
            quoted.append((rel(doc), int(m.group(1)), rows))
        for m in re.finditer(r"\b(two|three|four|\d+) (?:more for level 5|level-5 rows)", text):
            quoted.append((rel(doc), int(words.get(m.group(1), m.group(1))), level5))
    assert len(quoted) >= 5, quoted
    wrong = [q for q in quoted if q[1] != q[2]]
    assert not wrong, f"the checklist has {rows} rows for levels 3-4 and {level5} for level 5: {wrong}"
