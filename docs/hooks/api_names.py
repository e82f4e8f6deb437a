"""MkDocs hook: the API reference documents every public name, from its source.

`estimator_multigpu/__init__.py` maps each public name to the module that
defines it (`_PUBLIC`) and lists the public modules (`_PUBLIC_MODULES`);
`__all__` is the two. `docs/api.md` shows each through mkdocstrings
(`::: estimator_multigpu.<module>.<name>`). When the build reaches api.md,
a public name without its line (or one pointing at another module) stops the
build with one error naming the line to add; a renamed function already
stops it in mkdocstrings. Reads the package's source only: building the docs
needs no TensorFlow.
"""

from __future__ import annotations

import ast
import pathlib
import re
from typing import Dict, List, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "estimator_multigpu"
API_PAGE = "api.md"
TARGET = re.compile(r"^::: ([\w.]+)\s*$", re.M)


def public_surface(init_path: pathlib.Path = ROOT / PACKAGE / "__init__.py"
                   ) -> Tuple[Dict[str, str], Tuple[str, ...]]:
  """`_PUBLIC` (name -> defining module) and `_PUBLIC_MODULES`, from source.

  Args:
    init_path: the package's `__init__.py`.

  Returns:
    `(public, modules)` as the package defines them.
  """
  values = {}
  for node in ast.parse(init_path.read_text()).body:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
      if node.targets[0].id in ("_PUBLIC", "_PUBLIC_MODULES"):
        values[node.targets[0].id] = ast.literal_eval(node.value)
  return values["_PUBLIC"], tuple(values["_PUBLIC_MODULES"])


def missing_lines(markdown: str, public: Dict[str, str],
                  modules: Tuple[str, ...]) -> List[str]:
  """The `::: target` lines the page lacks for the public surface.

  Args:
    markdown: the API page's text.
    public: public name -> the module (under the package) that defines it.
    modules: the public modules; a module is documented by its own line or
      by lines of its submodules.

  Returns:
    The missing lines, one per undocumented public name, in `__all__` order.
  """
  targets = set(TARGET.findall(markdown))
  missing = [f"::: {PACKAGE}.{module}.{name}"
             for name, module in sorted(public.items())
             if f"{PACKAGE}.{module}.{name}" not in targets]
  for module in modules:
    prefix = f"{PACKAGE}.{module}"
    if not any(t == prefix or t.startswith(prefix + ".") for t in targets):
      missing.append(f"::: {prefix}")
  return missing


def on_page_markdown(markdown: str, page, config, files) -> str:
  """Checks the API page against `__all__` before it is rendered."""
  del config, files  # Unused: MkDocs' hook signature.
  if page.file.src_uri != API_PAGE:
    return markdown
  missing = missing_lines(markdown, *public_surface())
  if missing:
    # MkDocs only here: the check above runs in the tests without it.
    from mkdocs.exceptions import PluginError  # pylint: disable=g-import-not-at-top
    raise PluginError(
        f"docs/{API_PAGE} does not document every public name of "
        f"{PACKAGE}.__all__; add these lines (each public name from the "
        f"module __init__.py's _PUBLIC names): {'; '.join(missing)}")
  return markdown
