"""The README's commands are the ones CI runs."""

import configparser
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_commands():
  text = (ROOT / "README.md").read_text()
  block = re.search(r"```bash[^\n]*\n(.*?)```", text, re.S).group(1)
  return [line for line in block.splitlines()
          if line and not line.startswith("#")]


def test_readme_starts_with_the_main_job_and_the_tests():
  commands = readme_commands()
  assert len(commands) == 2
  assert "pip install" in commands[0] and "pip install" in commands[1]
  assert "pytest" in commands[1]


def newest_line_command():
  """The Tests section's command for the newest TensorFlow line."""
  text = (ROOT / "README.md").read_text().split("\n## Tests\n")[1]
  block = re.search(r"```bash[^\n]*\n(.*?)```", text, re.S).group(1)
  return [line for line in block.splitlines() if ".venv-newest" in line][0]


def test_ci_runs_the_readme_test_commands_verbatim():
  ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
  assert readme_commands()[1] in ci_lines
  assert newest_line_command() in ci_lines
  assert 'pytest -q -n 2 -m "not slow" tests' in newest_line_command()


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
  for extra in ("cpu", "gpu"):  # one TensorFlow per Python version.
    lines = setup["options.extras_require"][extra].strip().splitlines()
    assert [l.split(";")[1].strip() for l in lines] == [
        'python_version < "3.12"', 'python_version >= "3.12"',
        'python_version >= "3.12"'], lines
  app = setup["options.extras_require"]["app"]
  assert "scikit-learn" in app and "tqdm" in app


def test_the_readme_commands_install_what_they_run():
  train, tests = readme_commands()
  assert {"app"} <= extras_installed(train)  # the scripts' digits, tqdm.
  assert {"app", "test"} <= extras_installed(tests)


def test_the_readme_gives_the_first_commands_result_per_tensorflow_line():
  # Measured (issue 44): python train.py && python eval.py --once on 2 CPU
  # cores, each line's venv; their losses differ, so each has its result.
  text = " ".join((ROOT / "README.md").read_text().split("\n## ")[0].split())
  for version, result in (
      ("2.15", "accuracy=0.9833 global_step=1500 loss=0.1298 top_5=1.0000"),
      ("2.21", "accuracy=0.9833 global_step=1500 loss=0.1303 top_5=1.0000")):
    assert f"`{result}` on TensorFlow {version}" in text
