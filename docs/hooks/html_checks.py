"""MkDocs hook: every page renders its lists, boxes and examples (issue 54).

A docstring or page whose Markdown does not say what it means still builds:
a numbered list without the blank line before it is one run-on paragraph,
and a `>>>` example outside an Examples section is three nested quote
blocks. After each page is rendered, `problems` reads its HTML and the hook
logs one WARNING per problem (`mkdocs build --strict`, as CI runs it, then
fails), naming the page and the text:

- a `<p>` holding two or more lines that start as list items (`1.`, `-`,
  `*`): a list Markdown did not see;
- `>>>` outside `<code>` and `<pre>`: an example shown as text;
- a `<blockquote>` inside a `<blockquote>` (what `>>>` becomes).

The check is the standard library's HTML parser only: the tests run it
without MkDocs (tests/test_docs_html.py).
"""

from __future__ import annotations

import html.parser
import logging
import re
from typing import List

ITEM = re.compile(r"^\s*(\d+\.|[-*])\s+\S")
LOG = logging.getLogger("mkdocs.hooks.html_checks")


class _Reader(html.parser.HTMLParser):
  """Walks a page's HTML, noting each problem with a snippet of its text."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.found: List[str] = []
    self._open: List[str] = []  # the open elements (void ones excluded).
    self._paragraph: List[str] = []

  def handle_starttag(self, tag, attrs):
    if tag in ("br", "img", "hr", "input", "meta", "link", "wbr"):
      return
    if tag == "blockquote" and "blockquote" in self._open:
      self.found.append("a quote block inside a quote block (`>>>` written "
                        "as text?)")
    if tag == "p":
      self._paragraph = []
    self._open.append(tag)

  def handle_endtag(self, tag):
    if tag not in self._open:
      return
    while self._open and self._open.pop() != tag:
      pass
    if tag == "p":
      self._check_paragraph("".join(self._paragraph))

  def handle_data(self, data):
    if "p" in self._open:
      self._paragraph.append(data)
    if ">>>" in data and not {"code", "pre"} & set(self._open):
      self.found.append(f"`>>>` outside code: {_snippet(data)}")

  def _check_paragraph(self, text: str) -> None:
    items = [line for line in text.splitlines() if ITEM.match(line)]
    if len(items) >= 2:
      self.found.append(f"a list rendered as one paragraph (no blank line "
                        f"before it?): {_snippet(items[0])}")


def _snippet(text: str) -> str:
  return re.sub(r"\s+", " ", text).strip()[:80]


def problems(page_html: str) -> List[str]:
  """What in the page's HTML did not render as meant, one line each."""
  reader = _Reader()
  reader.feed(page_html)
  reader.close()
  return reader.found


def on_post_page(output: str, page, config) -> str:
  """Logs a WARNING per problem of the rendered page."""
  del config  # Unused: MkDocs' hook signature.
  for problem in problems(output):
    LOG.warning("%s: %s", page.file.src_uri, problem)
  return output
