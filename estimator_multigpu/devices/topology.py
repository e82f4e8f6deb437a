"""Topology: the devices of this machine, how its GPUs connect, and a report.

Two ways to list devices, which differ in what they initialise:

* `physical_devices()` asks `tf.config.list_physical_devices`. It does not
  start TensorFlow's runtime (memory growth and visible devices can still be
  set afterwards), but on a GPU host it initialises the CUDA driver, after
  which `CUDA_VISIBLE_DEVICES` no longer changes anything in this process. It
  knows GPU names and compute capabilities, not memory or peer access.
* `local_devices()` asks `device_lib.list_local_devices`, which creates every
  device the way a session does: on a GPU host a CUDA context on each GPU
  (with memory growth, so no GPU memory is reserved up front). It also knows
  each device's memory limit, virtual CPUs from a session config, and which
  GPUs have peer access to each other (TensorFlow's device links).

`device_report()` turns either list into the text that
`python -m estimator_multigpu.devices` prints. Which GPUs the process may
see (`devices.pin_gpus`) is `gpu_visibility`.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import textwrap
from typing import NamedTuple, Optional, Sequence

import tensorflow as tf

from estimator_multigpu import compat

device_lib = compat.internal("device_lib")


tf1 = tf.compat.v1


@dataclasses.dataclass(frozen=True)
class DeviceRecord:
  """One local device.

  Attributes:
    name: canonical device string, `/device:GPU:0`.
    device_type: "CPU" or "GPU".
    memory_bytes: the memory TensorFlow may use on a GPU; None for CPUs
      (host memory) and when unknown.
    description: TensorFlow's description (GPU model, PCI bus id, compute
      capability); empty for CPUs.
    peers: for a GPU, the indices of the GPUs it has peer access to (direct
      GPU-to-GPU copies); None when unknown (listed without creating devices).
  """
  name: str
  device_type: str
  memory_bytes: Optional[int] = None
  description: str = ""
  peers: Optional[tuple] = None

  @property
  def index(self) -> int:
    return tf.DeviceSpec.from_string(self.name).device_index

  @property
  def short_name(self) -> str:
    """`/gpu:0`, for reports."""
    return short_name(self.name)


class Aggregation(NamedTuple):
  """The aggregation device `multi_gpu` picks by default, and why."""
  device: str
  reason: str


def physical_devices() -> list[DeviceRecord]:
  """Lists the CPUs and GPUs TensorFlow sees, without starting its runtime.

  Initialises the CUDA driver on a GPU host (so call `pin_gpus` first), but
  not TensorFlow's runtime. Memory and peer access are unknown (None).

  Returns:
    One `DeviceRecord` per physical CPU and GPU, CPUs first.
  """
  records = []
  for device in tf.config.list_physical_devices():
    if device.device_type not in ("CPU", "GPU"):
      continue
    details = tf.config.experimental.get_device_details(device)
    records.append(DeviceRecord(
        name=device.name.replace("/physical_device:", "/device:"),
        device_type=device.device_type,
        description=_details_text(details)))
  return _sorted(records)


def _details_text(details: dict) -> str:
  parts = ([f"name: {details['device_name']}"] if "device_name" in details
           else [])
  if "compute_capability" in details:
    major, minor = details["compute_capability"]
    parts.append(f"compute capability: {major}.{minor}")
  return ", ".join(parts)


def local_devices(
    session_config: Optional[tf1.ConfigProto] = None) -> list[DeviceRecord]:
  """Lists the devices a session with `session_config` has, with memory.

  Creates every device as a session would: on a GPU host this initialises
  the CUDA driver and a context on each GPU (memory growth is forced on
  unless the config sets a memory fraction, so no memory is reserved).

  Args:
    session_config: e.g. `make_session_config(num_cpus=4)` to list four
      virtual CPUs; None for TensorFlow's defaults (one CPU).

  Returns:
    One `DeviceRecord` per CPU and GPU, CPUs first, with memory limits and,
    for GPUs, peer access from TensorFlow's device links.
  """
  config = tf1.ConfigProto()
  if session_config is not None:
    config.CopyFrom(session_config)
  if not config.gpu_options.per_process_gpu_memory_fraction:
    config.gpu_options.allow_growth = True
  records = [_record(attributes) for attributes in
             device_lib.list_local_devices(config)
             if attributes.device_type in ("CPU", "GPU")]
  return _sorted(records)


def _record(attributes) -> DeviceRecord:
  """A GPU's memory limit and links; a CPU's memory_limit is nominal."""
  if attributes.device_type != "GPU":
    return DeviceRecord(tf.DeviceSpec.from_string(attributes.name).to_string(),
                        attributes.device_type)
  return DeviceRecord(
      name=tf.DeviceSpec.from_string(attributes.name).to_string(),
      device_type="GPU", memory_bytes=int(attributes.memory_limit) or None,
      description=attributes.physical_device_desc,
      peers=tuple(sorted(link.device_id
                         for link in attributes.locality.links.link)))


def _sorted(records: list) -> list:
  return sorted(records, key=lambda r: (r.device_type != "CPU", r.index))


def gpus(records: Sequence[DeviceRecord]) -> list[DeviceRecord]:
  return [record for record in records if record.device_type == "GPU"]


def peer_matrix(records: Sequence[DeviceRecord]) -> list[list[Optional[bool]]]:
  """`matrix[i][j]`: whether GPU i can copy straight to GPU j (None: unknown).

  The diagonal is True. Rows and columns follow the GPUs in `records`.
  """
  listed = gpus(records)
  return [[True if a.index == b.index else
           (None if a.peers is None else b.index in a.peers)
           for b in listed] for a in listed]


def missing_peer_pairs(records: Sequence[DeviceRecord]) -> list[tuple]:
  """Pairs `(i, j)`, i < j, of GPUs without peer access in either direction."""
  listed = gpus(records)
  matrix = peer_matrix(records)
  return [(a.index, b.index)
          for i, a in enumerate(listed) for j, b in enumerate(listed)
          if i < j and (matrix[i][j] is False or matrix[j][i] is False)]


def default_towers(records: Sequence[DeviceRecord]) -> list[str]:
  """What `multi_gpu(devices=None)` uses: every GPU, else one CPU tower."""
  return [record.name for record in gpus(records)] or ["/device:CPU:0"]


def aggregation_device_for(tower_devices: Sequence[str]) -> str:
  """The one rule for the default aggregation device of these towers.

  With one tower, its own device (there is nothing to combine); with several,
  `/cpu:0`: variables in host memory, each GPU reads them and sends its
  gradients over its own host link. `multi_gpu`, `make_parallel` and the
  device report all use this rule.
  """
  return tower_devices[0] if len(tower_devices) == 1 else "/device:CPU:0"


def default_aggregation_device(records: Sequence[DeviceRecord]) -> Aggregation:
  """The aggregation device `multi_gpu` chooses with its default towers.

  The rule is `aggregation_device_for`: with one tower (no GPU, or
  one GPU) it is that tower's device, since there is nothing to combine; with
  several towers it is `/cpu:0`, where variables live in host memory and
  every GPU reads them and sends its gradients over its own host link, so no
  GPU-to-GPU path is needed. Peer access does not change the default; the
  reason says whether `aggregation_device="/gpu:0"` is worth measuring (only when
  every GPU pair has peer access, else copies between some GPUs would be
  staged through host memory anyway).

  Args:
    records: from `local_devices()`, `physical_devices()`, or made by hand.

  Returns:
    An `Aggregation(device, reason)`.
  """
  towers = default_towers(records)
  device = aggregation_device_for(towers)
  if len(towers) == 1:
    return Aggregation(device, (
        "one tower: variables and updates stay on its own device; there is "
        "nothing to combine."))
  return Aggregation(device, (
      f"{len(towers)} towers: multi_gpu's default aggregation_device is "
      "/cpu:0 — "
      "variables in host memory, each GPU reads them and sends its "
      "gradients over its own host link, so no GPU-to-GPU path is needed. "
      + _peer_advice(records)))


def _peer_advice(records: Sequence[DeviceRecord]) -> str:
  if any(record.peers is None for record in gpus(records)):
    return ("Peer access is unknown (devices listed without creating them; "
            "see local_devices()).")
  missing = missing_peer_pairs(records)
  if missing:
    pairs = ", ".join(f"gpu:{i}-gpu:{j}" for i, j in missing)
    return (f"GPU pairs without peer access: {pairs}; a GPU aggregation "
            "device would stage their copies through host memory: keep "
            "/cpu:0.")
  return ("Every GPU pair has peer access, so aggregation_device='/gpu:0' "
          "(variables "
          "and the gradient sum on GPU 0) may be faster: measure both.")


def nvidia_smi_topology(timeout: float = 10.0) -> Optional[str]:
  """The output of `nvidia-smi topo -m` (link kinds: NV#, PIX, SYS, ...).

  Returns:
    The text, or None when `nvidia-smi` is not installed or fails.
  """
  binary = shutil.which("nvidia-smi")
  if binary is None:
    return None
  try:
    result = subprocess.run([binary, "topo", "-m"], capture_output=True,
                            text=True, timeout=timeout, check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  return result.stdout.rstrip() if result.returncode == 0 else None


def device_report(records: Sequence[DeviceRecord],
                  nvidia_topology: Optional[str] = None,
                  cuda_visible_devices: Optional[str] = None) -> str:
  """The text `python -m estimator_multigpu.devices` prints.

  Args:
    records: the devices, e.g. from `local_devices()`.
    nvidia_topology: `nvidia-smi topo -m` output to append, or None.
    cuda_visible_devices: the process's CUDA_VISIBLE_DEVICES (None: unset).

  Returns:
    Devices with memory, the GPUs' peer-access matrix (or a line saying
    there is no GPU), the default towers and the aggregation device with the
    reason for it.
  """
  lines = ["Local devices:"] + [_device_line(r) for r in records]
  lines += _gpu_lines(records, cuda_visible_devices)
  aggregation = default_aggregation_device(records)
  lines += ["", "Default towers (multi_gpu with devices=None): " +
            ", ".join(short_name(d) for d in default_towers(records)),
            f"Aggregation device: {short_name(aggregation.device)}",
            textwrap.fill(aggregation.reason, 79, initial_indent="  why: ",
                          subsequent_indent="       ")]
  if nvidia_topology:
    lines += ["", "nvidia-smi topo -m:", nvidia_topology]
  return "\n".join(lines) + "\n"


def _device_line(record: DeviceRecord) -> str:
  memory = _format_bytes(record.memory_bytes, record.device_type)
  text = f"  {record.short_name:<8} {record.device_type:<4} {memory:>10}"
  return f"{text}  {record.description}".rstrip()


def _format_bytes(count: Optional[int], device_type: str) -> str:
  if count is None:
    return "host RAM" if device_type == "CPU" else "memory ?"
  if count >= 1 << 30:
    return f"{count / (1 << 30):.1f} GiB"
  return f"{count / (1 << 20):.0f} MiB"


def _gpu_lines(records: Sequence[DeviceRecord],
               cuda_visible_devices: Optional[str]) -> list[str]:
  listed = gpus(records)
  if not listed:
    return ["", textwrap.fill(
        "No GPU: TensorFlow sees none (CUDA_VISIBLE_DEVICES="
        f"{cuda_visible_devices or '<unset>'}, built with CUDA: "
        f"{tf.test.is_built_with_cuda()}). For several towers on this "
        "machine use virtual CPUs: make_session_config(num_cpus=N) and "
        "devices=['/cpu:0', ...].", 79)]
  header = "        " + "".join(f"{'gpu:%d' % g.index:>7}" for g in listed)
  rows = [f"  gpu:{g.index:<3}" + "".join(
      f"{'-' if i == j else _cell(value):>7}" for j, value in enumerate(row))
          for i, (g, row) in enumerate(zip(listed, peer_matrix(records)))]
  return ["", "Peer access (TensorFlow's device links; yes = direct "
          "GPU-to-GPU copies):", header] + rows


def _cell(value: Optional[bool]) -> str:
  return {True: "yes", False: "no", None: "?"}[value]


def short_name(device: str) -> str:
  """`/device:GPU:0` -> `/gpu:0`, for log lines and reports."""
  spec = tf.DeviceSpec.from_string(device)
  return f"/{spec.device_type.lower()}:{spec.device_index}"
