"""The fenced code blocks of README.md and docs/*.md; what the tests do.

A block's info string says it: ```python, ```bash and ```sh blocks run
verbatim (`test_docs_blocks.py`); a title naming what the block needs that
this machine or a test lacks makes it a block that is only parsed:

    ```bash title="GPU: 4 GPUs"          needs GPUs
    ```bash title="Cluster: ..."         needs several machines, or starts a
                                         whole cluster
    ```bash title="Install: ..."         installs packages (or runs the suite)

```json and ```yaml blocks are parsed; ```text blocks and blocks without a
language are not code (output, diagrams). The title shows above the block
on the site; GitHub shows the block without it.

Run as a script (`python doc_blocks.py BLOCKS.json`), it runs one page's
runnable blocks in order in the current folder: Python blocks in this one
interpreter, sharing their names like a notebook's cells; shell blocks in
`bash -e -o pipefail`. It stops at the first failure, naming the block.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
from typing import List, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```([\w-]*)([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
TITLE = re.compile(r'title="(\w+)')
MARKS = ("GPU", "Cluster", "Install")
RUNNABLE = ("python", "bash", "sh")
PARSED = ("json", "yaml")
NOT_CODE = ("", "text")


@dataclasses.dataclass(frozen=True)
class Block:
  """One fenced block: where it is, its language, its mark and its text."""
  page: str       # README.md or docs/<page>.md
  line: int       # the line of its opening fence, from 1.
  language: str
  mark: Optional[str]  # one of MARKS, or None.
  text: str

  @property
  def where(self) -> str:
    return f"{self.page}:{self.line}"

  @property
  def runs(self) -> bool:
    return self.language in RUNNABLE and self.mark is None


def docs_hook(name: str):
  """The module docs/hooks/<name>.py (MkDocs' hooks), loaded from its file."""
  spec = importlib.util.spec_from_file_location(
      name, ROOT / "docs" / "hooks" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def pages() -> List[str]:
  """README.md and every page of the site, as paths under the checkout."""
  docs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
  return ["README.md"] + docs


def blocks(page: str) -> List[Block]:
  """The page's fenced blocks, in order."""
  text = (ROOT / page).read_text()
  found = []
  for match in FENCE.finditer(text):
    title = TITLE.search(match.group(2))
    mark = title.group(1) if title and title.group(1) in MARKS else None
    found.append(Block(page, text.count("\n", 0, match.start()) + 1,
                       match.group(1), mark, match.group(3)))
  return found


def fence_lines(page: str) -> int:
  """How many lines of the page open or close a fence, at any indent."""
  return sum(1 for line in (ROOT / page).read_text().splitlines()
             if line.lstrip().startswith("```"))


def parse(block: Block) -> None:
  """Raises when the block is not valid code of its language."""
  if block.language == "python":
    compile(block.text, block.where, "exec")
  elif block.language in ("bash", "sh"):
    result = subprocess.run(["bash", "-n"], input=block.text, text=True,
                            capture_output=True, check=False)
    if result.returncode:
      raise SyntaxError(f"{block.where}: {result.stderr.strip()}")
  elif block.language == "json":
    json.loads(block.text)
  elif block.language == "yaml":
    import yaml  # pylint: disable=g-import-not-at-top
    yaml.safe_load(block.text)


def run_blocks(listed: List[dict]) -> None:
  """Runs the blocks (as `dataclasses.asdict`) in order, here."""
  namespace = {"__name__": "__main__"}
  for fields in listed:
    block = Block(**fields)
    print(f"--- {block.where} ({block.language})", flush=True)
    if block.language == "python":
      code = compile(block.text, block.where, "exec")
      exec(code, namespace)  # pylint: disable=exec-used
      continue
    result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text],
                            check=False)
    if result.returncode:
      sys.exit(f"{block.where}: the shell block exited with status "
               f"{result.returncode}")


if __name__ == "__main__":
  run_blocks(json.loads(pathlib.Path(sys.argv[1]).read_text()))
