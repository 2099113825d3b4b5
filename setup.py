"""Build hook only (the project's metadata is in pyproject.toml).

The scenario catalogue, the JSON schemas and the report stylesheet live at the top of the repository
(scenarios/, schemas/, reports/templates/): the single source of truth, read there by other tools too. A built
wheel (and an sdist) ships them inside the harness package as harness/_data/{scenarios,schemas,templates}, added
here as package data of `harness` at build time, so nothing is duplicated in git. harness/paths.py finds them at
run time through importlib.resources: in a checkout (editable install) the top-level folders, in a wheel the
package's _data folder. An editable install copies nothing (setuptools' build_py skips package data then).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# Folder in the repository -> (folder under harness/_data, files shipped). Keep in step with harness/paths.py.
SHIPPED = {
    "scenarios": ("scenarios", "*.toml"),
    "schemas": ("schemas", "*"),
    "reports/templates": ("templates", "*.css"),
}


class build_py_with_harness_data(build_py):
    """build_py that adds the top-level data folders to the harness package's data files."""

    def _harness_data(self) -> list[tuple[str, str, str, list[str]]]:
        if "harness" not in (self.packages or ()):
            return []
        out = []
        for source, (target, pattern) in SHIPPED.items():
            files = sorted(p.name for p in (HERE / source).glob(pattern) if p.is_file())
            if not files:
                raise FileNotFoundError(f"{HERE / source}: no {pattern} to ship with the harness")
            # (package, source folder relative to the project, build folder, file names)
            out.append(("harness", source, str(Path(self.build_lib) / "harness" / "_data" / target), files))
        return out

    def _get_data_files(self):
        return super()._get_data_files() + self._harness_data()

    def get_data_files_without_manifest(self):  # what egg_info's manifest (and so the sdist) lists
        return super().get_data_files_without_manifest() + self._harness_data()


setup(cmdclass={"build_py": build_py_with_harness_data})
