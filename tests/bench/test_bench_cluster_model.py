"""`bench.cluster_model`'s arithmetic against numbers worked out by hand.

Pure functions only: nothing here starts TensorFlow or a process, and
nothing asserts on time.
"""

import math

import pytest

from bench import cluster_model as cm
from bench import cluster_report

ETHERNET_25 = cm.NETWORKS[0]  # 2.8 GB/s effective, 30 µs per hop.


def test_parameter_counts_of_the_benchmarked_nets():
  # MLP 784-1024-1024-10: 784·1024+1024 = 803,840; 1024·1024+1024 =
  # 1,049,600; 1024·10+10 = 10,250; sum 1,863,690.
  assert cm.mlp_params() == 1_863_690
  # LeNet on 28x28x1 (SAME conv, two 2x2 pools -> 7x7x64):
  # conv1 5·5·1·32+32 = 832; conv2 5·5·32·64+64 = 51,264;
  # fc3 3136·512+512 = 1,606,144; fc4 512·10+10 = 5,130; sum 1,663,370.
  assert cm.lenet_params() == 1_663_370


def test_ps_and_ring_bytes():
  # ps: each tower reads P, the worker sends its towers' summed P.
  assert cm.ps_bytes_per_worker(100) == 200
  assert cm.ps_bytes_per_worker(100, towers=2) == 300
  # ring over 4 members: 2·3/4·100 = 150 each; one member moves nothing.
  assert cm.ring_bytes_per_member(100, 4) == 150
  assert cm.ring_bytes_per_member(100, 1) == 0


@pytest.mark.parametrize("system,tasks,towers,expected", [
    ("ps", 2, 1, 400),         # 2 workers x 200.
    ("ps", 2, 2, 600),         # 2 workers x (2 reads + 1 gradient) x 100.
    ("ps", 4, 1, 800),         # 4 workers x 200.
    ("allreduce", 2, 1, 200),  # 2 tasks x 2·1/2·100.
    # Hierarchical: only one tower per task crosses tasks, however many.
    ("allreduce", 2, 2, 200),
    ("allreduce", 4, 1, 600),  # 4 tasks x 2·3/4·100.
    ("allreduce", 4, 2, 600),
    ("mwms", 3, 1, 400),       # 3 tasks x 2·2/3·100.
    # Horovod: a ring of every process, one per tower: D·2·(D−1)/D·100.
    ("horovod", 2, 1, 200),    # D = 2: 2 x 100.
    ("horovod", 2, 2, 600),    # D = 4: 4 x 150, 3x the hierarchical 200.
    ("horovod", 3, 1, 400),    # D = 3: 3 x 133.3.
])
def test_wire_bytes_per_step(system, tasks, towers, expected):
  assert cm.wire_bytes_per_step(system, 100, tasks, towers) == (
      pytest.approx(expected))


def test_examples_per_sec_leaves_out_the_warmup():
  # After step 2 (t = 1 s) to step 4 (t = 4 s): 2 steps x 10 examples / 3 s.
  rate = cm.examples_per_sec([0.0, 1.0, 2.0, 4.0], [1, 2, 3, 4], 10, 2)
  assert rate == pytest.approx(20 / 3)


def test_summarize_one_job():
  # Steps 1..4, lo counter +300 per step; warm-up 2: 2 steps, 600 bytes.
  record = {"times": [0.0, 1.0, 2.0, 3.0], "steps": [1, 2, 3, 4],
            "lo_bytes": [0, 300, 600, 900], "model_bytes": 100}
  summary = cluster_report.summarize(record, "allreduce", 2, 1, 10, 2)
  assert summary["examples_per_sec"] == pytest.approx(10.0)
  assert summary["loopback_bytes_per_step"] == pytest.approx(300.0)
  assert summary["derived_bytes_per_step"] == pytest.approx(200.0)


def test_ring_seconds_resnet50_64_gpus_25_gbe():
  # P = 102.4 MB, 2 fusion buckets of 64 MB. Bandwidth: 2·63/64·102.4 MB =
  # 201.6 MB / 2.8 GB/s = 72.0 ms. Latency: 2·63 hops x 30 µs x 2 = 7.56 ms.
  assert cm.ring_seconds(102.4e6, 64, ETHERNET_25) == pytest.approx(0.07956)


def test_ring_efficiency_resnet50():
  # 64 GPUs, 25 GbE: 0.25 / (0.25 + 0.5 · 0.07956) = 0.8627.
  assert cm.ring_efficiency(102.4e6, 0.25, 64, ETHERNET_25) == (
      pytest.approx(0.8627, abs=1e-4))
  # 8 GPUs: one server, NVLink 20 GB/s: 2·7/8·102.4 MB / 20 GB/s = 8.96 ms
  # + 2·7 x 5 µs x 2 = 0.14 ms; 0.25 / (0.25 + 0.00455) = 0.9821.
  assert cm.ring_efficiency(102.4e6, 0.25, 8, ETHERNET_25) == (
      pytest.approx(0.9821, abs=1e-4))


def test_ps_with_one_worker_per_gpu():
  # 64 GPUs, 8 per server: S = 8; 2·8·7/8·100 = 1,400 per NIC each way.
  assert cm.ps_per_gpu_nic_bytes(100, 64, 8) == pytest.approx(1400)
  # ResNet-50 on 25 GbE: 1,433.6 MB / 2.8 GB/s = 0.512 s;
  # 0.25 / (0.25 + 0.256) = 0.4941.
  assert cm.ps_efficiency(102.4e6, 0.25, 64, ETHERNET_25) == (
      pytest.approx(0.4941, abs=1e-4))
  assert math.isnan(cm.ps_efficiency(102.4e6, 0.25, 8, ETHERNET_25))
