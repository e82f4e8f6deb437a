"""Devices: parse tower device requests, check them, and build session configs.

Every device string the library hands to `tf.device` is canonical
(`/device:GPU:0`), whatever spelling the user gave (`/gpu:0`, `/GPU:0`,
`gpu:0`, `/device:GPU:0`). A requested device that the session will not have
is an error listing the devices it does have: TensorFlow's soft placement would
otherwise run a "GPU" tower silently on the CPU.

Single-machine recipes: `pin_gpus([1, 3])` restricts the process to chosen
GPUs before TensorFlow initialises them; `make_session_config` sets virtual
CPUs, GPU memory growth and a GPU memory fraction; `local_devices()` and
`physical_devices()` list the devices (`topology`: the listings, what each
initialises, the GPUs' peer access and the aggregation device;
`gpu_visibility`: which GPUs the process may see, behind `pin_gpus`);
`python -m estimator_multigpu.devices` prints them.
"""

from __future__ import annotations

import os
import re
from typing import Optional, Sequence, Union

from absl import logging
import tensorflow as tf

from estimator_multigpu.devices import gpu_visibility
from estimator_multigpu.devices import topology

# Re-exported: the device listings live in topology.py.
DeviceRecord = topology.DeviceRecord
aggregation_device_for = topology.aggregation_device_for
short_name = topology.short_name
device_report = topology.device_report
local_devices = topology.local_devices
physical_devices = topology.physical_devices

tf1 = tf.compat.v1

DeviceRequest = Union[None, int, Sequence[str]]
GpuIds = gpu_visibility.GpuIds

_DEVICE_RE = re.compile(r"^/?(?:device:)?(cpu|gpu):(\d+)$", re.IGNORECASE)


def canonical_device(spelling: str, option: str = "devices") -> str:
  """Returns the canonical form (`/device:GPU:0`) of one device spelling.

  Args:
    spelling: `/gpu:0`, `/GPU:0`, `/device:GPU:0`, `gpu:0`, `/cpu:1`, ...
    option: the option that gave it, named in the errors.

  Raises:
    TypeError: `spelling` is not a string.
    ValueError: it does not name a CPU or GPU with an index.
  """
  if not isinstance(spelling, str):
    kind = "entries must be strings" if option == "devices" else (
        "must be a string")
    raise TypeError(
        f"`{option}` {kind} like '/gpu:0'; got {spelling!r} of type "
        f"{type(spelling).__name__}.")
  match = _DEVICE_RE.match(spelling.strip())
  if not match:
    raise ValueError(
        f"`{option}` {spelling!r} is not a device this library can "
        "place a tower on; expected '/gpu:<k>' or '/cpu:<k>' (also spelled "
        "'/GPU:<k>', '/device:GPU:<k>'). Fix the spelling, e.g. '/gpu:0'.")
  return f"/device:{match.group(1).upper()}:{int(match.group(2))}"


def num_visible_gpus() -> int:
  """Number of GPUs this process can see (respects CUDA_VISIBLE_DEVICES)."""
  return len(tf.config.list_physical_devices("GPU"))


def resolve_devices(devices: DeviceRequest) -> list[str]:
  """Turns the `devices` option into a list of canonical tower devices.

  Args:
    devices: None (all visible GPUs, else one CPU tower), an int n (the first
      n GPUs), or a non-empty list of device strings.

  Returns:
    Canonical device strings, one per tower.

  Raises:
    TypeError, ValueError: the request is malformed (message says how to fix).
  """
  if devices is None:
    gpus = num_visible_gpus()
    return ([f"/device:GPU:{k}" for k in range(gpus)] if gpus
            else ["/device:CPU:0"])
  if isinstance(devices, bool) or isinstance(devices, (float, str, bytes)):
    raise TypeError(
        f"`devices` must be None, an int or a list of device strings; got "
        f"{devices!r}. Example: devices=2 or devices=['/gpu:0', '/gpu:1'].")
  if isinstance(devices, int):
    return _first_gpus(devices)
  devices = [canonical_device(d) for d in devices]
  if not devices:
    raise ValueError(
        "`devices` is an empty list; expected at least one device such as "
        "'/gpu:0'. Pass devices=None to use every visible GPU.")
  _check_unique(devices)
  return devices


