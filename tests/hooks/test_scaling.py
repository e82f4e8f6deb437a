"""Tests for the scaling report hook (`estimator_multigpu.runtime.scaling`).

No test bounds a wall-clock time: the log lines are checked for arithmetic
(their numbers agree with each other, the batch and the tower count) and
the input wait for which op waited and whether the warning followed it.
"""

import logging
import re
import time

from absl import logging as absl_logging
import pytest
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu.runtime import hooks
from estimator_multigpu.runtime import scaling

tf1 = tf.compat.v1
pytestmark = pytest.mark.filterwarnings("ignore:`tf.layers.dense`")
GLOBAL_BATCH = 16
NUM_TOWERS = 2
DELAY = 0.05  # seconds the slow input sleeps per batch.
LINE_RE = re.compile(
    r"scaling: step (\d+): ([\d.]+) examples/sec \(([\d.]+) per tower x (\d+)"
    r" towers, global batch (\d+), ([\d.]+) ms/step over (\d+) steps\); "
    r"input wait (\d+)%")
PROGRESS_RE = re.compile(
    r"^step (\d+)  loss \S+  lr \S+  ([\d.]+) examples/sec")


def model_fn(features, labels, mode):
  """Two 256-wide layers: a few ms per step, so a prefetched batch is cheap."""
  hidden = tf1.layers.dense(features, 256, tf.nn.relu)
  hidden = tf1.layers.dense(hidden, 256, tf.nn.relu)
  loss = tf.reduce_mean(tf.square(tf1.layers.dense(hidden, 1) - labels))
  optimizer = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.01))
  train_op = optimizer.minimize(loss, tf1.train.get_or_create_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn(delay: float):
  """A constant batch; with `delay`, a py_function sleeps before each one."""

  def make():
    dataset = tf.data.Dataset.from_tensors(
        (tf.ones([GLOBAL_BATCH, 256]), tf.ones([GLOBAL_BATCH, 1]))).repeat()
    if not delay:
      return dataset.prefetch(2)

    def slow(features, labels):
      features = tf.py_function(lambda x: (time.sleep(delay), x)[1],
                                [features], tf.float32)
      return tf.ensure_shape(features, [GLOBAL_BATCH, 256]), labels

    return dataset.map(slow)

  return make


def train(run_config, delay: float, every_n_steps: int, max_steps: int,
          **report_options):
  """Trains with a progress hook and its scaling report; returns the latter."""
  made = []

  def make_hooks(spec):
    progress = hooks.ProgressHook(spec.loss, GLOBAL_BATCH, NUM_TOWERS,
                                  max_steps, every_n_steps)
    made.append(scaling.ScalingReportHook(progress, on_gpu=False,
                                          **report_options))
    return [progress, made[-1]]

  estimator = tf.estimator.Estimator(hooks.with_training_hooks(
      emg.multi_gpu(model_fn, devices=["/cpu:0", "/cpu:1"]), make_hooks),
                                     config=run_config)
  estimator.train(input_fn(delay), max_steps=max_steps)
  return made[-1]


def make_report_hook(global_batch_size, num_towers, every_n_steps=100,
                     **kwargs):
  progress = hooks.ProgressHook(None, global_batch_size, num_towers, None,
                                every_n_steps)
  return scaling.ScalingReportHook(progress, **kwargs)


def messages(caplog, level):
  return [r.getMessage() for r in caplog.records
          if r.name == "absl" and r.levelno == level]


def test_slow_input_warns_input_bound(run_config, caplog):
  with caplog.at_level(logging.INFO, logger="absl"):
    hook = train(run_config, DELAY, every_n_steps=4, max_steps=9)
  warnings = [m for m in messages(caplog, logging.WARNING)
              if "input-bound" in m]
  assert len(warnings) == 2, messages(caplog, logging.WARNING)
  assert "num_parallel_calls" in warnings[0] and "prefetch" in warnings[0]
  # The traced step waited for its batch, which a py_function made slow.
  for report in hook.reports:
    assert report.input_wait.op_name == "IteratorGetNext"
    assert report.input_wait.share > scaling.INPUT_BOUND_SHARE


def test_quiet_report_warns_once_and_reports_at_debug(run_config, caplog):
  with caplog.at_level(logging.DEBUG, logger="absl"):
    hook = train(run_config, DELAY, every_n_steps=4, max_steps=9,
                 report_level=absl_logging.DEBUG, repeat_warnings=False)
  warnings = [m for m in messages(caplog, logging.WARNING)
              if "input-bound" in m]
  assert len(hook.reports) == 2 and len(warnings) == 1
  assert not [m for m in messages(caplog, logging.INFO)
              if m.startswith("scaling:")]
  assert len([m for m in messages(caplog, logging.DEBUG)
              if m.startswith("scaling: step")]) == 2


def test_fast_input_warns_only_where_its_measured_wait_says_so(run_config,
                                                               caplog):
  """A prefetched input: each report warns exactly when its own traced share
  is above the threshold (the share itself depends on the machine's load,
  so it is not bounded here; see the synthetic reports below)."""
  with caplog.at_level(logging.INFO, logger="absl"):
    # The global step a run reads may be the one before or after its own
    # increment, so windows of 5 end between steps 5-7 and 10-13: 14 steps
    # hold exactly two whichever way each read goes (11 held one or two).
    hook = train(run_config, 0.0, every_n_steps=5, max_steps=14)
  assert len(hook.reports) == 2
  input_bound = [r for r in hook.reports if r.input_wait is not None and
                 r.input_wait.share > scaling.INPUT_BOUND_SHARE]
  warnings = [m for m in messages(caplog, logging.WARNING)
              if m.startswith("scaling:")]
  assert len(warnings) == len(input_bound)


@pytest.mark.parametrize("input_ms,warns", [(1.0, False), (2.9, False),
                                            (3.1, True), (9.0, True)])
def test_warning_threshold_on_synthetic_reports(input_ms, warns, caplog):
  """Of a 10 ms traced step, more than 30% (3 ms) waiting warns."""
  progress = hooks.ProgressHook(tf.constant(0.0), GLOBAL_BATCH, NUM_TOWERS,
                                None, 1)
  hook = scaling.ScalingReportHook(progress, on_gpu=False)
  throughput = hooks.Throughput(step=5, steps=4, seconds=0.04,
                                global_batch_size=GLOBAL_BATCH,
                                num_towers=NUM_TOWERS)
  with caplog.at_level(logging.INFO, logger="absl"):
    hook._report(scaling.ScalingReport(  # pylint: disable=protected-access
        throughput, scaling.InputWait("IteratorGetNext", input_ms, 10.0)))
  warnings = [m for m in messages(caplog, logging.WARNING)
              if "input-bound" in m]
  assert len(warnings) == int(warns)
  # 4 steps x 16 examples in 0.04 s = 1600 examples/sec, 800 per tower.
  assert any("1600.0 examples/sec (800.0 per tower x 2 towers" in m
             for m in messages(caplog, logging.INFO))


def test_log_line_arithmetic(run_config, caplog):
  with caplog.at_level(logging.INFO, logger="absl"):
    hook = train(run_config, DELAY, every_n_steps=3, max_steps=7)
  infos = messages(caplog, logging.INFO)
  lines = [m for m in map(LINE_RE.search, infos) if m]
  progress = {int(m.group(1)): float(m.group(2))
              for m in map(PROGRESS_RE.search, infos) if m}
  assert len(lines) == len(hook.reports) == 2
  # The first step starts the clock; reports after steps 4 and 7, 3 steps
  # each. The global step is read while the step's train_op increments it.
  assert [int(m.group(1)) for m in lines] in ([3, 6], [4, 7])
  for match, report in zip(lines, hook.reports):
    step, rate, per_tower, towers, batch, ms, steps, wait = match.groups()
    throughput = report.throughput
    assert (int(towers), int(batch), int(steps)) == (2, 16, 3)
    assert (int(step), throughput.steps) == (throughput.step, 3)
    # One measurement: the progress line of the same step shows the same
    # examples/sec, which is 3 steps x 16 examples over the window.
    assert float(rate) == progress[int(step)]
    assert float(rate) == pytest.approx(3 * 16 / throughput.seconds, abs=0.06)
    assert float(ms) == pytest.approx(1000 * throughput.seconds / 3, abs=0.06)
    # The line agrees with itself: per tower = rate / 2 towers, and
    # rate x ms/step = 16 examples x 1000 ms/s, up to the rounding of each
    # to 0.1: |r m - 16000| <= 0.05 m + 0.05 r (+ 0.0025).
    assert float(per_tower) == pytest.approx(float(rate) / 2, abs=0.06)
    assert abs(float(rate) * float(ms) - 16 * 1000) <= 0.06 * (
        float(rate) + float(ms))
    wait_share = report.input_wait.input_ms / report.input_wait.step_ms
    assert int(wait) == round(100 * wait_share)


@pytest.mark.parametrize("on_gpu,global_batch,towers,warned", [
    (True, 48, 4, True),     # 12 per tower on GPUs.
    (True, 64, 4, False),    # 16 per tower: enough.
    (False, 48, 4, False),   # CPU towers: no GPU advice.
])
def test_small_per_tower_batch_warning(caplog, on_gpu, global_batch, towers,
                                       warned):
  hook = make_report_hook(global_batch, towers, on_gpu=on_gpu)
  with caplog.at_level(logging.INFO, logger="absl"), tf.Graph().as_default():
    hook.begin()
  found = [m for m in messages(caplog, logging.WARNING) if "per-tower" in m]
  assert bool(found) == warned
  if warned:
    # 16 per tower x 4 towers = 64; 48 // 16 = 3 towers at this batch.
    assert "12 examples" in found[0]
    assert "at least 64" in found[0] and "at most 3" in found[0]


def test_input_wait_from_step_stats():
  stats = tf1.RunMetadata().step_stats
  device = stats.dev_stats.add(device="/cpu:0")
  for name, start, duration in (("IteratorGetNext", 1000, 30000),
                                ("dense/MatMul", 31000, 9000),
                                ("train_op", 40500, 500)):
    node = device.node_stats.add(node_name=name)
    node.all_start_micros, node.all_end_rel_micros = start, duration
  wait = scaling.input_wait_from_step_stats(stats, frozenset(
      ["IteratorGetNext"]))
  # 30 ms of input in a step from t=1 ms to t=41 ms: 40 ms, 75%.
  assert (wait.op_name, wait.input_ms, wait.step_ms) == (
      "IteratorGetNext", 30.0, 40.0)
  assert wait.share == 0.75
  assert scaling.input_wait_from_step_stats(stats, frozenset()) is None


@pytest.mark.parametrize("kwargs", [
    {"global_batch_size": 0, "num_towers": 1},
    {"global_batch_size": 8, "num_towers": 2, "every_n_steps": 0},
    {"global_batch_size": 8, "num_towers": 2, "input_bound_share": 1.5},
])
def test_bad_arguments(kwargs):
  with pytest.raises(ValueError):
    make_report_hook(**kwargs)
