"""The site's API page documents `estimator_multigpu.__all__` (issue 46).

`docs/hooks/api_names.py` stops `mkdocs build` when a public name has no
`::: estimator_multigpu.<module>.<name>` line on docs/api.md; these tests
run its check without MkDocs, and keep the pages' copies of the README's
commands equal to the README's.
"""


import doc_blocks

import estimator_multigpu as emg

ROOT = doc_blocks.ROOT
API = (ROOT / "docs" / "api.md").read_text()


def hook():
  return doc_blocks.docs_hook("api_names")


def test_the_hook_reads_the_public_surface_of_the_package():
  public, modules = hook().public_surface()
  assert sorted(public) + list(modules) == emg.__all__
  assert public["multi_gpu"] == "decorator"


def test_the_api_page_documents_every_public_name():
  assert hook().missing_lines(API, *hook().public_surface()) == []


def test_a_public_name_without_its_line_is_named():
  line = "::: estimator_multigpu.cross_tower.losses.global_ratio"
  assert line in API
  public, modules = hook().public_surface()
  assert hook().missing_lines(API.replace(line, ""), public, modules) == [line]


def test_a_name_moved_to_another_module_needs_its_new_line():
  public, modules = hook().public_surface()
  moved = {**public, "global_ratio": "cross_tower.ratios"}
  assert hook().missing_lines(API, moved, modules) == [
      "::: estimator_multigpu.cross_tower.ratios.global_ratio"]


def test_a_public_module_is_documented_by_itself_or_its_submodules():
  public, _ = hook().public_surface()
  assert hook().missing_lines(API, public, ("runtime", "nowhere")) == [
      "::: estimator_multigpu.nowhere"]


def install_block(page: str, section: str = "") -> str:
  """The first Install block of the page, or of its section `section`."""
  text = (ROOT / page).read_text()
  line = text[:text.index(section)].count("\n") + 1 if section else 0
  return next(block.text for block in doc_blocks.blocks(page)
              if block.mark == "Install" and block.line > line)


def test_the_home_page_gives_the_readmes_two_commands():
  assert install_block("docs/index.md") == install_block("README.md")


def test_the_tests_page_gives_the_readmes_test_commands():
  assert (install_block("docs/development.md", "\n## Tests\n") ==
          install_block("README.md", "\n## Tests\n"))
