"""The CI recipes in docs/ci/ (quoted by docs/CI.md) stay correct as the harness changes.

- the GitHub Actions workflow passes actionlint (the version scripts/bootstrap.sh pins and builds into .tools/bin);
- the GitLab job has what GitLab needs to show and keep a grade: a script, artifacts kept always, and a JUnit
  report that matches the junit.xml a grade writes (and not the per-scenario ones below it);
- every `harness ...` command in both files parses with the harness's own parser (`harness.cli.build_parser()`),
  so renaming or retyping a flag breaks this test instead of a team's CI;
- where the recipes overlap with what this repository runs itself (`make grade`, and `.ci/run` through
  scripts/bootstrap.sh), they use the same flags, level, Debian packages and Toxiproxy version.
- docs/CI.md quotes both files verbatim.

Nothing here starts a service.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest
import yaml

from harness.cli import build_parser

REPO = Path(__file__).resolve().parents[3]
CI_DIR = REPO / "docs" / "ci"
GITHUB = CI_DIR / "github-actions.yml"
GITLAB = CI_DIR / "gitlab-ci.yml"
ACTIONLINT = REPO / ".tools" / "bin" / "actionlint"
BOOTSTRAP = REPO / "scripts" / "bootstrap.sh"
# The Debian packages whose servers the harness's stack runs (PostgreSQL; RabbitMQ with its Erlang and epmd).
SERVICE_PACKAGES = {"postgresql", "rabbitmq-server"}

# Tokens after which a new shell command starts (shlex with punctuation_chars splits the operators off).
COMMAND_START = {";", ";;", "&&", "||", "|", "&", "(", ")", "{", "!", "then", "do", "else", "elif", "if", "while",
                 "until", "time"}
COMMAND_END = {";", ";;", "&&", "||", "|", "&", ")", "}"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
# `${{ inputs.seed || '4242' }}`: a GitHub expression whose value, when nothing is given, is the literal after ||.
EXPRESSION_DEFAULT = re.compile(r"^\$\{\{.*\|\|\s*'([^']*)'\s*\}\}$")
GITLAB_KEYWORDS = {"default", "include", "stages", "variables", "workflow", "image", "services", "cache",
                   "before_script", "after_script"}


# --- reading the recipes --------------------------------------------------------------------------------------------

def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path}: not a YAML mapping"
    return data


def literal_env(mapping: dict | None) -> dict[str, str | None]:
    """Environment entries as a shell would see them when nothing is overridden (None: cannot tell)."""
    out: dict[str, str | None] = {}
    for name, value in (mapping or {}).items():
        if isinstance(value, dict):  # GitLab's {value: ..., description: ...}
            value = value.get("value")
        text = None if value is None else str(value)
        if text is not None and "${{" in text:
            default = EXPRESSION_DEFAULT.match(text.strip())
            text = default.group(1) if default else None
        out[str(name)] = text
    return out


def github_scripts() -> list[tuple[str, str, dict]]:
    """(where, script, env) for every `run:` step of the workflow."""
    workflow = load(GITHUB)
    out = []
    for job_name, job in workflow["jobs"].items():
        for index, step in enumerate(job.get("steps") or []):
            if "run" in step:
                env = {**literal_env(workflow.get("env")), **literal_env(job.get("env")), **literal_env(step.get("env"))}
                out.append((f"{GITHUB.name} jobs.{job_name}.steps[{index}] ({step.get('name', '')})", step["run"], env))
    return out


def gitlab_jobs() -> dict[str, dict]:
    pipeline = load(GITLAB)
    return {name: job for name, job in pipeline.items()
            if name not in GITLAB_KEYWORDS and not str(name).startswith(".") and isinstance(job, dict)
            and "script" in job}


def gitlab_scripts() -> list[tuple[str, str, dict]]:
    """(where, script, env) per job: before_script and script run in one shell, as GitLab runs them."""
    pipeline = load(GITLAB)
    out = []
    for name, job in gitlab_jobs().items():
        lines = [*job.get("before_script", pipeline.get("before_script", [])), *job["script"]]
        env = {**literal_env(pipeline.get("variables")), **literal_env(job.get("variables"))}
        out.append((f"{GITLAB.name} {name}", "\n".join(lines), env))
    return out


def harness_commands(script: str) -> list[list[str]]:
    """The argument lists of every `harness ...` (or `python -m harness ...`) command in a shell script."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        at_start = True
        for i, token in enumerate(tokens):
            argv_from = None
            if at_start and (token == "harness" or token.endswith("/harness")):
                argv_from = i + 1
            elif at_start and Path(token).name.startswith("python") and tokens[i + 1:i + 3] == ["-m", "harness"]:
                argv_from = i + 3
            if argv_from is not None:
                argv = []
                for arg in tokens[argv_from:]:
                    if arg in COMMAND_END or arg[0] in "<>":
                        if argv and argv[-1].isdigit() and arg[0] in "<>":
                            argv.pop()  # 2>file: the fd belongs to the redirection
                        break
                    argv.append(arg)
                commands.append(argv)
            at_start = token in COMMAND_START or (at_start and bool(ASSIGNMENT.match(token)))
    return commands


