"""The README's commands are the ones CI runs."""

import configparser
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


def extras_installed(command):
  """The extras of the command's `pip install -e ".[a,b]"`."""
  return set(re.search(r'pip install -e "\.\[([\w,]+)\]"', command)
             .group(1).split(","))


def test_the_library_needs_only_its_own_dependencies():
  setup = configparser.ConfigParser()
  setup.read(ROOT / "setup.cfg")
  required = {re.split(r"[<>=\[]", line)[0] for line in setup["options"][
      "install_requires"].split()}
  assert required == {"tensorflow-estimator", "tf-slim", "numpy", "absl-py"}
  app = setup["options.extras_require"]["app"]
  assert "scikit-learn" in app and "tqdm" in app


def test_the_readme_commands_install_what_they_run():
  train, tests = readme_commands()
  assert {"app"} <= extras_installed(train)  # the scripts' digits, tqdm.
  assert {"app", "test"} <= extras_installed(tests)
