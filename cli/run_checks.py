"""Advice a training run gets before its first step.

`warn_small_batch_norm`: batch norm normalizes each tower's shard with that
shard's mean and variance. With a handful of examples per tower those
statistics are noise: resnet_v1_50 at batch 4 on 2 towers (2 examples per
tower) reached a loss of 1.96e15 at step 1. Batch norm is known to degrade
below about 16 examples per device (Wu & He, "Group Normalization", 2018,
Figure 1), on any device, CPU towers included.
"""

from __future__ import annotations

from typing import Optional

from absl import logging
import tensorflow as tf

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
