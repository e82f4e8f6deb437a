"""Running the checkout's scripts (train.py, eval.py, ...) as processes."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_command(*command, timeout: int = 600) -> subprocess.CompletedProcess:
  """Runs `command` in the checkout; asserts it succeeded (stderr's tail)."""
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def run_script(script: str, *args, timeout: int = 600
               ) -> subprocess.CompletedProcess:
  """`python <script> args...` with this interpreter; asserts success."""
  return run_command(sys.executable, os.path.join(ROOT, script), *args,
                     timeout=timeout)