def expand(argv: list[str], env: dict[str, str | None], where: str) -> list[str]:
    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if env.get(name) is None:
            pytest.fail(f"{where}: `harness {' '.join(argv)}` uses ${name}, which the recipe does not set to a "
                        "literal value (or a GitHub expression with a literal default)")
        return env[name]

    return [VARIABLE.sub(value, arg) for arg in argv]


def parse(argv: list[str], where: str, capsys):
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        problem = capsys.readouterr().err.strip().splitlines()[-1:]
    pytest.fail(f"{where}: `harness {' '.join(argv)}` does not parse with harness.cli.build_parser(): "
                f"{' '.join(problem)}")


def recipe_commands(capsys) -> dict[str, dict[tuple[str, ...], list[tuple[list[str], object]]]]:
    """recipe file -> command path (("grade",), ("adapter", "check"), ...) -> [(argv, parsed args)]."""
    out: dict[str, dict] = {}
    for file, scripts in ((GITHUB.name, github_scripts()), (GITLAB.name, gitlab_scripts())):
        found = out.setdefault(file, {})
        for where, script, env in scripts:
            for argv in harness_commands(script):
                argv = expand(argv, env, where)
                args = parse(argv, where, capsys)
                path = (args.command,) + ((args.adapter_action,) if args.command == "adapter" else ())
                found.setdefault(path, []).append((argv, args))
    return out


def options(argv: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}


# --- (a) actionlint -------------------------------------------------------------------------------------------------

