"""The type gate `make test` runs (Makefile `lint`): mypy over the files [tool.mypy] lists, strict on the checkers, the
history and the fault context — and only there: strictness must not leak to the modules not yet typed (their errors
would fail every run) nor be lost for the ones that are (a checker without annotations would pass)."""

import re
import tomllib
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[2]
STRICT_MODULES = {"harness.checkers", "harness.checkers.*", "harness.history", "chaos.context"}
STRICT_FILES = {"harness/checkers", "harness/history.py", "chaos/context.py"}
# What `mypy --strict` turns on that can be set per module (mypy 2.4; warn_unused_configs and warn_redundant_casts
# are global only).
STRICT_FLAGS = {
    "disallow_any_generics", "disallow_subclassing_any", "disallow_untyped_calls", "disallow_untyped_defs",
    "disallow_incomplete_defs", "check_untyped_defs", "disallow_untyped_decorators", "warn_unused_ignores",
    "warn_return_any", "strict_equality", "extra_checks",
}


def mypy_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]


def test_make_lint_runs_mypy_over_the_configured_files_and_make_test_lints_first():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    lint = re.search(r"^lint:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert lint, "no lint target in the Makefile"
    commands = [line.split("#", 1)[0].split() for line in lint.group(1).splitlines()]
    assert [".venv/bin/mypy"] in commands, f"lint must run mypy with no paths (the files of [tool.mypy]): {commands}"
    assert re.search(r"^test:.*\blint\b", makefile, re.M), "make test must depend on lint"


def test_the_strict_modules_are_checked_with_every_strict_flag():
    config = mypy_config()
    assert STRICT_FILES <= set(config["files"])
    assert "strict" not in config, "a global strict would apply to every module the gate reads"
    blocks = [b for b in config.get("overrides", []) if STRICT_MODULES & set(b["module"])]
    assert len(blocks) == 1 and STRICT_MODULES <= set(blocks[0]["module"]), blocks
    block = blocks[0]
    assert "strict" not in block, "strict = true in an override block turns strict on for every module"
    assert not block.get("ignore_errors")
    missing = sorted(flag for flag in STRICT_FLAGS if block.get(flag) is not True)
    assert not missing, f"strict flags not set for the strict modules: {missing}"
    assert block.get("implicit_reexport") is False


def test_the_gate_fails_an_untyped_checker_and_leaves_an_untyped_module_elsewhere_alone(tmp_path):
    source = "def double(x):\n    return x * 2\n"
    for package in ("harness/checkers", "harness/other"):
        for part in (tmp_path / package, (tmp_path / package).parent):
            part.mkdir(parents=True, exist_ok=True)
            (part / "__init__.py").touch()
        (tmp_path / package / "probe.py").write_text(source, encoding="utf-8")
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
                                "--no-error-summary", str(tmp_path / "harness/checkers/probe.py"),
                                str(tmp_path / "harness/other/probe.py")])
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1, (out, err)
    assert errors and all("harness/checkers/probe.py" in line and "[no-untyped-def]" in line for line in errors), out
