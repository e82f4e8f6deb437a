"""Graph-construction time of `multi_gpu` for several tower counts.

`python -m bench.graphbuild JSON` with JSON {"model": ..., "towers": [1, 2,
4, 8], "tensor_equality": true|false, "repeats": r}. Each count is built r
times, each in a fresh `tf.Graph`, after one discarded warm-up build (lazy
imports, caches), and the fastest build is kept (other load on the machine
only ever adds time to this deterministic work); the time
is the wrapped model_fn's call in TRAIN mode: every tower, the gradient
aggregation and the single apply. Graph construction is single-threaded
Python, so two of these processes can run side by side on two cores.

`tensor_equality: false` calls `tf.compat.v1.disable_tensor_equality()`
first, to measure the known cost of Keras legacy layers (tf-slim batch norm)
building a set of all global variables on every `add_weight`.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import estimator_multigpu as emg  # pylint: disable=g-import-not-at-top

from bench import models  # pylint: disable=g-import-not-at-top
from bench import protocol  # pylint: disable=g-import-not-at-top
from bench import specs  # pylint: disable=g-import-not-at-top

tf1 = tf.compat.v1


def build_seconds(spec: specs.ModelSpec, num_towers: int) -> float:
  """Seconds to build the `num_towers`-tower training graph of `spec`."""
  devices = [f"/cpu:{k}" for k in range(num_towers)]
  config = tf.estimator.RunConfig(
      session_config=emg.make_session_config(num_cpus=num_towers))
  with tf.Graph().as_default():
    shape = [spec.global_batch_size, spec.image_size, spec.image_size,
             spec.channels]
    features = tf1.placeholder(tf.float32, shape)
    labels = tf1.placeholder(tf.int32, [spec.global_batch_size])
    model_fn = emg.multi_gpu(models.make_model_fn(spec, True), devices=devices)
    start = time.perf_counter()
    model_fn(features, labels, tf.estimator.ModeKeys.TRAIN, {}, config)
    return time.perf_counter() - start


def main(argv: list) -> None:
  job = json.loads(argv[1])
  tf.get_logger().setLevel("ERROR")
  if not job["tensor_equality"]:
    tf1.disable_tensor_equality()
  spec = specs.get_model(job["model"])
  build_seconds(spec, 1)  # warm-up, discarded.
  seconds = {str(k): min(build_seconds(spec, k)
                         for _ in range(job.get("repeats", 1)))
             for k in job["towers"]}
  protocol.send("graph", seconds=seconds, max_rss_mb=protocol.max_rss_mb())


if __name__ == "__main__":
  main(sys.argv)
