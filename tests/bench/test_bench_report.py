"""The benchmark's arithmetic: pooling, resolution, target checks, fingerprints."""

import os
import tempfile

import pytest
import tensorflow as tf

import estimator_multigpu as emg

from bench import models
from bench import protocol
from bench import report
from bench import schedule
from bench import specs

tf1 = tf.compat.v1


def timing(system, towers, replica, seconds, cpu=None, rss=500.0):
  job = schedule.Job(system, towers, "mlp", replica=replica)
  return schedule.Timing(job, 10.0, list(seconds), list(cpu or seconds), 4,
                         rss)


def test_replicas_pool_their_windows_and_keep_the_peak_memory():
  timings = [timing("single", 1, 0, [1.0, 2.0], rss=500),
             timing("single", 1, 1, [3.0], rss=700),
             timing("multi_gpu", 2, 0, [4.0])]
  pooled = schedule.pool_replicas(timings)
  assert [t.job.label for t in pooled] == ["single", "multi_gpu x2"]
  assert pooled[0].window_seconds == [1.0, 2.0, 3.0]
  assert pooled[0].max_rss_mb == 700
  assert pooled[0].job.replica == 0
  assert timings[0].window_seconds == [1.0, 2.0]  # inputs untouched.


def test_replica_spread_is_max_over_min_median_step_time():
  timings = [timing("single", 1, 0, [1.0, 1.0, 9.0]),  # median 1.0
             timing("single", 1, 1, [1.1, 1.05, 1.1]),  # median 1.1
             timing("multi_gpu", 1, 0, [2.0])]  # one process: no spread.
  assert report.replica_spreads(timings) == pytest.approx([0.1])


def test_rows_are_examples_per_second_of_each_window():
  # 4 steps x batch 32 = 128 examples per window; 1 s and 2 s windows.
  row = report.to_row(timing("single", 1, 0, [1.0, 2.0, 4.0]), 32)
  assert row.rates == (128.0, 64.0, 32.0)
  assert (row.median, row.low, row.high) == (64.0, 32.0, 128.0)


def make_row(system, towers, median, digest=""):
  return report.Row("mlp", f"{system} x{towers}", system, towers, median,
                    median, median, 1, 0.0, 0.0, graph_digest=digest,
                    num_ops=7)


def test_throughput_checks_against_single_mirrored_and_split():
  rows = [make_row("single", 1, 100.0), make_row("multi_gpu", 1, 96.0),
          make_row("multi_gpu", 2, 91.0), make_row("mirrored", 1, 97.0),
          make_row("mirrored", 2, 70.0), make_row("split", 2, 90.0)]
  lines = [c.line() for c in report.throughput_checks(rows, "mlp", [1, 2])]
  assert lines == [
      "MISS mlp multi_gpu x1 >= 0.97x single: 0.960x",
      "PASS mlp multi_gpu x2 >= 0.9x single: 0.910x",
      "MISS mlp multi_gpu x1 faster than mirrored x1: 0.990x",
      "PASS mlp multi_gpu x2 faster than mirrored x2: 1.300x",
      # 91 / 90 = 1.011; the split alone is 90 / 100.
      "PASS mlp multi_gpu x2 >= 0.97x split x2 (1 device): 1.011x; "
      "the split alone is 0.900x single"]


def test_modes_table_puts_shared_and_replicated_side_by_side():
  rows = [make_row("single", 1, 100.0), make_row("multi_gpu", 1, 96.0),
          make_row("multi_gpu", 2, 80.0), make_row("replicated", 2, 90.0)]
  # 90 / 80 = 1.125, printed with two decimals; x1 has no replicated row.
  assert report.modes_table(rows).splitlines()[2:] == [
      "| mlp | 2 | 80.0 | 90.0 | 1.12x | 0 | 0 |"]
  assert report.modes_table(rows[:2]) == ""


def test_a_miss_within_the_resolution_says_so():
  # 0.96 / 0.97 = 0.9897: short by 1.0%.
  check = report.ratio_check("x", 0.96, 0.97)
  assert check.line(0.05) == ("MISS x: 0.960x (short by 1.0%, within the "
                              "5.0% resolution)")
  assert check.line(0.005) == "MISS x: 0.960x"
  assert report.ratio_check("x", 1.0, 1.0, strict=True).passed is False


def test_same_graph_check_compares_digests():
  rows = [make_row("single", 1, 1.0, "abc"), make_row("multi_gpu", 1, 1.0,
                                                      "abc")]
  assert report.same_graph_check(rows, "mlp")[0].passed
  rows[1] = make_row("multi_gpu", 1, 1.0, "abd")
  assert not report.same_graph_check(rows, "mlp")[0].passed


@pytest.mark.parametrize("seconds, passed", [
    ({"1": 1.0, "2": 2.0, "4": 4.0, "8": 8.0}, True),     # linear: 1.0x
    ({"1": 1.0, "2": 4.0, "4": 16.0, "8": 64.0}, False),  # k^2: 8/2 = 4x
])
def test_linear_check(seconds, passed):
  [check] = report.linear_check("m", "w", {"seconds": seconds})
  assert check.passed is passed


def step_fingerprint(wrap: bool) -> dict:
  spec = specs.get_model("mlp")
  with tf.Graph().as_default() as graph:
    tf1.train.get_or_create_global_step()  # as Estimator does, first.
    images = tf1.placeholder(tf.float32, [8, 28, 28, 1])
    labels = tf1.placeholder(tf.int32, [8])
    model_fn = models.make_model_fn(spec, wrap)
    if wrap:
      model_fn = emg.multi_gpu(model_fn, devices=["/cpu:0"])
      estimator_spec = model_fn(images, labels, tf.estimator.ModeKeys.TRAIN,
                                {}, tf.estimator.RunConfig())
    else:
      estimator_spec = model_fn(images, labels, tf.estimator.ModeKeys.TRAIN)
    tf1.add_to_collection(tf1.GraphKeys.TRAIN_OP, estimator_spec.train_op)
    return protocol.graph_fingerprint(graph)


def test_one_tower_step_is_the_unwrapped_step_op_for_op():
  unwrapped, wrapped = step_fingerprint(False), step_fingerprint(True)
  assert unwrapped["num_ops"] > 50
  assert wrapped == unwrapped


def test_exit_status_is_one_for_a_miss_beyond_the_resolution(tmp_path):
  from bench import run  # pylint: disable=g-import-not-at-top
  within = report.ratio_check("x", 0.96, 0.97)   # short by 1.0%.
  beyond = report.ratio_check("y", 0.90, 0.97)   # short by 7.2%.
  passed = report.ratio_check("z", 1.00, 0.97)
  assert within.within(0.05) and not beyond.within(0.05)
  assert run.exit_status([passed, within], 0.05, []) == 0
  assert run.exit_status([passed, within, beyond], 0.05, []) == 1
  assert run.exit_status([within], None, []) == 1  # no resolution measured.
  assert run.exit_status([passed], 0.05, ["mirrored x4 crashed"]) == 1
  same_graph = report.Check("graph", False, "different")  # no shortfall.
  assert run.exit_status([same_graph], 0.05, []) == 1


def test_results_go_outside_the_checkout_by_default():
  from bench import run  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  default = run.output_path(None)
  assert default == os.path.join(tempfile.gettempdir(), "bench_results.json")
  assert not os.path.abspath(default).startswith(root + os.sep)
  assert run.output_path("mine.json") == "mine.json"
