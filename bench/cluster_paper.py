"""The on-paper tables of docs/performance.md's "Several machines" section:
`python -m bench.cluster_paper` prints them from `bench.cluster_model`.

Nothing here is measured: every number follows from the assumptions below
and in `cluster_model` (link speeds, latency, 50% overlap).
"""

from __future__ import annotations

import dataclasses

from bench import cluster_model as cm


@dataclasses.dataclass(frozen=True)
class Workload:
  """A network, its fp32 gradient bytes, one GPU's step on its batch."""
  name: str
  params: float
  batch: int
  compute_sec: float

  @property
  def model_bytes(self) -> float:
    return self.params * cm.FLOAT32


# V100, mixed precision, fp32 gradients all-reduced (assumptions).
V100 = (Workload("ResNet-50", 25.6e6, 256, 0.25),   # ~1,020 images/s.
        Workload("VGG-16", 138.3e6, 128, 0.32))     # ~400 images/s.
# Horovod's published 512-GPU run: P100, batch 64, tf_cnn_benchmarks rates.
P100 = (Workload("Inception V3", 23.8e6, 64, 64 / 142),
        Workload("ResNet-101", 44.5e6, 64, 64 / 125),
        Workload("VGG-16", 138.3e6, 64, 64 / 154))
HOROVOD_PUBLISHED = {"Inception V3": 0.90, "ResNet-101": 0.90, "VGG-16": 0.68}
ROCE_25 = cm.Network("25 Gb/s RoCE (RDMA)", 2.8 * cm.GB, 5e-6)
GPU_COUNTS = (8, 16, 32, 64)


def percent(value: float) -> str:
  return "–" if value != value else f"{100 * value:.0f}%"  # NaN: n/a.


def ring_table() -> str:
  """Ring all-reduce efficiency, 8 GPUs per server, 8–64 GPUs."""
  lines = ["| model | network | ring at 64 GPUs: bytes per NIC each way, "
           "time | " +
           " | ".join(f"{n} GPUs" for n in GPU_COUNTS) + " |",
           "|---|---|---|" + "---|" * len(GPU_COUNTS)]
  for work in V100:
    for net in cm.NETWORKS:
      mb = cm.ring_bytes_per_member(work.model_bytes, 64) / cm.MB
      ms = 1000 * cm.ring_seconds(work.model_bytes, 64, net)
      cells = [percent(cm.ring_efficiency(work.model_bytes, work.compute_sec,
                                          n, net)) for n in GPU_COUNTS]
      lines.append(f"| {work.name} | {net.name} | {mb:,.0f} MB, {ms:.0f} ms | "
                   +
                   " | ".join(cells) + " |")
  return "\n".join(lines)


def ps_table() -> str:
  """Ps with one worker per GPU and balanced shards (bandwidth only)."""
  lines = ["| model | network | ps at 64 GPUs: busiest NIC each way, "
           "time | " +
           " | ".join(f"{n} GPUs" for n in GPU_COUNTS[1:]) + " |",
           "|---|---|---|" + "---|" * (len(GPU_COUNTS) - 1)]
  for work in V100:
    for net in cm.NETWORKS:
      nic = cm.ps_per_gpu_nic_bytes(work.model_bytes, 64, 8)
      mb, ms = nic / cm.MB, 1000 * nic / net.bytes_per_sec
      cells = [percent(cm.ps_efficiency(work.model_bytes, work.compute_sec,
                                        n, net)) for n in GPU_COUNTS[1:]]
      lines.append(f"| {work.name} | {net.name} | {mb:,.0f} MB, {ms:,.0f} ms"
                   " | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def horovod_table() -> str:
  """The model at Horovod's published set-up, beside its published figure."""
  lines = ["| model | P (MB) | t_compute (b = 64) | ring, each way | "
           "model: efficiency | Horovod published |", "|---|---|---|---|---|---|"]
  for work in P100:
    ring = cm.ring_seconds(work.model_bytes, 512, ROCE_25)
    eff = cm.ring_efficiency(work.model_bytes, work.compute_sec, 512,
                             ROCE_25, per_server=4)
    lines.append(f"| {work.name} | {work.model_bytes / cm.MB:.0f} | "
                 f"{1000 * work.compute_sec:.0f} ms | {1000 * ring:.0f} ms | "
                 f"{percent(eff)} | {percent(HOROVOD_PUBLISHED[work.name])} |")
  return "\n".join(lines)


if __name__ == "__main__":
  print(ring_table(), ps_table(), horovod_table(), sep="\n\n")
