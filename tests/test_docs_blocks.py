"""Every code block of README.md and of the site (docs/) is tested (issue 46).

Each block is parsed; the CPU blocks (python, bash, sh without a GPU,
Cluster or Install title; `doc_blocks.py`) also run verbatim, page by page,
in a fresh folder holding links to the checkout's files, `photos/` and
`cars/` (folders of small PNGs, one subfolder per class), with `python`
this interpreter. Links between the README and the pages must resolve.
"""

import dataclasses
import json
import os
import re
import struct
import subprocess
import sys
import zlib

import doc_blocks
import pytest

ROOT = doc_blocks.ROOT
PAGES = doc_blocks.pages()
RUN_PAGES = [page for page in PAGES
             if any(block.runs for block in doc_blocks.blocks(page))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
NOT_LINKED = ("docs", "runs", "exports", "site", "data")  # the folder's own.
# The pages' image folders, one subfolder of 10 40x40 PNGs per class.
FOLDERS = ("photos/daisy", "photos/rose", "photos/tulip", "cars/sedan",
           "cars/truck")


@pytest.mark.parametrize("page", PAGES)
def test_every_fence_opens_or_closes_a_block(page):
  # An indented or unclosed fence would be a block no test sees.
  assert doc_blocks.fence_lines(page) == 2 * len(doc_blocks.blocks(page))


@pytest.mark.parametrize("page", PAGES)
def test_every_block_parses_and_has_a_known_language(page):
  known = doc_blocks.RUNNABLE + doc_blocks.PARSED + doc_blocks.NOT_CODE
  for block in doc_blocks.blocks(page):
    assert block.language in known, (
        f"{block.where}: language {block.language!r}; expected one of "
        f"{known} (tests/doc_blocks.py says what each gets)")
    doc_blocks.parse(block)


def test_the_readme_has_blocks_that_run_and_blocks_that_only_parse():
  readme = doc_blocks.blocks("README.md")
  assert readme[0].mark == "Install"  # the two commands: CI runs them.
  assert {"GPU", "Cluster", "Install"} <= {block.mark for block in readme}
  assert sum(block.runs for block in readme) >= 2


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_point_at_files(page):
  folder = (ROOT / page).parent
  for target in LINK.findall((ROOT / page).read_text()):
    if re.match(r"[a-z]+:|#", target):
      continue  # a web address or an anchor of the page itself.
    path = target.split("#")[0]
    assert (folder / path).exists(), f"{page}: link to {target!r}: no such file"


def png(pixels: bytes, width: int, height: int) -> bytes:
  """An RGB PNG: signature, IHDR, one IDAT (filter 0 rows), IEND."""
  def chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data +
            struct.pack(">I", zlib.crc32(kind + data)))
  rows = b"".join(b"\0" + pixels[y * width * 3:(y + 1) * width * 3]
                  for y in range(height))
  return (b"\x89PNG\r\n\x1a\n" +
          chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
          + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def working_folder(work) -> dict:
  """Links to the checkout's files, photos/, `python`; the environment."""
  for name in os.listdir(ROOT):
    if not name.startswith(".") and name not in NOT_LINKED:
      os.symlink(ROOT / name, work / name)
  for k, name in enumerate(FOLDERS):
    (work / name).mkdir(parents=True)
    for i in range(10):
      pixels = bytes((37 * k + 11 * i + 7 * j) % 256
                     for j in range(40 * 40 * 3))
      (work / name / f"{i}.png").write_bytes(png(pixels, 40, 40))
  (work / "bin").mkdir()
  (work / "bin" / "python").write_text(
      f'#!/bin/sh\nexec {sys.executable} "$@"\n')
  (work / "bin" / "python").chmod(0o755)
  return {**os.environ, "PATH": f"{work}/bin:{os.environ['PATH']}",
          "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_cpu_blocks_run_verbatim(page, tmp_path):
  env = working_folder(tmp_path)
  listed = tmp_path / "blocks.json"
  listed.write_text(json.dumps([dataclasses.asdict(block) for block in
                                doc_blocks.blocks(page) if block.runs]))
  result = subprocess.run([sys.executable, doc_blocks.__file__, str(listed)],
                          cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
  assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-5000:])
