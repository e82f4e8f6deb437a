"""Pure arithmetic of `bench.cluster`: bytes per step, rates, cost model.

No TensorFlow here: `tests/bench/test_bench_cluster_model.py` checks
every function against numbers worked out by hand.

Bytes are those of the trainable variables (P, fp32) each step moves:
  - ps, synchronous: every worker sends P bytes of gradients to the ps
    (its towers' sum) and every tower reads all P bytes of weights from it
    (no caching device): (towers + 1)·P per worker, 2·P at one tower.
  - ring all-reduce over n members: each sends (and receives) 2·(n−1)/n·P.
    The library's cluster default (`all_reduce="hierarchical"`) sums a
    task's towers first, so only its first tower is a ring member:
    2·(T−1)/T·P per task for T tasks, however many towers each has; so
    does MultiWorkerMirroredStrategy with one replica per task. Horovod
    runs one process per tower, and all of its D = tasks·towers processes
    are ring members: D·2·(D−1)/D·P = 2·(D−1)·P between processes.
"""

from __future__ import annotations

import dataclasses
import math

FLOAT32 = 4
MB = 1e6
GB = 1e9


def dense_params(inputs: int, units: int) -> int:
  """Weights and biases of a fully connected layer."""
  return inputs * units + units


def conv_params(kernel: int, channels_in: int, channels_out: int) -> int:
  """Weights and biases of a square `kernel` convolution."""
  return kernel * kernel * channels_in * channels_out + channels_out


def mlp_params(inputs: int = 784, hidden=(1024, 1024), classes: int = 10
               ) -> int:
  """`nets/mlp.py`: flatten, the hidden layers, the logits layer."""
  widths = [inputs, *hidden, classes]
  return sum(dense_params(a, b) for a, b in zip(widths, widths[1:]))


def lenet_params(size: int = 28, channels: int = 1, classes: int = 10) -> int:
  """`nets/lenet.py`: conv 5x5x32, pool, conv 5x5x64, pool (SAME), fc 512."""
  pooled = math.ceil(math.ceil(size / 2) / 2)
  return (conv_params(5, channels, 32) + conv_params(5, 32, 64) +
          dense_params(pooled * pooled * 64, 512) + dense_params(512, classes))


def ps_bytes_per_worker(model_bytes: float, towers: int = 1) -> float:
  """Weights read by each tower plus the summed gradients sent, per worker."""
  return (towers + 1) * model_bytes


def ring_bytes_per_member(model_bytes: float, members: int) -> float:
  """What one member of a ring all-reduce sends (and receives) per step."""
  return 2 * (members - 1) / members * model_bytes if members > 1 else 0.0


def wire_bytes_per_step(system: str, model_bytes: float, tasks: int,
                        towers: int) -> float:
  """Bytes all tasks send to each other per step (each byte counted once).

  Args:
    system: "ps" (1 ps task, `tasks` workers), "allreduce" (`tasks`
      training tasks, hierarchical: a ring of one device per task),
      "mwms" (one replica per task, a ring of tasks) or "horovod" (one
      process per tower: a ring of tasks × towers processes, every byte
      of it between processes).
    model_bytes: P, the trainable variables' bytes.
    tasks: training tasks (workers, the chief included).
    towers: devices per task.
  """
  if system == "ps":
    return tasks * ps_bytes_per_worker(model_bytes, towers)
  if system == "horovod":
    members = tasks * towers
    return members * ring_bytes_per_member(model_bytes, members)
  return tasks * ring_bytes_per_member(model_bytes, tasks)


def examples_per_sec(times: list, steps: list, global_batch: int,
                     warmup: int) -> float:
  """Rate between the end of step `warmup` and the last step.

  Args:
    times: wall-clock seconds at the end of each step the chief ran.
    steps: the global step after each of those steps.
    global_batch: examples one global step trains on (all tasks).
    warmup: leading steps left out (graph optimisation, first transfers).
  """
  seconds = times[-1] - times[warmup - 1]
  return (steps[-1] - steps[warmup - 1]) * global_batch / seconds


@dataclasses.dataclass(frozen=True)
class Network:
  """One link type between servers: effective bytes/s and per-hop latency."""
  name: str
  bytes_per_sec: float
  latency_sec: float


# Effective, not line rate (assumptions; see docs/performance.md).
NETWORKS = (Network("25 Gb/s Ethernet (TCP)", 2.8 * GB, 30e-6),
            Network("100 Gb/s Ethernet (TCP)", 9.0 * GB, 30e-6),
            Network("100 Gb/s EDR InfiniBand (RDMA)", 11.0 * GB, 5e-6))
NVLINK = Network("NVLink ring", 20 * GB, 5e-6)
FUSION_BYTES = 64 * MB  # Horovod's default tensor-fusion buffer.
HIDDEN = 0.5  # share of the exchange hidden behind the backward pass.


def ring_seconds(model_bytes: float, gpus: int, link: Network) -> float:
  """Bandwidth plus latency of one ring all-reduce over `gpus` GPUs.

  The ring crosses each server's NIC once each way, so the busiest link
  carries 2·(N−1)/N·P; each fusion bucket takes 2·(N−1) hops.
  """
  buckets = math.ceil(model_bytes / FUSION_BYTES)
  return (ring_bytes_per_member(model_bytes, gpus) / link.bytes_per_sec +
          2 * (gpus - 1) * link.latency_sec * buckets)


def ps_per_gpu_nic_bytes(model_bytes: float, gpus: int,
                         per_server: int) -> float:
  """Busiest NIC, each way, of a ps job with one worker per GPU.

  S = gpus / per_server servers, each holding one balanced ps shard (P/S):
  its workers send (S−1)/S·P of gradients each, its shard sends P/S of
  weights to every remote worker: 2·per_server·(S−1)/S·P.
  """
  servers = gpus // per_server
  return 2 * per_server * (servers - 1) / servers * model_bytes


def efficiency(compute_sec: float, exchange_sec: float,
               hidden: float = HIDDEN) -> float:
  """t_compute / (t_compute + exposed exchange): speed-up over N."""
  return compute_sec / (compute_sec + (1 - hidden) * exchange_sec)


def ring_efficiency(model_bytes: float, compute_sec: float, gpus: int,
                    network: Network, per_server: int = 8) -> float:
  """Ring all-reduce: NVLink within one server, else the network."""
  link = NVLINK if gpus <= per_server else network
  return efficiency(compute_sec, ring_seconds(model_bytes, gpus, link))


def ps_efficiency(model_bytes: float, compute_sec: float, gpus: int,
                  network: Network, per_server: int = 8) -> float:
  """Ps with one worker per GPU (bandwidth only; no latency, no imbalance)."""
  if gpus <= per_server:
    return 1.0 if gpus == 1 else float("nan")
  nic = ps_per_gpu_nic_bytes(model_bytes, gpus, per_server)
  return efficiency(compute_sec, nic / network.bytes_per_sec)
