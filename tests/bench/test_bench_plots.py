"""bench/plots.py: the docs' plots from the benchmarks' saved results."""

import pytest

from bench import plots

# Hand-made results: the baseline runs 100 examples/sec.
RESULTS = {"throughput": [
    {"model": "m", "label": "single", "system": "single", "towers": 1,
     "median": 100.0, "low": 90.0, "high": 110.0},
    {"model": "m", "label": "multi_gpu x2", "system": "multi_gpu",
     "towers": 2, "median": 150.0, "low": 140.0, "high": 160.0},
    {"model": "m", "label": "multi_gpu x1", "system": "multi_gpu",
     "towers": 1, "median": 95.0, "low": 95.0, "high": 95.0}]}
CLUSTER = {"rows": [
    {"model": "m", "tasks": 2, "towers": 1,
     "ps": {"derived_mb": 30.0, "loopback_mb": 31.0},
     "allreduce": {"derived_mb": 15.0, "loopback_mb": 15.5}}]}


def test_throughput_by_towers_is_each_systems_medians_in_tower_order():
  assert plots.throughput_by_towers(RESULTS) == {"m": {
      "single": [(1, 100.0)], "multi_gpu": [(1, 95.0), (2, 150.0)]}}


def test_each_system_is_divided_by_the_baselines_median():
  # 150 / 100 = 1.5; its windows 140 and 160 -> 1.4 and 1.6.
  assert plots.relative_to_baseline(RESULTS) == {"m": {
      "multi_gpu x2": ("multi_gpu", 2, 1.5, 1.4, 1.6),
      "multi_gpu x1": ("multi_gpu", 1, 0.95, 0.95, 0.95)}}


def test_bytes_per_step_gives_each_system_derived_and_measured():
  assert plots.bytes_per_step(CLUSTER) == {"m": [
      ("2x1", "ps", 30.0, 31.0), ("2x1", "allreduce", 15.0, 15.5)]}


def test_the_saved_results_draw_three_pngs(tmp_path):
  pytest.importorskip("matplotlib", reason="the docs extra draws the plots")
  plots.main(["--output_dir", str(tmp_path)])
  names = sorted(p.name for p in tmp_path.iterdir())
  assert names == ["bytes_per_step.png", "throughput_by_system.png",
                   "throughput_by_towers.png"]
  assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
             for p in tmp_path.iterdir())