def test_github_workflow_passes_actionlint():
    pinned = re.search(r'^ACTIONLINT_VERSION="([^"]+)"', BOOTSTRAP.read_text(), re.M)
    assert pinned, "scripts/bootstrap.sh pins no ACTIONLINT_VERSION"
    assert ACTIONLINT.is_file(), f"{ACTIONLINT} is missing: run bash scripts/bootstrap.sh (it builds actionlint)"
    version = subprocess.run([str(ACTIONLINT), "-version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.splitlines()[0].strip() == pinned.group(1), (
        f"{ACTIONLINT} is {version.stdout.splitlines()[0]!r}, bootstrap pins {pinned.group(1)}: "
        "run bash scripts/bootstrap.sh")
    done = subprocess.run([str(ACTIONLINT), "-no-color", str(GITHUB)], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, f"actionlint {GITHUB}:\n{done.stdout}{done.stderr}"


# --- (b) the GitLab job's structure, and the reports both recipes publish -------------------------------------------

def grade_junit(tmp_path: Path, reports: str) -> tuple[PurePosixPath, PurePosixPath]:
    """(the grade's junit.xml, one scenario's junit.xml) as `harness grade --reports REPORTS` names them, relative to
    the job's working folder: a grade of no scenario writes its report folder without starting any service."""
    from harness import adapter as adapter_mod
    from harness.grade import grade

    adapter = adapter_mod.load(str(REPO / "examples" / "go-pipeline" / "adapter.toml"))
    _, grade_dir = grade(adapter, 4, 4242, only=["no-such-scenario"], stack=object(),
                         reports_dir=tmp_path / reports, progress=lambda *_: None)
    junit = grade_dir / "junit.xml"
    assert junit.is_file(), f"a grade wrote no {junit}"
    relative = PurePosixPath(junit.relative_to(tmp_path).as_posix())
    return relative, relative.parent / "window-s3-commit-failpoint" / "junit.xml"


def the_grade(capsys, file: str) -> tuple[list[str], object]:
    grades = recipe_commands(capsys)[file].get(("grade",), [])
    assert len(grades) == 1, f"{file}: expected one `harness grade` command, found {[g[0] for g in grades]}"
    return grades[0]


def reports_folder(args) -> str:
    return (args.reports or "reports/runs").rstrip("/")


def covers(paths: list[str], folder: str) -> bool:
    return any(folder == p.rstrip("/") or folder.startswith(p.rstrip("/") + "/") for p in paths)


def test_gitlab_job_keeps_and_publishes_the_grade(capsys, tmp_path):
    jobs = gitlab_jobs()
    assert len(jobs) == 1, f"{GITLAB}: expected one job with a script, found {sorted(jobs)}"
    (name, job), = jobs.items()
    assert isinstance(job["script"], list) and job["script"], f"{name}: script must be a non-empty list"
    artifacts = job.get("artifacts") or {}
    assert artifacts.get("when") == "always", f"{name}: artifacts:when must be always (keep reports of a failure)"
    _, args = the_grade(capsys, GITLAB.name)
    reports = reports_folder(args)
    assert covers(artifacts.get("paths") or [], reports), f"{name}: artifacts:paths must keep {reports}/"
    junit = (artifacts.get("reports") or {}).get("junit")
    assert isinstance(junit, str), f"{name}: artifacts:reports:junit must name the grade's junit.xml"
    written, per_scenario = grade_junit(tmp_path, reports)
    assert written.match(junit) and junit.startswith(reports + "/"), (
        f"{name}: artifacts:reports:junit {junit!r} does not match the grade's {written}")
    assert not per_scenario.match(junit), f"{name}: {junit!r} would also publish every scenario's junit.xml twice"


def test_github_workflow_keeps_and_publishes_the_grade(capsys, tmp_path):
    workflow = load(GITHUB)
    steps = [step for job in workflow["jobs"].values() for step in job.get("steps") or []]
    _, args = the_grade(capsys, GITHUB.name)
    reports = reports_folder(args)
    written, per_scenario = grade_junit(tmp_path, reports)

    uploads = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert uploads, "the workflow keeps no artifact"
    assert all(s.get("if") == "always()" for s in uploads), "artifacts must be kept on failure too: if: always()"
    assert any(covers(str(s["with"]["path"]).split(), reports) for s in uploads), f"no artifact keeps {reports}/"

    reporters = [s for s in steps if str(s.get("uses", "")).startswith("EnricoMi/publish-unit-test-result-action@")]
    assert len(reporters) == 1 and reporters[0].get("if") == "always()", "one JUnit reporter step, if: always()"
    files = str(reporters[0]["with"]["files"])
    assert written.match(files) and files.startswith(reports + "/"), f"reporter files {files!r} miss {written}"
    assert not per_scenario.match(files), f"reporter files {files!r} would count every scenario twice"

    summaries = [s for s in steps if "GITHUB_STEP_SUMMARY" in str(s.get("run", ""))]
    assert summaries and all(s.get("if") == "always()" for s in summaries), "a step summary, if: always()"
    assert any("summary.md" in s["run"] for s in summaries), "the step summary shows the grade's summary.md"


# --- (c) every harness command parses with the harness's own parser -------------------------------------------------

@pytest.mark.parametrize("file", [GITHUB.name, GITLAB.name])
def test_every_harness_command_parses(capsys, file):
    found = recipe_commands(capsys)[file]  # parse() fails the test on the first command that does not parse
    assert ("adapter", "check") in found and ("grade",) in found, (
        f"{file}: needs `harness adapter check` then `harness grade`, found {sorted(found)}")
    (check_argv, check), = found[("adapter", "check")]
    grade_argv, grade = the_grade(capsys, file)
    assert grade.level == 4, f"{file}: grades at level {grade.level}, not 4: {grade_argv}"
    assert isinstance(grade.seed, int), f"{file}: the grade needs an explicit --seed: {grade_argv}"
    assert grade.sut == check.file, f"{file}: `adapter check {check.file}` checks another file than the grade's --sut"
    assert not grade.only, f"{file}: a CI grade must run every scenario (no --only)"


# --- (d) the same flags as this repository's own commands, where they overlap ---------------------------------------

def make_commands(target: str) -> list[list[str]]:
    """`harness` commands that `make TARGET` runs, expanded by make itself (-n: print, run nothing)."""
    make = shutil.which("make")
    assert make, "make is required (the README's two commands are make targets)"
    env = {k: v for k, v in os.environ.items()
           if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "LEVEL", "SEED"}}
    done = subprocess.run([make, "-n", target, "SEED=4242"], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return harness_commands(done.stdout)


def test_recipes_use_make_grades_flags_and_ci_runs_toolchain(capsys):
    ours = make_commands("grade") + harness_commands((REPO / ".ci" / "run").read_text())
    assert ours, "`make -n grade` shows no harness command"
    ours_parsed = []
    for argv in ours:
        args = parse(argv, "make grade / .ci/run", capsys)
        ours_parsed.append(((args.command,) + ((args.adapter_action,) if args.command == "adapter" else ()), argv, args))
    recipes = recipe_commands(capsys)
    overlapping = 0
    for file, found in recipes.items():
        for path, argv, args in ours_parsed:
            for recipe_argv, recipe_args in found.get(path, []):
                overlapping += 1
                missing = options(argv) - options(recipe_argv)
                assert not missing, (f"{file}: `harness {' '.join(recipe_argv)}` lacks {sorted(missing)}, which "
                                     f"`{' '.join(argv)}` (make grade / .ci/run) passes")
                if path == ("grade",):
                    assert recipe_args.level == args.level, (
                        f"{file}: grades at level {recipe_args.level}, make grade at {args.level}")
    assert overlapping >= len(recipes), "no recipe command overlaps with `make grade`"

    # .ci/run installs through scripts/bootstrap.sh: the recipes install the same service packages and Toxiproxy.
    bootstrap = BOOTSTRAP.read_text()
    toxiproxy = re.search(r'^TOXIPROXY_VERSION="([^"]+)"', bootstrap, re.M).group(1)
    packages = SERVICE_PACKAGES
    assert packages <= set(re.findall(r"need_apt\+=\((\S+)\)", bootstrap)), (
        f"scripts/bootstrap.sh no longer installs {sorted(packages)}: update the recipes and this test together")
    for path in (GITHUB, GITLAB):
        text = path.read_text()
        assert f"go install github.com/Shopify/toxiproxy/v2/cmd/server@{toxiproxy}" in text, (
            f"{path.name}: Toxiproxy must be the version scripts/bootstrap.sh builds ({toxiproxy})")
        installs = [line for line in text.splitlines() if "apt-get install" in line]
        assert any(packages <= set(line.split()) for line in installs), (
            f"{path.name}: apt-get install must name {sorted(packages)}")


# --- docs/CI.md shows exactly these files ---------------------------------------------------------------------------

def test_ci_page_quotes_both_recipes_verbatim():
    page = (REPO / "docs" / "CI.md").read_text(encoding="utf-8")
    for path in (GITHUB, GITLAB):
        assert f"```yaml\n{path.read_text(encoding='utf-8')}```" in page, (
            f"docs/CI.md must quote {path.relative_to(REPO)} verbatim in a ```yaml block (paste the file again)")
