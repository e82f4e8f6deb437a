"""Which GPUs this process may see: the helpers behind `devices.pin_gpus`.

`CUDA_VISIBLE_DEVICES` is read once, when the CUDA driver initialises, so
pinning must happen before anything lists or uses devices.
`parse_gpu_ids` checks what the user asked for, `visible_devices_value`
translates it into the variable's value (ids count the GPUs the process
started with), and `gpus_fixed_reason` says whether it is already too late.
"""

from __future__ import annotations

import ctypes
import re
from typing import Optional, Sequence, Union

from estimator_multigpu import compat

context = compat.internal("eager_context")



GpuIds = Union[str, Sequence[Union[int, str]]]


def parse_gpu_ids(gpu_ids: GpuIds) -> list[int]:
  """`[1, 3]`, `"1,3"`, `["1", "3"]` -> `[1, 3]`; checks the values."""
  items = gpu_ids.split(",") if isinstance(gpu_ids, str) else gpu_ids
  if not isinstance(items, (list, tuple)):
    raise TypeError(
        f"`gpu_ids` must be a list of ints or a string like '1,3'; got "
        f"{gpu_ids!r}. Example: pin_gpus([1, 3]).")
  ids = [_parse_gpu_id(item) for item in items
         if not (isinstance(item, str) and not item.strip())]
  if len(set(ids)) != len(ids):
    raise ValueError(
        f"`gpu_ids` {ids} names a GPU more than once; each GPU is listed "
        "once. Remove the duplicates.")
  return ids


def _parse_gpu_id(item: Union[int, str]) -> int:
  if isinstance(item, str) and re.fullmatch(r"[0-9]+", item.strip()):
    return int(item)
  if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
    return item
  raise ValueError(
      f"`gpu_ids` entry {item!r} is not a GPU id; expected an int >= 0 (or "
      "its digits as a string), e.g. pin_gpus([1, 3]) or pin_gpus('1,3').")


def visible_devices_value(gpu_ids: Sequence[int],
                          started_with: Optional[str]) -> str:
  """The `CUDA_VISIBLE_DEVICES` value that shows exactly `gpu_ids`.

  Args:
    gpu_ids: indices of the GPUs to keep, counted as the process saw them.
    started_with: the process's `CUDA_VISIBLE_DEVICES` (None when unset).

  Returns:
    e.g. "1,3"; "5,7" when it started with "4,5,6,7"; "-1" for no GPU.
  """
  if not gpu_ids:
    return "-1"
  if started_with is None:
    return ",".join(map(str, gpu_ids))
  entries = [entry.strip() for entry in started_with.split(",")
             if entry.strip()]
  outside = [k for k in gpu_ids if k >= len(entries)]
  if outside:
    raise ValueError(
        f"`gpu_ids` asks for GPU {outside[0]}, but this process was started "
        f"with CUDA_VISIBLE_DEVICES={started_with!r}, which shows "
        f"{len(entries)} GPU(s) (ids 0..{len(entries) - 1}). Ask for ids "
        "below that, or change CUDA_VISIBLE_DEVICES where the job starts.")
  return ",".join(entries[k] for k in gpu_ids)


def gpus_fixed_reason() -> Optional[str]:
  """Why this process's set of GPUs can no longer change, or None.

  Checks, in order: TensorFlow's eager context has been initialised
  (`context.context()._context_handle` is set: any eager op,
  `tf.config.list_logical_devices`, ...); TensorFlow has listed the physical
  devices (`context.context()._physical_devices` is set:
  `tf.config.list_physical_devices`, a `tf.compat.v1.Session`, an Estimator);
  the CUDA driver is initialised (`cuDeviceGetCount` from libcuda succeeds:
  `device_lib.list_local_devices`, another CUDA library). The first two are
  private TensorFlow attributes, read defensively; the last needs libcuda
  and is skipped on machines without it.
  """
  ctx = context.context()
  if compat.private(ctx, "_context_handle", None) is not None:
    return "TensorFlow's runtime is already initialised"
  if compat.private(ctx, "_physical_devices", None) is not None:
    return "TensorFlow has already listed the physical devices"
  if _cuda_driver_initialized():
    return "the CUDA driver is already initialised in this process"
  return None


def _cuda_driver_initialized() -> bool:
  """Whether libcuda has been initialised (cuInit) in this process."""
  try:
    libcuda = ctypes.CDLL("libcuda.so.1")
  except OSError:
    return False
  count = ctypes.c_int(0)
  # CUDA_SUCCESS (0) once cuInit ran; CUDA_ERROR_NOT_INITIALIZED (3) before.
  return libcuda.cuDeviceGetCount(ctypes.byref(count)) == 0
