"""Build-time layout of the wheel; everything else (dependencies, entry points, package data) is in
pyproject.toml.

The suites and goldens stay at the repository's top level (``suites/``, ``golden/``) and travel in the
wheel as ``harness/suites`` (the package ``harness.suites``, so ``pytest --pyargs harness.suites.gather``
finds them) and ``harness/golden``, beside each other as in a checkout, so a suite finds its goldens by
the one rule of :meth:`harness.golden.GoldenExtension.dirname` wherever it is installed.
"""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithGoldens(build_py):
    """Also copies ``golden/`` into the built package as ``harness/golden`` (data: not a package, since
    ``harness/golden.py`` is the module that reads it)."""

    def run(self) -> None:
        super().run()
        if not getattr(self, "editable_mode", False):  # an editable install reads golden/ in place
            self.copy_tree(str(ROOT / "golden"), str(Path(self.build_lib) / "harness" / "golden"))


suites = ["harness.suites", *(f"harness.suites.{name}" for name in find_packages(str(ROOT / "suites")))]
setup(
    packages=[*find_packages(str(ROOT), include=["harness", "harness.*"]), *suites],
    package_dir={"harness.suites": "suites"},
    cmdclass={"build_py": BuildPyWithGoldens},
)