def _first_gpus(count: int) -> list[str]:
  if count < 1:
    raise ValueError(
        f"`devices`={count} asks for {count} GPUs; expected an int >= 1, "
        "None (all visible GPUs) or a list such as ['/gpu:0', '/gpu:1'].")
  return [f"/device:GPU:{k}" for k in range(count)]


def _check_unique(devices: list[str]) -> None:
  repeated = sorted({d for d in devices if devices.count(d) > 1})
  if repeated:
    raise ValueError(
        f"`devices` lists {', '.join(map(short_name, repeated))} more than "
        "once; each tower needs its own device. Remove the duplicates.")


def session_devices(session_config: Optional[tf1.ConfigProto]) -> list[str]:
  """The local CPU and GPU devices a session with this config will have."""
  count = dict(session_config.device_count) if session_config else {}
  cpus = count.get("CPU", 1)
  gpus = min(count.get("GPU", num_visible_gpus()), num_visible_gpus())
  visible = session_config.gpu_options.visible_device_list if (
      session_config) else ""
  if visible:
    gpus = min(gpus, len(visible.split(",")))
  return ([f"/device:CPU:{k}" for k in range(cpus)] +
          [f"/device:GPU:{k}" for k in range(gpus)])


_HOW_TO_GET_CPUS = {
    "multi_gpu": (
        "for N towers on a CPU machine give the RunConfig "
        "session_config=estimator_multigpu.make_session_config(num_cpus=N) "
        "and devices=['/cpu:0', ..., '/cpu:N-1']"),
    "make_parallel": (
        "for /cpu:1 and up pass make_parallel(..., session_config="
        "estimator_multigpu.make_session_config(num_cpus=N)) and run the "
        "graph in a session with that config"),
}


def check_devices_exist(devices: Sequence[str],
                        session_config: Optional[tf1.ConfigProto],
                        api: str = "multi_gpu") -> None:
  """Raises ValueError when a device is not one the session will have.

  Args:
    devices: canonical device strings.
    session_config: the config of the session that will run the graph.
    api: "multi_gpu" (the session is Estimator's, configured by the
      RunConfig) or "make_parallel" (any session: without a config, only
      GPUs, which the process must see, are checked; any `/cpu:k` is taken).
  """
  if session_config is None and api == "make_parallel":
    available = [f"/device:GPU:{k}" for k in range(num_visible_gpus())]
    devices = [d for d in devices if "GPU" in d]
    lacks, has = "this process does not see", "it sees"
  else:
    available = session_devices(session_config)
    lacks, has = "this session will not have", "it has"
  missing = [d for d in devices if d not in available]
  if missing:
    raise ValueError(
        f"`{api}` `devices` asks for {', '.join(map(short_name, missing))}, "
        f"which {lacks}; {has} "
        f"{', '.join(map(short_name, available)) or 'no GPU'}. Ask for "
        "existing devices (CUDA_VISIBLE_DEVICES limits the GPUs), or "
        f"{_HOW_TO_GET_CPUS[api]}.")


def make_session_config(num_cpus: int = 1,
                        gpu_memory_growth: bool = True,
                        allow_soft_placement: bool = True, *,
                        gpu_memory_fraction: Optional[float] = None
                        ) -> tf1.ConfigProto:
  """Builds a session config with `num_cpus` virtual CPU devices.

  `/cpu:0 ... /cpu:<num_cpus - 1>` then exist in every session built from it,
  which lets a CPU machine (or a test) run one tower per virtual CPU. GPUs
  get memory growth instead of TensorFlow grabbing all their memory at once.
  Soft placement stays on for ops without a kernel on the chosen device; the
  towers' own devices are checked by `multi_gpu` before the graph is built.

  Args:
    num_cpus: number of CPU devices the session exposes (>= 1).
    gpu_memory_growth: let GPU memory grow as needed.
    allow_soft_placement: passed to the ConfigProto.
    gpu_memory_fraction: cap each GPU's memory at this fraction of its total,
      in (0, 1]; None for no cap. With `gpu_memory_growth` the memory grows
      up to the cap, otherwise the whole fraction is reserved at start.

  Returns:
    A `tf.compat.v1.ConfigProto` for `tf.estimator.RunConfig(session_config=)`.
  """
  if isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or (
      num_cpus < 1):
    raise ValueError(
        f"`num_cpus` must be an int >= 1; got {num_cpus!r}.")
  config = tf1.ConfigProto(device_count={"CPU": num_cpus},
                           allow_soft_placement=allow_soft_placement)
  config.gpu_options.allow_growth = gpu_memory_growth
  if gpu_memory_fraction is not None:
    _check_fraction(gpu_memory_fraction)
    config.gpu_options.per_process_gpu_memory_fraction = gpu_memory_fraction
  return config


