"""The towers a script runs on, resolved from its tower settings
(cli/settings.py): --devices, --num_gpus, --virtual_cpus, --gpus.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

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
  return Towers(resolved, emg.make_session_config(num_cpus=virtual_cpus or 1))


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
