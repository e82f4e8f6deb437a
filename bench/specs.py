"""The benchmarked models as plain data (no TensorFlow import), so the
coordinator stays light and only the workers load TensorFlow."""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A network from `nets/`, its input and its global batch on this host."""
  name: str
  net_name: str
  image_size: int
  channels: int
  global_batch_size: int
  num_classes: int = 10
  hidden_units: Optional[tuple] = None  # the MLP's layer widths.


MODELS = {
    # A 3-layer MLP (784-1024-1024-10): matmul-bound, cheap per step.
    "mlp": ModelSpec("mlp", "mlp", 28, 1, 256, hidden_units=(1024, 1024)),
    # LeNet-5 style CNN from nets/ on 28x28 digits-sized images.
    "lenet": ModelSpec("lenet", "lenet", 28, 1, 128),
    # ResNet-50 (batch norm, 25.6M parameters at 1000 classes) on 32x32.
    "resnet_v1_50": ModelSpec("resnet_v1_50", "resnet_v1_50", 32, 3, 32,
                              num_classes=1000),
}
# Models with batch norm: also benchmarked with `sync_batch_norm=True`.
BATCH_NORM_MODELS = ("resnet_v1_50",)
GPU_IMAGE_SIZE = {"resnet_v1_50": 224}  # full-size images on a GPU host.
GPU_BATCH_SIZE = {"resnet_v1_50": 256}  # 64 per GPU at 4 towers.


def get_model(name: str, on_gpu: bool = False) -> ModelSpec:
  """The named model; ResNet gets 224x224 images on a GPU host."""
  if name not in MODELS:
    raise ValueError(f"Unknown model {name!r}; expected one of "
                     f"{', '.join(MODELS)}.")
  spec = MODELS[name]
  if on_gpu and name in GPU_IMAGE_SIZE:
    spec = dataclasses.replace(spec, image_size=GPU_IMAGE_SIZE[name],
                               global_batch_size=GPU_BATCH_SIZE[name])
  return spec
