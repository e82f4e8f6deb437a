"""Advice a training run gets before its first step.

`warn_small_batch_norm`: batch norm normalizes each tower's shard with that
shard's mean and variance. With a handful of examples per tower those
statistics are noise: resnet_v1_50 at batch 4 on 2 towers (2 examples per
tower) reached a loss of 1.96e15 at step 1. Batch norm is known to degrade
below about 16 examples per device (Wu & He, "Group Normalization", 2018,
Figure 1), on any device, CPU towers included.

`warn_unreached_peak`: a warm-up longer than the run (`--max_steps` below
`--warmup_steps`) never reaches the requested `--learning_rate`; the
warning names the peak the run's own schedule (`classifier.learning_rate`)
reaches. `check_sync_batch_norm`: `--sync_batch_norm` on a net without
batch norm would change nothing, so it is refused.
"""

from __future__ import annotations

from typing import Optional, Tuple

from absl import logging
import tensorflow as tf

import classifier
import nets

MIN_BATCH_NORM_PER_TOWER = 16
BATCH_NORM_OP_TYPES = frozenset(["FusedBatchNorm", "FusedBatchNormV2",
                                 "FusedBatchNormV3"])


def has_batch_norm(graph: tf.Graph) -> bool:
  """Whether the graph normalizes with batch statistics (fused or not)."""
  return any(op.type in BATCH_NORM_OP_TYPES or
             ("batchnorm" in op.name.lower() and op.type == "Mean")
             for op in graph.get_operations())


def small_batch_norm_advice(global_batch_size: int, num_towers: int,
                            sync_batch_norm: bool = False,
                            min_per_tower: int = MIN_BATCH_NORM_PER_TOWER
                            ) -> Optional[str]:
  """The warning text when batch norm sees too few examples; else None."""
  per_tower = global_batch_size // num_towers
  normalized = global_batch_size if sync_batch_norm else per_tower
  if normalized >= min_per_tower:
    return None
  if sync_batch_norm or num_towers == 1 or (
      global_batch_size < min_per_tower):
    fix = (f"Raise --batch_size to at least {min_per_tower * num_towers} "
           f"({min_per_tower} per tower)" + (
               "" if sync_batch_norm or num_towers == 1 else
               f", or to at least {min_per_tower} with --sync_batch_norm"))
  else:
    fix = (f"Pass --sync_batch_norm to normalize over the global batch "
           f"({global_batch_size} examples), or raise --batch_size to at "
           f"least {min_per_tower * num_towers}")
  where = ("the global batch (--sync_batch_norm)" if sync_batch_norm else
           f"the per-tower batch (global batch {global_batch_size} over "
           f"{num_towers} tower{'s' if num_towers > 1 else ''})")
  return (f"The net uses batch norm and {where} is {normalized} examples: "
          f"statistics over fewer than {min_per_tower} examples are noisy "
          f"and training can diverge. {fix}.")


def warn_small_batch_norm(graph: tf.Graph, global_batch_size: int,
                          num_towers: int,
                          sync_batch_norm: bool = False) -> Optional[str]:
  """Logs (and returns) the advice when the graph has batch norm."""
  advice = small_batch_norm_advice(global_batch_size, num_towers,
                                   sync_batch_norm)
  if advice and has_batch_norm(graph):
    logging.warning(advice)
    return advice
  return None


def peak_learning_rate(config: classifier.ClassifierConfig, max_steps: int,
                       chunk: int = 1 << 20) -> Tuple[float, int]:
  """(the largest learning rate, its first global step) of the schedule the
  run builds (`classifier.learning_rate`), over the steps it trains: global
  steps 0 .. max_steps - 1, evaluated `chunk` steps at a time."""
  with tf.Graph().as_default():
    start = tf.compat.v1.placeholder(tf.int32, [])
    steps = tf.range(start, tf.minimum(start + chunk, max_steps))
    rates = tf.broadcast_to(classifier.learning_rate(config, steps),
                            tf.shape(steps))
    best = (tf.reduce_max(rates), tf.argmax(rates, output_type=tf.int32))
    found = []
    with tf.compat.v1.Session() as session:
      for first in range(0, max(max_steps, 1), chunk):
        rate, index = session.run(best, {start: first})
        found.append((float(rate), first + int(index)))
  return max(found, key=lambda pair: (pair[0], -pair[1]))  # the first.


def unreached_peak_advice(config: classifier.ClassifierConfig,
                          max_steps: int) -> Optional[str]:
  """The warning text when the run stops before its schedule's peak; else
  None."""
  peak, step = peak_learning_rate(config, max_steps)
  if peak >= config.learning_rate * (1 - 1e-5):
    return None
  return (f"--max_steps={max_steps} ends before the warm-up "
          f"(--warmup_steps={config.warmup_steps}) does: the learning rate "
          f"peaks at {peak:.4g} (step {step}), not the requested "
          f"--learning_rate={config.learning_rate:g}. Raise --max_steps "
          f"above {config.warmup_steps}, or lower --warmup_steps to at most "
          f"{max_steps}.")


def warn_unreached_peak(config: classifier.ClassifierConfig,
                        max_steps: int) -> Optional[str]:
  """Logs (and returns) `unreached_peak_advice` when there is any."""
  advice = unreached_peak_advice(config, max_steps)
  if advice:
    logging.warning(advice)
  return advice


def net_has_batch_norm(model_name: str) -> bool:
  """Whether the training graph of the net normalizes with batch statistics
  (built once, on one image of its default size, in a graph of its own)."""
  with tf.Graph().as_default() as graph:
    network_fn = nets.get_network_fn(model_name, 2, is_training=True)
    size = network_fn.default_image_size
    network_fn(tf.compat.v1.placeholder(tf.float32, [1, size, size, 3]))
  return has_batch_norm(graph)


def check_sync_batch_norm(sync_batch_norm: bool, model_name: str) -> None:
  """Refuses `--sync_batch_norm` for a net without batch norm.

  Raises:
    ValueError: naming the net, and the fix.
  """
  if sync_batch_norm and not net_has_batch_norm(model_name):
    raise ValueError(
        f"--sync_batch_norm was given, but --model_name={model_name} has no "
        "batch-norm layer, so the flag would have no effect (it synchronizes "
        "the batch norm of nets such as resnet_v1_50 and inception_v3); "
        "drop --sync_batch_norm.")
