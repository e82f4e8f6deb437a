"""`bench.cluster` run for real: the Horovod system, or its one-line skip.

Processes (TensorFlow in each), so marked slow. The Horovod job runs only
where this Python has Horovod (its own venv, docs/performance.md); elsewhere
it skips with a message, and the skip line itself is tested.
"""

import json
import subprocess
import sys

import pytest

from bench import cluster_horovod
from bench import cluster_report

pytestmark = pytest.mark.slow


def _bench(tmp_path, *flags):
  return subprocess.run(
      [sys.executable, "-m", "bench.cluster", "--models=mlp",
       "--configs=2:1", "--rounds=1", f"--output={tmp_path / 'out.json'}",
       *flags], cwd=cluster_report.REPO_ROOT, capture_output=True,
      text=True, timeout=240)


def test_only_horovod_without_horovod_is_a_usage_error(tmp_path,
                                                        monkeypatch):
  if cluster_horovod.available():
    pytest.skip("Horovod is installed for this Python; the skip line is "
                "what a Python without it prints.")
  done = _bench(tmp_path, "--systems=horovod")
  lines = [l for l in done.stdout.splitlines() if l.strip()]
  assert done.returncode == 2, done.stderr[-2000:]
  assert lines[0].startswith("horovod: skipped, Horovod is not installed")
  assert lines[1].startswith("Nothing to run: --systems=horovod")


def test_a_horovod_job_trains_and_moves_a_ring_of_bytes(tmp_path):
  if not cluster_horovod.available():
    pytest.skip(f"Horovod is not installed for {sys.executable}; build it "
                "in its own venv (docs/performance.md, 'Horovod as a "
                "system') and run this file with that Python.")
  done = _bench(tmp_path, "--systems=horovod", "--steps=14", "--warmup=4")
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  assert "horovod mlp 2 tasks x 1 towers, round 1: " in done.stdout
  run, = json.loads((tmp_path / "out.json").read_text())["runs"]
  assert run["codes"] == {"horovodrun": 0}
  assert run["timed_steps"] == 10  # steps 5..14 of every process.
  # A ring of 2 processes: each sends 2·1/2·P, 2·P = 14.9 MB in all; the
  # loopback counter sees that plus gloo's and horovodrun's framing.
  assert run["derived_bytes_per_step"] == pytest.approx(
      2 * run["model_bytes"])
  assert run["loopback_bytes_per_step"] == pytest.approx(
      run["derived_bytes_per_step"], rel=0.05)
