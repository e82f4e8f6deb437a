"""Devices: parse tower device requests, check them, and build session configs.

Every device string the library hands to `tf.device` is canonical
(`/device:GPU:0`), whatever spelling the user gave (`/gpu:0`, `/GPU:0`,
`gpu:0`, `/device:GPU:0`). A requested device that the session will not have
is an error listing the devices it does have: TensorFlow's soft placement would
otherwise run a "GPU" tower silently on the CPU.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence, Union

import tensorflow as tf

tf1 = tf.compat.v1

DeviceRequest = Union[None, int, Sequence[str]]

_DEVICE_RE = re.compile(r"^/?(?:device:)?(cpu|gpu):(\d+)$", re.IGNORECASE)


def canonical_device(spelling: str) -> str:
  """Returns the canonical form (`/device:GPU:0`) of one device spelling.

  Args:
    spelling: `/gpu:0`, `/GPU:0`, `/device:GPU:0`, `gpu:0`, `/cpu:1`, ...

  Raises:
    TypeError: `spelling` is not a string.
    ValueError: it does not name a CPU or GPU with an index.
  """
  if not isinstance(spelling, str):
    raise TypeError(
        f"`devices` entries must be strings like '/gpu:0'; got {spelling!r} "
        f"of type {type(spelling).__name__}.")
  match = _DEVICE_RE.match(spelling.strip())
  if not match:
    raise ValueError(
        f"`devices` entry {spelling!r} is not a device this library can "
        "place a tower on; expected '/gpu:<k>' or '/cpu:<k>' (also spelled "
        "'/GPU:<k>', '/device:GPU:<k>'). Fix the spelling, e.g. '/gpu:0'.")
  return f"/device:{match.group(1).upper()}:{int(match.group(2))}"


def short_name(device: str) -> str:
  """`/device:GPU:0` -> `/gpu:0`, for log lines."""
  spec = tf.DeviceSpec.from_string(device)
  return f"/{spec.device_type.lower()}:{spec.device_index}"


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


def check_devices_exist(devices: Sequence[str],
                        session_config: Optional[tf1.ConfigProto]) -> None:
  """Raises ValueError when a tower device is not one the session will have."""
  available = session_devices(session_config)
  missing = [d for d in devices if d not in available]
  if missing:
    raise ValueError(
        f"`devices` asks for {', '.join(map(short_name, missing))}, which "
        f"this session will not have; it has "
        f"{', '.join(map(short_name, available))}. Ask for existing devices, "
        "or for N towers on a CPU machine give the RunConfig "
        "session_config=estimator_multigpu.make_session_config(num_cpus=N) "
        "and devices=['/cpu:0', ..., '/cpu:N-1'].")


def make_session_config(num_cpus: int = 1,
                        gpu_memory_growth: bool = True,
                        allow_soft_placement: bool = True) -> tf1.ConfigProto:
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
  return config
