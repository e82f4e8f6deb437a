"""Soak benchmark: 4 towers for thousands of steps; memory and step time flat.

    python -m bench.soak [--steps 4000] [--towers 4] [--window 500]

Trains the MLP classifier on synthetic 8x8 images through `multi_gpu` on
virtual CPU towers, and every `--window` steps records the resident set size
(/proc/self/statm) and the mean step time of the window. It checks that the
graph is finalized (no op can be added per step) and reports the growth from
the second window to the last (the first includes warm-up). A benchmark, not
a test: the numbers go to stdout as a markdown table.
"""

from __future__ import annotations

import os
import resource
import statistics
import tempfile
import time

from absl import app
from absl import flags
import tensorflow as tf

import estimator_multigpu as emg

import classifier
import datasets

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 4000, "Training steps.")
flags.DEFINE_integer("towers", 4, "Virtual CPU towers.")
flags.DEFINE_integer("window", 500, "Steps per measurement window.")
flags.DEFINE_integer("batch_size", 64, "Global batch size.")
tf1 = tf.compat.v1


def resident_mb() -> float:
  with open("/proc/self/statm") as statm:
    pages = int(statm.read().split()[1])
  return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class WindowHook(tf1.train.SessionRunHook):
  """Records (step, resident MB, mean step seconds) every `window` steps."""

  def __init__(self, window: int):
    self.window = window
    self.rows: list = []
    self.finalized = None

  def after_create_session(self, session, coord):
    self.finalized = session.graph.finalized
    self._steps, self._start = 0, time.perf_counter()

  def after_run(self, run_context, run_values):
    self._steps += 1
    if self._steps % self.window == 0:
      now = time.perf_counter()
      self.rows.append((self._steps, resident_mb(),
                        (now - self._start) / self.window))
      self._start = now


def run(steps: int, towers: int, window: int, batch_size: int) -> WindowHook:
  hook = WindowHook(window)
  config = classifier.ClassifierConfig(model_name="mlp", num_classes=10)
  estimator = tf.estimator.Estimator(
      emg.multi_gpu(classifier.model_fn,
                    devices=[f"/cpu:{k}" for k in range(towers)]),
      params={"classifier": config},
      config=tf.estimator.RunConfig(
          model_dir=tempfile.mkdtemp(prefix="soak"),
          session_config=emg.make_session_config(num_cpus=towers),
          save_checkpoints_steps=None, save_checkpoints_secs=None,
          save_summary_steps=None, log_step_count_steps=None))
  input_fn = datasets.make_input_fn("synthetic", "train", batch_size,
                                image_size=8, channels=1, num_classes=10)
  estimator.train(input_fn, max_steps=steps, hooks=[hook])
  return hook


def report(hook: WindowHook) -> str:
  lines = ["| steps | resident MB | ms/step |", "|---:|---:|---:|"]
  lines += [f"| {s} | {mb:.1f} | {1000 * t:.2f} |" for s, mb, t in hook.rows]
  steady = hook.rows[1:] or hook.rows
  times = [t for _, _, t in steady]
  lines.append("")
  lines.append(f"graph finalized during training: {hook.finalized}")
  lines.append(f"resident memory, window 2 -> last: {steady[0][1]:.1f} -> "
               f"{steady[-1][1]:.1f} MB ({steady[-1][1] - steady[0][1]:+.1f})")
  lines.append(f"step time, window 2 -> last: {1000 * times[0]:.2f} -> "
               f"{1000 * times[-1]:.2f} ms (median {1000 * statistics.median(times):.2f}, "
               f"spread {100 * (max(times) - min(times)) / statistics.median(times):.0f}%)")
  lines.append(f"peak resident (ru_maxrss): "
               f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MB")
  return "\n".join(lines)


def main(argv):
  del argv
  print(report(run(FLAGS.steps, FLAGS.towers, FLAGS.window, FLAGS.batch_size)))


if __name__ == "__main__":
  app.run(main)
