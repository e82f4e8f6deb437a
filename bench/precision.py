"""Accumulation memory and mixed-precision speed: `python -m bench.precision`.

Side by side, each configuration in its own process (so peak memory is its
own), LeNet on synthetic 28x28 images on 2 virtual CPU towers, through
`multi_gpu` and its training hooks (as `Estimator.train` runs them):

- memory at equal effective batch: one batch of B vs k micro-batches of B/k
  (`accumulate_steps=k`). "Step memory" is the peak resident set during the
  timed steps minus the resident set after the session was set up (graph,
  variables, runtime), i.e. what the steps themselves allocate;
- speed: float32 vs `mixed_precision="bfloat16"` examples/sec at one batch.

Prints one markdown table; `--output` writes JSON. Compare ratios within one
run: the machine is shared.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("precision_batch", 1024,
                     "Effective batch (examples per update).")
flags.DEFINE_integer("precision_micro_batches", 8,
                     "k for the accumulation run.")
flags.DEFINE_integer("precision_speed_batch", 128,
                     "Batch of the float32 vs bfloat16 "
                     "runs.")
flags.DEFINE_integer("precision_steps", 6,
                     "Timed updates per run (after 2 warm-up).")
flags.DEFINE_string("precision_config", None,
                    "Internal: run one configuration (JSON).")
flags.DEFINE_string("precision_output", None,
                    "Where to write the JSON results.")


def _rss_mb() -> float:
  with open("/proc/self/statm") as statm:
    return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_one(config: dict) -> dict:
  """Builds and times one configuration in this process."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import estimator_multigpu as emg  # pylint: disable=g-import-not-at-top

  import classifier  # pylint: disable=g-import-not-at-top
  tf.get_logger().setLevel("ERROR")
  tf1 = tf.compat.v1
  session_config = emg.make_session_config(num_cpus=2)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    rng = np.random.RandomState(0)
    images = rng.rand(config["batch"], 28, 28, 1).astype(np.float32)
    labels = rng.randint(0, 10, config["batch"]).astype(np.int32)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
    features, targets = tf1.data.make_one_shot_iterator(dataset).get_next()
    model_fn = emg.multi_gpu(
        classifier.model_fn, devices=["/cpu:0", "/cpu:1"],
        accumulate_steps=config["k"], mixed_precision=config["precision"])
    spec = model_fn(features, targets, tf.estimator.ModeKeys.TRAIN,
                    {"classifier": classifier.ClassifierConfig()},
                    tf.estimator.RunConfig(session_config=session_config))
    with tf1.train.SingularMonitoredSession(
        hooks=spec.training_hooks, config=session_config) as session:
      set_up_mb = _rss_mb()
      for _ in range(2):
        session.run(spec.train_op)
      started = time.perf_counter()
      for _ in range(config["steps"]):
        session.run(spec.train_op)
      seconds = time.perf_counter() - started
  peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
  examples = config["batch"] * config["k"] * config["steps"]
  return dict(config, examples_per_sec=examples / seconds,
              peak_rss_mb=peak_mb, step_memory_mb=peak_mb - set_up_mb)


def configurations() -> list:
  k, batch = FLAGS.precision_micro_batches, FLAGS.precision_batch
  steps = FLAGS.precision_steps
  return [
      dict(name="one batch", batch=batch, k=1, precision=None, steps=steps),
      dict(name=f"{k} micro-batches", batch=batch // k, k=k, precision=None,
           steps=steps),
      dict(name="float32", batch=FLAGS.precision_speed_batch, k=1,
           precision=None,
           steps=steps),
      dict(name="bfloat16", batch=FLAGS.precision_speed_batch, k=1,
           precision="bfloat16", steps=steps),
  ]


def table(results: list) -> str:
  big, accumulated, float32, bfloat16 = results
  ratio = lambda a, b, key: a[key] / b[key]
  lines = ["| run | batch x k | examples/sec | peak RSS MB | step memory MB |",
           "|---|---|---|---|---|"]
  for r in results:
    lines.append(f"| {r['name']} "
                 f"| {r['batch']} x {r['k']} | {r['examples_per_sec']:.0f} "
                 f"| {r['peak_rss_mb']:.0f} | {r['step_memory_mb']:.0f} |")
  lines += [
      "",
      f"Step memory, {accumulated['name']} / one batch of {big['batch']}: "
      f"{ratio(accumulated, big, 'step_memory_mb'):.2f}x (peak RSS "
      f"{ratio(accumulated, big, 'peak_rss_mb'):.2f}x); speed "
      f"{ratio(accumulated, big, 'examples_per_sec'):.2f}x.",
      f"bfloat16 / float32 examples/sec at batch {float32['batch']}: "
      f"{ratio(bfloat16, float32, 'examples_per_sec'):.3f}x."]
  return "\n".join(lines)


def main(argv):
  del argv
  if FLAGS.precision_config:
    print(json.dumps(run_one(json.loads(FLAGS.precision_config))))
    return
  results = []
  for config in configurations():
    output = subprocess.run(
        [sys.executable, "-m", "bench.precision",
         f"--precision_config={json.dumps(config)}"], check=True,
        capture_output=True,
        text=True).stdout
    results.append(json.loads(output.strip().splitlines()[-1]))
  print(table(results))
  if FLAGS.precision_output:
    with open(FLAGS.precision_output, "w") as out:
      json.dump(results, out, indent=1)


if __name__ == "__main__":
  app.run(main)
