"""The site renders its lists, boxes and examples (issue 54).

`docs/hooks/html_checks.py` reads each page's HTML as MkDocs writes it and
warns (an error under `mkdocs build --strict`, as .ci/run builds the site)
about a list rendered as one paragraph, `>>>` outside code, and nested
quote blocks. Its check runs here on the HTML the site held before the fix
(the API page's `multi_gpu` rules and example, a guide's list), and on the
fixed forms; with the docs extra installed, on the whole site, built.
"""

import importlib.util
import subprocess
import sys

import doc_blocks
import pytest

ROOT = doc_blocks.ROOT
# What mkdocstrings made of `multi_gpu`'s docstring before the fix.
RUN_ON_RULES = """<p>Rules the <code>model_fn</code> must follow:
  1. Wrap every optimizer in <code>TowerOptimizer</code> (an unwrapped one
     is an error with more than one tower);
  2. With <code>loss_reduction="mean"</code> (default) the loss must be a
     mean.</p>"""
QUOTED_EXAMPLE = """<details class="example" open>
  <summary>Example</summary>
  <blockquote>
<blockquote>
<blockquote>
<p>@multi_gpu(devices=2)
... def model_fn(features, labels, mode, params):</p>
</blockquote></blockquote></blockquote></details>"""
RUN_ON_GUIDE = """<p>Choose otherwise when:
- the variables and slots do not fit on every GPU;
- you want asynchronous towers.</p>"""
TEXT_PROMPT = "<p>Type &gt;&gt;&gt; import estimator_multigpu</p>"
FIXED = """<p>Rules the <code>model_fn</code> must follow:</p>
<ol><li>Wrap every optimizer</li><li>With the mean</li></ol>
<div class="language-pycon highlight"><pre><span></span><code><span class="gp">
&gt;&gt;&gt; </span>mean = emg.cross_tower_moments(x, axes=[0])</code></pre></div>
<p>A sentence - with a dash,
- and one line that starts like an item.</p>
<blockquote><p>A quote.</p></blockquote>"""


def hook():
  return doc_blocks.docs_hook("html_checks")


@pytest.mark.parametrize("page, expected", [
    (RUN_ON_RULES, "a list rendered as one paragraph (no blank line before "
     "it?): 1. Wrap every optimizer in TowerOptimizer (an unwrapped one"),
    (RUN_ON_GUIDE, "a list rendered as one paragraph (no blank line before "
     "it?): - the variables and slots do not fit on every GPU;"),
    (TEXT_PROMPT, "`>>>` outside code: Type >>> import estimator_multigpu"),
], ids=["numbered", "dashes", "prompt"])
def test_each_kind_of_problem_is_named(page, expected):
  assert hook().problems(page) == [expected]


def test_an_example_as_quotes_is_found():
  problems = hook().problems(QUOTED_EXAMPLE)
  assert problems == ["a quote block inside a quote block (`>>>` written as "
                      "text?)"] * 2


def test_lists_code_and_one_quote_are_fine():
  assert hook().problems(FIXED) == []


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason=(
    "the docs extra is not installed (.ci/run builds the site in an "
    "environment of its own, with this check)"))
def test_the_site_builds_strictly(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
       str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
      timeout=300, check=False,
      env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
  assert result.returncode == 0, result.stderr[-3000:]
