"""The maps of the code say what is there: no module goes unlisted.

Every package's `__init__.py` docstring names each of its modules and
subpackages, and the Layout block of docs/architecture.md names every
module of the repository, so a module added or moved without its map
fails here rather than drifting.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE_ROOTS = ("estimator_multigpu", "cli", "datasets", "nets",
                 "preprocessing", "bench")
NOT_MODULES = ("__init__.py", "__main__.py")


def packages():
  """Every package under the roots, as paths relative to the repo."""
  return sorted(str(init.parent.relative_to(ROOT))
                for root in PACKAGE_ROOTS
                for init in (ROOT / root).rglob("__init__.py"))


def members(package: str) -> list:
  """The package's modules (without .py) and subpackages."""
  folder = ROOT / package
  modules = [p.stem for p in folder.glob("*.py") if p.name not in NOT_MODULES]
  subpackages = [p.parent.name for p in folder.glob("*/__init__.py")]
  return sorted(modules + subpackages)


def mentions(text: str, name: str) -> bool:
  return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text) is not None


@pytest.mark.parametrize("package", packages())
def test_the_package_docstring_names_every_module(package):
  init = ROOT / package / "__init__.py"
  docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
  missing = [m for m in members(package) if not mentions(docstring, m)]
  assert not missing, (
      f"{init.relative_to(ROOT)}'s docstring does not name {missing}: say in "
      "a few words what each module holds.")


def layout_block() -> str:
  text = (ROOT / "docs" / "architecture.md").read_text()
  section = text.split("\n## Layout", 1)[1]
  return re.search(r"```[^\n]*\n(.*?)```", section, re.S).group(1)


def test_the_docs_layout_names_every_module():
  block = layout_block()
  missing = [f"{package}/{m}" for package in packages()
             for m in members(package) if not mentions(block, m)]
  scripts = [p.name for p in ROOT.glob("*.py")]
  missing += [s for s in scripts if s not in block]
  assert not missing, (
      f"docs/architecture.md's Layout does not name {missing}.")


def test_the_layout_test_sees_the_whole_package():
  # A guard on the walk itself: the library's main rooms are found.
  found = packages()
  for package in ("estimator_multigpu", "estimator_multigpu/graph",
                  "estimator_multigpu/cluster", "cli/flags"):
    assert package in found
  assert "pipeline" in members("estimator_multigpu")
