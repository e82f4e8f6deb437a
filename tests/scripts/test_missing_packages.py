"""Issue 35, row 2: a script run by a Python without the project's packages
(`python3 train.py` outside the environment) ends with one line naming the
missing packages and the fix, status 2, before absl is imported
(cli/entry_point.py)."""

import importlib.util
import subprocess
import sys

import pytest
from test_mistakes import ROOT

from cli import entry_point

SCRIPTS = ("train.py", "eval.py", "export.py", "convert.py")


@pytest.fixture
def without(monkeypatch):
  """Makes `find_spec` miss the given modules."""
  real = importlib.util.find_spec

  def hide(*modules):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: (
        None if name in modules else real(name, *args)))

  return hide


def test_nothing_missing_passes():
  assert entry_point.missing_packages() == []
  entry_point.check_installed()


def test_a_script_without_absl_is_one_line_and_status_2(without, monkeypatch,
                                                        capsys):
  without("absl", "tensorflow")
  monkeypatch.setattr(sys, "argv", ["train.py", "--max_steps=3"])
  with pytest.raises(SystemExit) as exit_info:
    entry_point.check_installed()
  assert exit_info.value.code == 2
  line, = capsys.readouterr().err.splitlines()
  assert line.startswith(f"train.py: error: absl-py, tensorflow are not "
                         f"installed for {sys.executable}: ")
  assert 'pip install -e ".[cpu,app]"' in line


def test_outside_a_script_it_is_module_not_found(without, monkeypatch):
  without("tf_slim")
  monkeypatch.setattr(sys, "argv", ["pytest"])
  with pytest.raises(ModuleNotFoundError, match="tf-slim is not installed"):
    entry_point.check_installed()


def test_a_checkout_with_a_venv_says_activate_it(tmp_path, monkeypatch):
  (tmp_path / ".venv").mkdir()
  monkeypatch.setattr(entry_point, "ROOT", str(tmp_path))
  message = entry_point.missing_message(["absl-py"])
  assert "activate the checkout's environment (. .venv/bin/activate), or " \
         "install it" in message
  monkeypatch.setattr(sys, "prefix", str(tmp_path / ".venv"))  # inside it.
  assert "activate" not in entry_point.missing_message(["absl-py"])


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_python_without_site_packages_gets_one_line(script):
  # -S: no site-packages, so neither absl nor TensorFlow can be imported.
  result = subprocess.run([sys.executable, "-S", script, "--max_steps=1"],
                          cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 2, result.stderr
  line, = result.stderr.splitlines()
  assert line.startswith(f"{script}: error: absl-py, numpy, tensorflow, ")
  assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_only_tensorflow_missing_names_the_extra():
  # sys.modules["tensorflow"] = None: TensorFlow is not importable.
  code = ("import runpy, sys; sys.modules['tensorflow'] = None; "
          "sys.argv = ['train.py']; runpy.run_path('train.py', "
          "run_name='__main__')")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.startswith(
      "train.py: error: tensorflow is not installed for ")
  assert "TensorFlow is an extra" in result.stderr
