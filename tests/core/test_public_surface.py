"""The package's public surface, its import cost, and its import graph."""

import ast
import importlib
import pathlib

import pytest

import estimator_multigpu as emg

PACKAGE = pathlib.Path(emg.__file__).parent


def test_every_public_name_resolves():
  for name in emg.__all__:
    assert getattr(emg, name) is not None, name


def test_a_private_name_is_not_an_attribute():
  with pytest.raises(AttributeError, match="public names are .*check_towers"):
    emg.split_batch  # pylint: disable=pointless-statement


def test_without_tensorflow_the_error_names_the_extras(monkeypatch):
  def missing(name):
    raise ModuleNotFoundError("No module named 'tensorflow'",
                              name="tensorflow")
  monkeypatch.setattr(importlib, "import_module", missing)
  with pytest.raises(ModuleNotFoundError, match=r"\.\[cpu\].*\.\[gpu\]"):
    emg.multi_gpu  # pylint: disable=pointless-statement


def _import_graph() -> dict:
  """module -> library modules it imports (function-level ones included)."""
  modules = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    modules[name] = path
  graph = {}
  for name, path in modules.items():
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
          "estimator_multigpu"):
        for alias in node.names:
          full = f"{node.module}.{alias.name}"
          targets.add(full if full in modules else node.module)
    graph[name] = {t for t in targets if t in modules and t != name}
  return graph


def test_no_import_cycle_in_the_library():
  graph = _import_graph()
  visiting, done = set(), set()

  def visit(module, path):
    assert module not in visiting, f"import cycle: {' -> '.join(path)}"
    if module in done:
      return
    visiting.add(module)
    for target in graph[module]:
      visit(target, path + [target])
    visiting.discard(module)
    done.add(module)

  for module in graph:
    visit(module, [module])


def test_at_most_twelve_modules_at_the_top():
  top = [p for p in PACKAGE.glob("*.py")]
  assert len(top) <= 12, sorted(p.name for p in top)
