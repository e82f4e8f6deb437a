"""The plan: which device each tower runs on, where variables live, where
gradients are combined and which variable strategy does it, for one graph.

`devices` may also be a list of device *groups* for hybrid data and model
parallelism: `[["/gpu:0", "/gpu:1"], ["/gpu:2", "/gpu:3"]]` makes two towers;
each tower's ops go to the first device of its group unless the model_fn
places them on another one, which `tower_devices()` returns.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

from absl import logging
import tensorflow as tf

from estimator_multigpu import collectives
from estimator_multigpu import devices as devices_lib
from estimator_multigpu.graph import splitting
from estimator_multigpu.graph import towers as towers_lib

DevicesOption = Union[None, int, Sequence[str], Sequence[Sequence[str]]]


def resolve_groups(devices: DevicesOption) -> Optional[list]:
  """The `devices` option as one device group (a list) per tower.

  Raises:
    TypeError, ValueError: as `devices.resolve_devices`, or for an empty or
      repeated group.
  """
  if devices is None:
    return None
  if isinstance(devices, (list, tuple)) and devices and all(
      isinstance(group, (list, tuple)) for group in devices):
    groups = [[devices_lib.canonical_device(d) for d in group]
              for group in devices]
    for group in groups:
      if not group or len(set(group)) != len(group):
        raise ValueError(
            f"`devices` group {group} is empty or repeats a device; each "
            "tower's group lists distinct devices, e.g. [['/gpu:0', "
            "'/gpu:1'], ['/gpu:2', '/gpu:3']].")
    devices_lib.resolve_devices([group[0] for group in groups])  # distinct.
    return groups
  return [[device] for device in devices_lib.resolve_devices(devices)]


@dataclasses.dataclass(frozen=True)
class Plan:
  """Where towers, variables and gradient aggregation go for one graph.

  Attributes:
    groups: one device group per tower; a tower's ops go to its first device.
    variable_device: where shared variables live; None = the tower's device.
    aggregation_device: where the towers' gradients are combined.
    strategy: the variable strategy's name in `strategies.STRATEGIES`.
    copies_per_tower: whether that strategy keeps a copy of the variables
      per tower (then gradients are all-reduced, not aggregated).
    all_reduce: with a copy per tower, how gradients are all-reduced
      (`strategies.all_reduce.ALGORITHMS`).
    gradient_packing_bytes: with a copy per tower, pack dense gradients
      into buffers of at most this many bytes before the all-reduce (0: no).
    group_devices: every tower of the collective group, when it spans other
      tasks too (an all-reduce cluster); None: this graph's towers.
    first_tower: the place of this graph's tower 0 in `group_devices`.
  """
  groups: list
  variable_device: Optional[str]
  aggregation_device: str
  strategy: str = "shared"
  copies_per_tower: bool = False
  all_reduce: str = "collective"
  gradient_packing_bytes: int = 0
  group_devices: Optional[list] = None
  first_tower: int = 0

  @property
  def collective_devices(self) -> list:
    """Every tower of the collective group, in order."""
    return self.group_devices or self.devices

  @property
  def collective_group(self) -> collectives.Group:
    """Every tower of a step: tasks × this graph's towers, in order."""
    return collectives.Group(
        tuple(self.collective_devices), first_local=self.first_tower,
        local_towers=self.num_towers if self.group_devices else 0)

  @property
  def devices(self) -> list:
    """Each tower's main device: the first of its group."""
    return [group[0] for group in self.groups]

  @property
  def num_towers(self) -> int:
    return len(self.groups)

  @property
  def gpu_towers(self) -> int:
    """How many towers run on a GPU."""
    return sum(tf.DeviceSpec.from_string(d).device_type == "GPU"
               for d in self.devices)


def make_plan(groups: Optional[list], aggregation_device: Optional[str],
              session_config, api: str = "multi_gpu") -> Plan:
  """Resolves the devices for this graph and checks that they exist.

  Args:
    groups: from `resolve_groups`, or None for the default devices.
    aggregation_device: canonical variable/aggregation device, or None for
      the default (`devices.aggregation_device_for`).
    session_config: the session's ConfigProto (virtual CPU count), or None.
    api: the public name asking (`devices.check_devices_exist`).
  """
  groups = groups or [[d] for d in devices_lib.resolve_devices(None)]
  wanted = [d for group in groups for d in group]
  devices_lib.check_devices_exist(list(dict.fromkeys(
      wanted + ([aggregation_device] if aggregation_device else []))),
                                  session_config, api)
  chosen = aggregation_device or devices_lib.aggregation_device_for(
      [group[0] for group in groups])
  # With one tower and no request, variables simply follow the tower.
  variable_device = aggregation_device if len(groups) == 1 else chosen
  return Plan(groups, variable_device, chosen)


def log_plan(plan: Plan, split: splitting.Split, mode: str) -> None:
  """One INFO line with the plan (gradients only in TRAIN)."""
  per_tower = (split.sizes if split.static else
               "known at run time (sizes differ by at most 1)")
  if plan.copies_per_tower and mode == "train":
    packing = (f" in buffers of {plan.gradient_packing_bytes / 2**20:g} MiB"
               if plan.gradient_packing_bytes else "")
    variables = (f"a copy per tower; gradients all-reduced by "
                 f"{plan.all_reduce}{packing}")
  else:
    variables = (
        f"on {devices_lib.short_name(plan.variable_device or plan.devices[0])}")
    if mode == "train":  # eval and predict compute no gradients.
      variables += (f"; gradients aggregated on "
                    f"{devices_lib.short_name(plan.aggregation_device)}")
  logging.info(
      "multi_gpu %s: %d towers on %s; variables %s; global batch %s -> "
      "per-tower batch %s", mode, plan.num_towers,
      ", ".join(_group_name(group) for group in plan.groups), variables,
      split.global_batch_size if split.static else "dynamic", per_tower)


def _group_name(group: list) -> str:
  names = [devices_lib.short_name(d) for d in group]
  return names[0] if len(names) == 1 else f"[{'+'.join(names)}]"


def tower_devices() -> list:
  """The devices of the tower being built (its group; one device usually).

  Call it inside a model_fn wrapped by `multi_gpu` to place consecutive
  layers on the devices of the tower's group (model parallelism inside a
  tower). Outside `multi_gpu` it returns [] .
  """
  tower = towers_lib.current_tower()
  return list(tower.group) if tower is not None else []
