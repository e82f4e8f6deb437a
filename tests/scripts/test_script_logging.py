"""The scripts' start-up capture: TensorFlow's pre-InitializeLog C++ lines
(which TF >= 2.17 writes whatever TF_CPP_MIN_LOG_LEVEL says) are dropped
below the level; everything else comes back, in order."""

import os
import subprocess
import sys

import pytest

from cli import script_logging

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
STARTUP = (
    b"WARNING: All log messages before absl::InitializeLog() is called are "
    b"written to STDERR\n"
    b"I0000 00:00:1795672151.730543   20515 port.cc:153] oneDNN custom "
    b"operations are on.\n"
    b"W1126 05:51:12.235576 140105718549376 gpu_device.cc:2] a warning\n"
    b"our own line\n"
    b"E0000 00:00:1795672156.145349   20515 cuda_platform.cc:52] failed call "
    b"to cuInit: INTERNAL: CUDA error: UNKNOWN ERROR (303)\n"
    b"E1126 05:51:12.235576 1401 rendezvous.cc:9] a real error\n")


@pytest.mark.parametrize("level, kept", [
    (1, [3, 4, 5, 6]),  # INFO and the banner go; warnings and errors stay.
    (2, [4, 5, 6]),     # warnings go too.
    (3, [4])])        # only what is not a C++ log line stays.
def test_lines_below_the_level_are_dropped(level, kept):
  capture = script_logging._StartupCapture()  # pylint: disable=protected-access
  capture.level = level
  lines = STARTUP.splitlines(keepends=True)
  shown = [i + 1 for i, line in enumerate(lines) if not capture._hidden(line)]  # pylint: disable=protected-access
  no_driver = not os.path.exists("/dev/nvidiactl")
  assert shown == [i for i in kept if not (i == 5 and no_driver)]  # cuInit.


def test_the_capture_gives_back_stderr_at_exit_and_in_order():
  code = ("import sys; sys.path.insert(0, '.')\n"
          "from cli import script_logging\n"
          "script_logging.before_tensorflow(['x'])\n"
          "import os\n"
          f"os.write(2, {STARTUP!r})\n"
          "sys.stderr.write('python line\\n')\n"
          "sys.exit(3)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          capture_output=True, timeout=60,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1"})
  assert result.returncode == 3
  assert result.stderr.decode().splitlines() == [
      "W1126 05:51:12.235576 140105718549376 gpu_device.cc:2] a warning",
      "our own line",
      "E1126 05:51:12.235576 1401 rendezvous.cc:9] a real error",
      "python line"]
