"""bench: ResNet-50 runs with and without sync batch norm, side by side."""

from absl import flags

from bench import report
from bench import run

FLAGS = flags.FLAGS


def make_row(system, towers, median):
  return report.Row("resnet_v1_50", f"{system} x{towers}", system, towers,
                    median, median, median, 1, 0.0, 0.0)


def test_sync_batch_norm_cost_is_a_ratio_to_multi_gpu():
  rows = [make_row("multi_gpu", 2, 100.0), make_row("multi_gpu_sync_bn", 2,
                                                    90.0),
          make_row("multi_gpu", 4, 100.0), make_row("multi_gpu_sync_bn", 4,
                                                    70.0)]
  lines = [c.line() for c in report.sync_batch_norm_checks(
      rows, "resnet_v1_50", [1, 2, 4])]
  assert lines == [  # 90 / 100 = 0.9 >= 0.8; 70 / 100 = 0.7 < 0.8.
      "PASS resnet_v1_50 multi_gpu_sync_bn x2 >= 0.8x multi_gpu x2: 0.900x "
      "(90.0 vs 100 examples/sec)",
      "MISS resnet_v1_50 multi_gpu_sync_bn x4 >= 0.8x multi_gpu x4: 0.700x "
      "(70.0 vs 100 examples/sec)"]


def test_jobs_add_sync_batch_norm_for_batch_norm_models_only():
  config = {"kind": "cpu", "towers": [1, 2, 4], "thread_variants": [],
            "tutorial_towers": [], "replicas": 1}
  labels = lambda model: [job.label for job in run.jobs_for(model, config)
                          if job.system == "multi_gpu_sync_bn"]
  assert labels("resnet_v1_50") == ["multi_gpu_sync_bn x2",
                                    "multi_gpu_sync_bn x4"]
  assert labels("lenet") == []
