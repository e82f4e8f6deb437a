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


APPLICATION = PACKAGE.parent
PUBLIC_MODULES = {"devices", "cluster", "runtime", "slim_compat"}


def _library_imports(path: pathlib.Path) -> set:
  """The library modules a file of the application names in its imports."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
        "estimator_multigpu"):
      names.update(f"{node.module}.{a.name}" for a in node.names)
    elif isinstance(node, ast.Import):
      names.update(a.name for a in node.names
                   if a.name.startswith("estimator_multigpu."))
  return names


def test_the_application_uses_only_the_public_surface():
  """train.py, eval.py, cli/, nets/, ... import the package and its public
  modules (`__init__`'s docstring), never an internal one."""
  files = [p for folder in ("cli", "nets", "datasets", "preprocessing",
                            "examples", "bench")
           for p in (APPLICATION / folder).rglob("*.py")]
  files += list(APPLICATION.glob("*.py"))
  private = sorted(
      f"{path.relative_to(APPLICATION)}: {name}" for path in files
      for name in _library_imports(path)
      if name.split(".")[1] not in PUBLIC_MODULES)
  assert not private


def test_public_modules_are_in_all_and_say_their_names():
  assert PUBLIC_MODULES <= set(emg.__all__)
  for module in ("runtime.guards", "runtime.hooks", "runtime.scaling",
                 "runtime.model_dir_lock", "runtime.checkpoints",
                 "runtime.evaluation", "cluster"):
    loaded = importlib.import_module(f"estimator_multigpu.{module}")
    assert loaded.__all__ and all(hasattr(loaded, n) for n in loaded.__all__)
