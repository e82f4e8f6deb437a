"""A job's tasks against absent, late, duplicate and foreign tasks.

Real train.py processes on loopback (`TrainTasks`): every wait is bounded
(`wait(timeout=...)`) and every process is killed in a `finally`; no test
asserts on time.
"""

import pytest

from test_all_reduce_faults import TrainTasks
from test_all_reduce_faults import error_lines

pytestmark = pytest.mark.slow


def test_a_chief_alone_then_its_late_worker_each_end_naming_the_other(
    tmp_path):
  """The chief gives up on a worker that never came; the worker, started
  once the chief is gone (a late restart, or a typo in --worker_hosts),
  ends too instead of waiting forever in the board's first call."""
  tasks = TrainTasks(tmp_path, f"--model_dir={tmp_path / 'model'}",
                     "--max_steps=20", "--peer_timeout_secs=5")
  try:
    assert tasks.start(0).wait(timeout=120) == 1, tasks.log("chief")[-3000:]
    assert tasks.start(1).wait(timeout=120) == 1, (
        tasks.log("worker1")[-3000:])
  finally:
    tasks.stop()
  chief, worker = error_lines(tasks.log("chief")), error_lines(
      tasks.log("worker1"))
  assert len(chief) == 1 and "task worker --task_index=1" in chief[0], chief
  assert len(worker) == 1, worker
  assert "task worker --task_index=0 (the chief)" in worker[0], worker
  assert tasks.hosts.split(",")[0] in worker[0], worker
