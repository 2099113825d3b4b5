"""Where the harness finds its data files and where it writes by default — in a checkout and installed alike.

The scenario catalogue (``scenarios/``), the JSON schemas (``schemas/``) and the report stylesheet
(``reports/templates/``) live at the top of the repository: that is their single source of truth, which other tools
read there too. A wheel ships them inside the package as ``harness/_data/{scenarios,schemas,templates}``: setup.py's
build step copies them in at build time, nothing is duplicated in git. At run time both are found through
importlib.resources from the ``harness`` package itself:

- run from a checkout (editable install, or the repository on ``sys.path``), the package's parent folder is the
  repository, and its top-level folders are used (so an edited scenario counts at once);
- installed from a wheel, the package's ``_data`` folder is used.

Default output folders follow the same rule: under the checkout as before (``reports/runs``, ``.run/``), else
under the current directory (``./reports/runs``, ``./.run/``).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

PACKAGE = "harness"
# Data folder name -> where it lives in a checkout (relative to the repository root). The wheel keeps each under
# harness/_data/<name>; setup.py's SHIPPED table must agree with this one.
CHECKOUT_FOLDERS = {
    "scenarios": "scenarios",
    "schemas": "schemas",
    "templates": "reports/templates",
}


class MissingData(FileNotFoundError):
    """The harness's package data is missing: neither a checkout nor a complete installation."""


def package_dir() -> Path:
    """The ``harness`` package's folder, as importlib.resources sees it."""
    root = resources.files(PACKAGE)
    if not isinstance(root, Path):  # e.g. imported from a zip file: the catalogue is read as plain files
        raise MissingData(f"the {PACKAGE} package is not installed as plain files ({root!r}); install the wheel "
                          "with pip (it installs unzipped)")
    return root


@lru_cache(maxsize=None)
def checkout_root() -> Path | None:
    """The repository this harness runs from (an editable install or a plain checkout), or None when installed."""
    candidate = package_dir().resolve().parent
    markers = (candidate / "pyproject.toml", candidate / "scenarios", candidate / "schemas" / "adapter.schema.json")
    return candidate if markers[0].is_file() and markers[1].is_dir() and markers[2].is_file() else None


def data_dir(name: str) -> Path:
    """The folder of one kind of package data: ``scenarios``, ``schemas`` or ``templates``."""
    if name not in CHECKOUT_FOLDERS:
        raise KeyError(f"unknown harness data folder {name!r} (known: {', '.join(CHECKOUT_FOLDERS)})")
    root = checkout_root()
    if root is not None:
        return root / CHECKOUT_FOLDERS[name]
    packaged = package_dir() / "_data" / name
    if packaged.is_dir():
        return packaged
    raise MissingData(f"the harness's {name} folder is missing: looked for {packaged} (an installed wheel) and for "
                      f"a checkout around {package_dir()}. Reinstall the harness from a wheel (pip install "
                      "attachments-reliability-*.whl) or run it from a checkout (pip install -e .)")


def workspace_root() -> Path:
    """The folder default outputs go under: the checkout, else the current directory."""
    return checkout_root() or Path.cwd()


def reports_dir() -> Path:
    """Default folder for run and grade reports: ``reports/runs`` under the checkout or the current directory."""
    return workspace_root() / "reports" / "runs"


def state_dir() -> Path:
    """Default folder for stacks, caches and the current-stack pointer: ``.run`` under the checkout or the current
    directory."""
    return workspace_root() / ".run"
