"""`bench.cluster`'s bookkeeping: the jobs it runs, the Horovod system's
plumbing, CPU time and step traces, against values worked out by hand.

Nothing here starts a job (those are minutes of processes); one test starts
a short-lived `sleep` to find it again among a process's descendants.
"""

import subprocess
import sys
import time

import pytest

from bench import cluster_horovod
from bench import cluster_jobs
from bench import cluster_report
from bench import cluster_trace


def _config(systems, configs=((2, 1), (2, 2)), rounds=2):
  return {"systems": systems, "rounds": rounds, "models": ["mlp"],
          "configs": list(configs), "steps": 30, "trace_step": 0}


def test_jobs_alternate_the_systems_and_skip_mwms_at_two_towers(monkeypatch):
  monkeypatch.setattr(cluster_horovod, "available", lambda: True)
  jobs = cluster_jobs.jobs(_config(["allreduce", "mwms", "horovod"]))
  order = [(j["round"], j["towers"], j["system"]) for j in jobs]
  assert order == [
      (1, 1, "allreduce"), (1, 1, "mwms"), (1, 1, "horovod"),
      (1, 2, "allreduce"), (1, 2, "horovod"),           # no mwms at 2 towers
      (2, 1, "horovod"), (2, 1, "mwms"), (2, 1, "allreduce"),  # reversed
      (2, 2, "horovod"), (2, 2, "allreduce")]


def test_horovod_missing_is_one_line_and_the_others_run(monkeypatch, capsys):
  monkeypatch.setattr(cluster_horovod, "available", lambda: False)
  jobs = cluster_jobs.jobs(_config(["allreduce", "horovod"], [(2, 1)], 1))
  assert [j["system"] for j in jobs] == ["allreduce"]
  out = capsys.readouterr().out.strip().splitlines()
  assert len(out) == 1 and out[0].startswith("horovod: skipped")


def test_horovod_runs_one_process_per_tower_over_loopback():
  command = cluster_horovod.launch_command(2, 2, ["python", "-m", "task"])
  assert command[1:8] == ["--gloo", "-np", "4", "-H", "localhost:4",
                          "--network-interface", "lo"]
  assert command[-3:] == ["python", "-m", "task"]
  # 2 tasks x 2 towers: each process trains half of a task's batch of 256.
  assert cluster_horovod.per_process_batch(256, 2) == 128
  with pytest.raises(ValueError, match="--towers=3 does not divide"):
    cluster_horovod.per_process_batch(256, 3)


def test_horovod_ranks_write_the_records_the_report_reads():
  assert cluster_horovod.record_path("/w/chief0.json", 0) == "/w/chief0.json"
  assert cluster_horovod.record_path("/w/chief0.json", 3) == "/w/worker2.json"
  job = {"system": "horovod", "model": "mlp", "tasks": 2, "towers": 1,
         "steps": 5, "trace_step": 0}
  command = cluster_jobs.task_command(job, "horovodrun", "/w", [])
  assert command[0].endswith("horovodrun")
  assert "--out=/w/chief0.json" in command
  assert "--system=horovod" in command


def test_cpu_ms_per_step_adds_every_trainer():
  # Warm-up 2. Chief: 0.3 s over steps 2..4 = 150 ms/step; worker:
  # 0.1 s over the same 2 steps = 50 ms/step; together 200.
  chief = {"steps": [1, 2, 3, 4], "cpu_seconds": [1.0, 1.1, 1.25, 1.4]}
  worker = {"steps": [1, 2, 3, 4], "cpu_seconds": [2.0, 2.0, 2.05, 2.1]}
  assert cluster_report.cpu_ms_per_step([chief, worker], 2) == (
      pytest.approx(200.0))


