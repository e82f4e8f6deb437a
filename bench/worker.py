"""One benchmarked system in its own process: `python -m bench.worker JSON`.

JSON: a `bench.schedule.Job` ({"system": ..., "towers": k, "model": ...,
"kind": "cpu"|"gpu", "intra_op": 0, "inter_op": 0}). Its
own process keeps TensorFlow's device set-up (MirroredStrategy's logical CPU
devices must exist before TensorFlow initialises devices) and its peak memory
apart from every other system's. Talks `bench.protocol` on stdin/stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def split_cpu(num_devices: int) -> None:
  """Logical CPU devices for MirroredStrategy, before TF initialises any."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)


def main(argv: list) -> None:
  started = time.perf_counter()
  job = json.loads(argv[1])
  if job["system"] == "mirrored" and job["kind"] == "cpu":
    split_cpu(job["towers"])
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from bench import protocol  # pylint: disable=g-import-not-at-top
  from bench import specs  # pylint: disable=g-import-not-at-top
  from bench import systems  # pylint: disable=g-import-not-at-top
  tf.get_logger().setLevel("ERROR")
  spec = specs.get_model(job["model"], on_gpu=job["kind"] == "gpu")
  pacer = protocol.Pacer(started)
  if job["system"] in ("tutorial", "split"):
    systems.run_tutorial(spec, job, pacer)
  else:
    systems.run_estimator(spec, job, pacer)


if __name__ == "__main__":
  main(sys.argv)
