"""`python -m bench.run` talks as it goes (issue 35): a progress line per
system ready, warm-up and round of timed windows, on stderr (absl
logging), while the final tables stay as they were. The workers here are
stand-ins that answer the protocol at once, so no subprocess starts."""

import logging

import pytest

from bench import schedule


class FakeWorker:
  """A `schedule.Worker` that answers at once (`fail`: never ready)."""
  started = []

  def __init__(self, job, log_dir, fail=False):
    del log_dir
    self.job, self.fail = job, fail
    FakeWorker.started.append(job.label)

  def expect(self, event):
    if self.fail and event == "ready":
      raise RuntimeError(f"{self.job.label} did not send 'ready'")
    return {"ready": {"setup_seconds": 3.0}, "done": {"max_rss_mb": 1.0}}[
        event]

  def run(self, steps):
    return 0.1 * steps, 0.1 * steps

  def stop(self):
    pass

  def finish(self):
    return self.expect("done")

  def kill(self):
    pass


@pytest.fixture
def fake_workers(monkeypatch):
  FakeWorker.started = []
  monkeypatch.setattr(
      schedule, "Worker", lambda job, log_dir: FakeWorker(
          job, log_dir, fail=job.system == "mirrored"))


def test_measure_model_logs_each_system_and_round(fake_workers, caplog):
  jobs = [schedule.Job("single", 1, "mlp"),
          schedule.Job("single", 1, "mlp", replica=1),
          schedule.Job("multi_gpu", 2, "mlp"),
          schedule.Job("mirrored", 2, "mlp")]
  caplog.set_level(logging.INFO, logger="absl")
  timings, failures = schedule.measure_model(jobs, rounds=2,
                                             window_seconds=1.0, log_dir="")
  lines = [record.getMessage() for record in caplog.records]
  assert lines == [
      "mlp: started 4 system processes; each builds its graph",
      "mlp: single ready (1/4, set up in 3 s)",
      "mlp: single (process 2) ready (2/4, set up in 3 s)",
      "mlp: multi_gpu x2 ready (3/4, set up in 3 s)",
      "mlp: mirrored x2 failed (4/4): mirrored x2 did not send 'ready'",
      # a step takes 0.1 s here, so a 1 s window is 10 steps.
      "mlp: warming up 3 systems (10 steps per window)",
      "mlp: round 1/2 of timed windows done (0 s)",
      "mlp: round 2/2 of timed windows done (0 s)"]
  assert [t.job.label for t in timings] == ["single", "single",
                                            "multi_gpu x2"]
  assert all(t.window_seconds == [1.0, 1.0] for t in timings)
  assert failures == ["mirrored x2 did not send 'ready'"]