def _check_fraction(fraction: float) -> None:
  if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
    raise TypeError(
        f"`gpu_memory_fraction` must be a number or None; got {fraction!r}.")
  if not 0.0 < fraction <= 1.0:
    raise ValueError(
        f"`gpu_memory_fraction` is {fraction}; expected a number in (0, 1], "
        "e.g. 0.5 for half of each GPU's memory, or None for no cap.")


def pin_gpus(gpu_ids: GpuIds, *, verify: bool = True) -> str:
  """Makes only the GPUs `gpu_ids` visible, as `/gpu:0`, `/gpu:1`, ...

  Sets `CUDA_VISIBLE_DEVICES`, which CUDA reads once, when its driver is
  initialised. Call it first thing, before anything lists or uses devices:
  `tf.config.list_physical_devices`, a session, an Estimator, an eager op,
  `device_lib.list_local_devices` (or another CUDA library) all do.

  The ids count the GPUs this process was started with: with no
  `CUDA_VISIBLE_DEVICES`, nvidia-smi's numbering (`CUDA_DEVICE_ORDER` is set
  to `PCI_BUS_ID` unless already set); when a scheduler already set
  `CUDA_VISIBLE_DEVICES=4,5,6,7`, `pin_gpus([1, 3])` picks its 5 and 7.
  Calling it again with the same ids changes nothing.

  Args:
    gpu_ids: GPU ids, e.g. `[1, 3]`, `"1,3"` or `["1", "3"]` (an absl list
      flag); empty to hide every GPU.
    verify: afterwards list the physical GPUs (which fixes the GPU set for
      the process, see `gpu_visibility.gpus_fixed_reason`) and check that
      TensorFlow sees exactly `len(gpu_ids)` of them.

  Returns:
    The new value of `CUDA_VISIBLE_DEVICES`.

  Raises:
    TypeError, ValueError: `gpu_ids` is malformed, names a GPU the process
      was not started with, or (with `verify`) TensorFlow sees another count.
    RuntimeError: too late; this process has already initialised its GPUs.
  """
  ids = gpu_visibility.parse_gpu_ids(gpu_ids)
  started_with = _STARTED_WITH.setdefault(
      "CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
  value = gpu_visibility.visible_devices_value(ids, started_with)
  if os.environ.get("CUDA_VISIBLE_DEVICES") == value:
    return value
  _check_not_too_late(ids, value)
  if started_with is None:
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
  os.environ["CUDA_VISIBLE_DEVICES"] = value
  logging.info("pin_gpus: CUDA_VISIBLE_DEVICES=%s (GPUs %s appear as "
               "/gpu:0..)", value, ids)
  if verify:
    _verify_pinned(ids, value)
  return value


# CUDA_VISIBLE_DEVICES as it was before the first pin_gpus call.
_STARTED_WITH: dict = {}


def _check_not_too_late(gpu_ids: list, value: str) -> None:
  too_late = gpu_visibility.gpus_fixed_reason()
  if too_late:
    raise RuntimeError(
        f"pin_gpus({gpu_ids}) came too late: {too_late}, so "
        f"CUDA_VISIBLE_DEVICES={value!r} would have no effect. Call pin_gpus "
        "first thing in the program (before building graphs, sessions or "
        "Estimators), or start the process with "
        f"CUDA_VISIBLE_DEVICES={value}.")


def _verify_pinned(gpu_ids: list, value: str) -> None:
  seen = len(tf.config.list_physical_devices("GPU"))
  if seen == len(gpu_ids):
    return
  hint = ("this TensorFlow is built without CUDA; install "
          "'tensorflow[and-cuda]'" if not tf.test.is_built_with_cuda() else
          "the machine has fewer GPUs than that; list them with "
          "`nvidia-smi -L` or `python -m estimator_multigpu.devices`")
  raise ValueError(
      f"pin_gpus({gpu_ids}) set CUDA_VISIBLE_DEVICES={value!r}, but "
      f"TensorFlow sees {seen} GPU(s) where {len(gpu_ids)} were asked for: "
      f"{hint}. The GPU set is now fixed for this process; restart it with "
      "valid ids (or pass verify=False to skip this check).")
