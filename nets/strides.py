"""How far a net downsamples its images, read from the graph it built.

A net of SAME padding (the ResNets) builds at any image size, but each
strided convolution or pooling halves (or more) its feature map; once the
map is smaller than a layer's stride, that layer has nothing left to
reduce, and the layers after it see no image (resnet_v1_50 on 8x8 images
trains and diverges). `collapsed_stride` finds the first such layer among
those the images flow through. A net's last reduction before its logits (a
global pooling, e.g. inception_v2's average pool, which tf-slim shrinks to
the map it gets) is not one: nothing spatial comes after it. The size a net
takes is its total stride: the product of the strides along the images'
path (the largest over its branches).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Set

import tensorflow as tf

# Layers that convolve or pool over the height and width of an NHWC map.
SPATIAL_TYPES = ("Conv2D", "DepthwiseConv2dNative", "MaxPool", "AvgPool")


@dataclasses.dataclass(frozen=True)
class Collapse:
  """The first strided layer whose input map is smaller than its stride."""
  op_name: str
  stride: int
  input_size: int  # the smaller of its input map's height and width.
  total: int  # the net's total stride: the smallest image size it takes.


def collapsed_stride(graph: tf.Graph, images: tf.Tensor) -> Optional[Collapse]:
  """The first layer the images' map collapses at (None: none does).

  Args:
    graph: the graph the net was built in, on `images`.
    images: the NHWC images the net was called on (static height, width).
  """
  ops = graph.get_operations()  # in creation order: inputs first.
  strides = _input_strides(ops, images)
  counted = _followed_by_spatial(ops) & set(strides)
  total = max([strides[op] * _stride(op) for op in counted] or [1])
  for op in ops:
    if op in counted and _map_size(op) < _stride(op):
      return Collapse(op.name, _stride(op), _map_size(op), total)
  return None


def _input_strides(ops: list, images: tf.Tensor) -> Dict:
  """{strided layer the images reach: the total stride of its input}."""
  reached = {images.op: 1}  # op -> the total stride of its outputs.
  found = {}
  for op in ops:
    seen = [reached[t.op] for t in op.inputs if t.op in reached]
    if op is images.op or not seen:
      continue
    if _stride(op) > 1:
      found[op] = max(seen)
    reached[op] = max(seen) * _stride(op)
  return found


def _followed_by_spatial(ops: list) -> Set:
  """The ops from whose outputs a spatial layer (a kernel or stride above
  1) is reached."""
  before = set()
  for op in reversed(ops):
    if any(consumer in before or _is_spatial(consumer)
           for output in op.outputs for consumer in output.consumers()):
      before.add(op)
  return before


def _is_spatial(op: tf.Operation) -> bool:
  return _stride(op) > 1 or max(_kernel(op)) > 1


def _is_nhwc(op: tf.Operation) -> bool:
  return (op.type in SPATIAL_TYPES and op.inputs[0].shape.rank == 4 and
          op.get_attr("data_format") in (b"NHWC", "NHWC"))


def _stride(op: tf.Operation) -> int:
  """The larger of the op's height and width strides (1: not a layer)."""
  return max(op.get_attr("strides")[1:3]) if _is_nhwc(op) else 1


def _kernel(op: tf.Operation) -> list:
  """The op's kernel height and width ([1, 1]: not a layer)."""
  if not _is_nhwc(op):
    return [1, 1]
  if op.type.endswith("Pool"):
    return list(op.get_attr("ksize")[1:3])
  return [d or 1 for d in op.inputs[1].shape.as_list()[:2]]


def _map_size(op: tf.Operation) -> int:
  return min(d or 1 << 30 for d in op.inputs[0].shape.as_list()[1:3])
