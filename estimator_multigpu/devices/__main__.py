"""`python -m estimator_multigpu.devices`: the machine's devices for towers."""

from __future__ import annotations

import argparse
import os
from typing import Optional, Sequence

from estimator_multigpu.devices import device_report
from estimator_multigpu.devices import local_devices
from estimator_multigpu.devices import make_session_config
from estimator_multigpu.devices import topology


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m estimator_multigpu.devices`: prints the device report.

  Creates every device (see `topology.local_devices`), so it initialises
  TensorFlow's GPUs; `nvidia-smi topo -m` is appended when present.
  """
  parser = argparse.ArgumentParser(
      prog="python -m estimator_multigpu.devices",
      description="List this machine's devices, the GPUs' peer access and "
      "the aggregation device multi_gpu would choose.")
  parser.add_argument("--virtual_cpus", type=int, default=1,
                      help="virtual CPU devices to list (the scripts' "
                      "--virtual_cpus; make_session_config(num_cpus=N)); "
                      "default 1")
  parser.add_argument("--num_cpus", type=int, dest="virtual_cpus",
                      help=argparse.SUPPRESS)  # the old name, still accepted.
  args = parser.parse_args(argv)
  if args.virtual_cpus < 1:
    parser.error(f"--virtual_cpus must be >= 1; got {args.virtual_cpus}.")
  records = local_devices(make_session_config(num_cpus=args.virtual_cpus))
  nvidia = topology.nvidia_smi_topology() if topology.gpus(records) else None
  print(device_report(records, nvidia,
                      os.environ.get("CUDA_VISIBLE_DEVICES")), end="")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
