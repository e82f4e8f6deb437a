"""The towers a script runs on, resolved from its tower settings
(cli/settings.py): --devices, --num_gpus, --virtual_cpus, --gpus.

`--devices=/cpu:0,/cpu:1,/cpu:2` gets the virtual CPU devices it names;
GPUs it names that the machine lacks are one line in the script's words
(--num_gpus, --virtual_cpus), not the library's session advice.
"""

from __future__ import annotations

import dataclasses
import re
from typing import List, Optional, Sequence

import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import devices as devices_lib

from cli import settings as settings_lib
from cli.flags import validators


@dataclasses.dataclass(frozen=True)
class Towers:
  """Where the towers run and the session config that provides it."""
  devices: list
  session_config: tf.compat.v1.ConfigProto


def resolve_towers(num_gpus: Optional[int], devices: Optional[Sequence[str]],
                   virtual_cpus: Optional[int],
                   gpus: Optional[Sequence[str]] = None) -> Towers:
  """--devices, else --num_gpus, else --virtual_cpus, else GPUs or 2 CPUs.

  With `gpus` (--gpus=1,3) the process is first pinned to those GPUs (the
  flag already did so while it was parsed; pinning again is a no-op).

  Raises:
    ValueError: more than one way to choose the towers, or more GPUs than
      the process sees.
  """
  _check_one_choice(num_gpus, devices, virtual_cpus)
  if gpus is not None:
    devices_lib.pin_gpus(list(gpus))
  validators.check_num_gpus(num_gpus, devices_lib.num_visible_gpus())
  if devices is None and num_gpus is None and virtual_cpus is None:
    virtual_cpus = None if devices_lib.num_visible_gpus() else 2
  if virtual_cpus is not None:
    devices = [f"/cpu:{k}" for k in range(virtual_cpus)]
  resolved = devices_lib.resolve_devices(
      list(devices) if devices is not None else num_gpus)
  cpus = _cpus_named(resolved, devices) if devices is not None else 1
  return Towers(resolved, emg.make_session_config(
      num_cpus=max(virtual_cpus or 1, cpus)))


def _indices(resolved: Sequence[str], kind: str) -> List[int]:
  """The indices of the `kind` ('CPU'/'GPU') devices among `resolved`."""
  return [int(match.group(1)) for match in (
      re.fullmatch(f"/device:{kind}:(\\d+)", d) for d in resolved) if match]


def _cpus_named(resolved: Sequence[str], given: Sequence[str]) -> int:
  """The virtual CPUs --devices needs (highest /cpu index + 1); refuses
  GPUs the machine lacks, naming the script's flags.

  Raises:
    ValueError: a GPU of --devices is not visible.
  """
  visible = devices_lib.num_visible_gpus()
  missing = [f"/gpu:{k}" for k in _indices(resolved, "GPU") if k >= visible]
  if missing:
    raise ValueError(
        f"--devices={','.join(given)} asks for {', '.join(missing)}, but "
        f"this machine shows {visible} GPU(s) (CUDA_VISIBLE_DEVICES and "
        "--gpus limit them); give --num_gpus=N for the first N GPUs, or "
        "--virtual_cpus=N (or --devices=/cpu:0,...,/cpu:N-1) for N towers "
        "on virtual CPU devices.")
  return max(_indices(resolved, "CPU"), default=0) + 1


def _check_one_choice(num_gpus, devices, virtual_cpus) -> None:
  given = [name for name, value in (("--devices", devices),
                                    ("--num_gpus", num_gpus),
                                    ("--virtual_cpus", virtual_cpus))
           if value is not None]
  if len(given) > 1:
    raise ValueError(f"{' and '.join(given)} both choose the towers; give "
                     "only one of --devices, --num_gpus, --virtual_cpus.")


def from_settings(settings: settings_lib.TowerSettings) -> Towers:
  """`resolve_towers` of the tower settings."""
  return resolve_towers(settings.num_gpus, settings.devices,
                        settings.virtual_cpus, settings.gpus)