def test_outside_run_is_the_median_gap_between_runs():
  # Steps end at 0, 1, 2.5, 3.5 s; their runs took 0.9, 0.8, 1.4, 0.9 s.
  # Gaps after warm-up 1: 1-0-0.8 = 0.2, 2.5-1-1.4 = 0.1, 3.5-2.5-0.9 = 0.1.
  record = {"times": [0.0, 1.0, 2.5, 3.5],
            "run_seconds": [0.9, 0.8, 1.4, 0.9]}
  assert cluster_report.outside_run_ms(record, 1) == pytest.approx(100.0)


def test_run_line_names_system_model_topology_and_round():
  run = {"system": "horovod", "model": "lenet", "tasks": 3, "towers": 1,
         "round": 2, "examples_per_sec": 1234.4,
         "loopback_bytes_per_step": 26.7e6, "derived_bytes_per_step": 26.6e6,
         "cpu_ms_per_step": 90.0, "outside_run_ms": 0.3, "job_seconds": 12}
  line = cluster_report.run_line(run)
  assert line.startswith("horovod lenet 3 tasks x 1 towers, round 2: "
                         "1234 ex/s, 26.7 MB/step on lo")


class _Node:
  def __init__(self, label, name, micros, start=0):
    self.timeline_label, self.node_name = label, name
    self.all_end_rel_micros, self.all_start_micros = micros, start


class _Device:
  def __init__(self, device, nodes):
    self.device, self.node_stats = device, nodes


class _Stats:
  def __init__(self, devices):
    self.dev_stats = devices


def _stats():
  return _Stats([
      _Device("/job:chief/replica:0/task:0/device:CPU:0", [
          _Node("a = MatMul(x, w)", "a", 30, 5),
          _Node("b = MatMul(a, w)", "b", 20, 40),
          _Node("s = CollectiveReduceV2(b)", "s", 100, 60),
          _Node("", "_SOURCE", 0, 1)]),
      _Device("/device:GPU:0/stream:all", [  # a GPU stream repeats ops.
          _Node("a = MatMul(x, w)", "a", 30)])])


def test_step_summary_counts_ops_by_type_without_gpu_streams():
  summary = cluster_trace.summarize_step_stats(_stats())
  assert summary["MatMul"] == {"count": 2, "micros": 50, "names": ["a", "b"]}
  assert summary["CollectiveReduceV2"]["count"] == 1
  assert summary["_SOURCE"]["count"] == 1
  assert cluster_trace.total_ops(summary) == 4
  # Ops that took time, by start (start, duration, type, name); no stream.
  assert cluster_trace.timeline(_stats()) == [
      (5, 30, "MatMul", "a"), (40, 20, "MatMul", "b"),
      (60, 100, "CollectiveReduceV2", "s")]


def test_difference_and_comparison_of_two_systems():
  ours = {"MatMul": {"count": 2}, "MulNoNan": {"count": 7},
          "Const": {"count": 25}}
  theirs = {"MatMul": {"count": 2}, "Const": {"count": 23},
            "Identity": {"count": 1}}
  assert cluster_trace.difference(ours, theirs) == [
      ("MulNoNan", 7, 0), ("Const", 25, 23), ("Identity", 0, 1)]
  runs = [{"model": "mlp", "tasks": 2, "towers": 1, "system": s, "trace": t}
          for s, t in (("allreduce", ours), ("mwms", theirs))]
  text = cluster_trace.comparison(runs)
  assert "mlp 2 × 1: ops in one step, allreduce 34 / mwms 26" in text
  assert "| MulNoNan | 7 | 0 |" in text and "| MatMul |" not in text


def test_descendants_finds_a_grandchild():
  parent = subprocess.Popen(
      [sys.executable, "-c", "import subprocess, sys; subprocess.Popen(["
       "'sleep', '30']); sys.stdin.read()"], stdin=subprocess.PIPE)
  try:
    found = []
    for _ in range(200):  # the grandchild appears within a few ms.
      found = cluster_jobs.descendants(parent.pid)
      if found:
        break
      time.sleep(0.05)
    assert len(found) == 1
  finally:
    for pid in cluster_jobs.descendants(parent.pid):
      cluster_jobs._kill(pid)  # pylint: disable=protected-access
    parent.kill()
    parent.wait()
