"""Every broken variant (tests/broken/*/main.py) patches a name in a module whose own code looks it up, so the patch
changes the code that runs.

A variant monkeypatches one behaviour of the reference by assignment: ``module.name = replacement`` or
``module.Class.attribute = replacement``. Python looks a module-level name up in the module whose code uses it: a
replacement assigned to a name another module merely imports (``from reference.x import name``, a re-export) changes
nothing the reference runs, and the variant silently grades as the reference. This happened to be a live risk when
reference/worker.py was split into worker_session.py / worker_jobs.py / worker_render.py: ``worker._settle`` and
``worker.queries`` were patched in worker.py while the code calling them moved.

Checked from the variants' source (ast), with the reference modules imported: for every assignment (and
``setattr(module, "name", ...)``) whose target starts at a reference module bound by an import:
- ``module.name = ...``: some code of the reference looks the binding up at run time — the module's own code reads
  ``name`` (defined there or imported there: patching the worker's own binding of ``queries`` on purpose, leaving
  the API's alone, is right), or another module reads ``module.name`` as an attribute or imports it inside a
  function (``from reference.api.app import create_app`` in the CLI runs after the patch);
- ``module.Class.attribute = ...``: the class object is shared by every module, so it only has to resolve
  (``Class`` reachable from the module, ``attribute`` an existing attribute of it, not a new one).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BROKEN = Path(__file__).resolve().parents[2] / "broken"
VARIANTS = sorted(BROKEN.glob("*/main.py"))


def reference_modules(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted module, for imports that bind a module of the reference."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("reference.") and alias.asname:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "reference":
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                try:
                    importlib.import_module(dotted)
                except ImportError:
                    continue  # a function or class imported from a module, not a module
                bound[alias.asname or alias.name] = dotted
    return bound


def looked_up(module_name: str) -> set[str]:
    """Names a module's own code reads (``ast.Name`` in a load context): what a patch of the module's binding
    reaches. An import alone, or a definition nobody in the module calls, is not a lookup."""
    module = importlib.import_module(module_name)
    tree = ast.parse(Path(module.__file__).read_text())
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


REFERENCE = Path(__file__).resolve().parents[3] / "reference"


def read_elsewhere(module_name: str, name: str) -> bool:
    """True when another module of the reference reads ``module.name`` at run time: as an attribute of the module
    (``topology.declare(...)``) or by an import inside a function (executed after a variant's patch)."""
    package, _, leaf = module_name.rpartition(".")
    for path in REFERENCE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == package:
                aliases.update(a.asname or a.name for a in node.names if a.name == leaf)
            elif isinstance(node, ast.Import):
                aliases.update(a.asname for a in node.names if a.name == module_name and a.asname)
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and isinstance(node.ctx, ast.Load)):
                return True
            if (isinstance(node, ast.ImportFrom) and node.module == module_name and id(node) not in top_level
                    and any(a.name == name for a in node.names)):
                return True
    return False


def chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def patches(source: str) -> list[tuple[int, list[str]]]:
    """(line, [module alias, name, attribute...]) of every patch a variant's source makes."""
    tree = ast.parse(source)
    found: list[tuple[int, list[str]]] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            parts = chain(target)
            if parts and len(parts) >= 2:
                found.append((node.lineno, parts))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            parts = chain(node.args[0])
            if parts:
                found.append((node.lineno, [*parts, str(node.args[1].value)]))
    return found


def wrong_patch_targets(source: str) -> list[str]:
    """Each patch of a reference module's name that does not change the code that runs, said in words."""
    bound = reference_modules(ast.parse(source))
    problems = []
    for line, parts in patches(source):
        if parts[0] not in bound:
            continue
        module_name, name = bound[parts[0]], parts[1]
        module = importlib.import_module(module_name)
        if len(parts) == 2 and name not in looked_up(module_name) and not read_elsewhere(module_name, name):
            where = getattr(getattr(module, name, None), "__module__", None)
            problems.append(f"line {line}: {module_name}.{name} is never looked up, neither by {module_name}'s own code nor as an attribute elsewhere"
                            + (f" (it is defined in {where}: patch it where it is used)" if where else ""))
            continue
        if not hasattr(module, name):
            problems.append(f"line {line}: {module_name} has no {name}")
            continue
        target = getattr(module, name)
        for attribute in parts[2:-1]:
            if not hasattr(target, attribute):
                problems.append(f"line {line}: {'.'.join(parts)}: no attribute {attribute}")
                break
            target = getattr(target, attribute)
        else:
            if len(parts) > 2 and isinstance(target, type) and not hasattr(target, parts[-1]):
                problems.append(f"line {line}: {'.'.join(parts)}: {target.__name__} has no {parts[-1]} to replace")
    return problems


def missing_names(source: str) -> list[str]:
    """Each ``module.name`` a variant reads (calls, wraps) that the reference module does not have."""
    bound = reference_modules(ast.parse(source))
    missing = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and not hasattr(importlib.import_module(bound[node.value.id]), node.attr)):
            missing.append(f"line {node.lineno}: {bound[node.value.id]} has no {node.attr}")
    return missing


def test_there_are_variants_that_patch_the_worker():
    patched = [v for v in VARIANTS if "worker" in v.read_text()]
    assert len(patched) >= 10, patched


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda path: path.parent.name)
def test_every_variant_patches_the_defining_module(variant):
    assert wrong_patch_targets(variant.read_text()) == [], variant
    assert missing_names(variant.read_text()) == [], variant


def test_a_patch_of_a_re_exported_or_moved_name_is_caught():
    """The check can fail: the worker's settle lives in worker_session, its statements are looked up in worker_jobs;
    patching them on reference.worker (where they lived before the split) changes nothing, nor does patching a
    name reference.worker only re-exports (redact)."""
    source = (
        "from reference import worker as worker_mod\n"
        "from reference import worker_session as session_mod\n"
        "worker_mod._settle = None\n"
        "worker_mod.redact = None\n"
        "worker_mod.Worker._no_such_method = None\n"
        "session_mod.settle = None\n"
        "worker_mod.Worker._process = None\n"
        "setattr(worker_mod, 'queries', None)\n"
    )
    problems = wrong_patch_targets(source)
    assert [p.split(":")[0] for p in problems] == ["line 3", "line 4", "line 5", "line 8"], problems
    assert "defined in reference.worker_jobs" in problems[1]
    assert "no attribute" in problems[2] or "has no" in problems[2]
    assert missing_names("from reference import worker as w\nw._settle(None, 'ack')\n") == [
        "line 2: reference.worker has no _settle"]
