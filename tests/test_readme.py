"""The README's commands are the ones CI runs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_commands():
  text = (ROOT / "README.md").read_text()
  block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
  return [line for line in block.splitlines()
          if line and not line.startswith("#")]


def test_readme_starts_with_the_main_job_and_the_tests():
  commands = readme_commands()
  assert len(commands) == 2
  assert "pip install" in commands[0] and "pip install" in commands[1]
  assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command_verbatim():
  ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
  assert readme_commands()[1] in ci_lines
