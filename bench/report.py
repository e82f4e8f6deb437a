"""Turns timings into numbers, target checks, a markdown table and JSON."""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Optional

from bench import schedule

# The targets for `multi_gpu`, as ratios of median examples/sec.
ONE_TOWER_MIN = 0.97     # x1 tower vs the unwrapped model_fn.
TWO_TOWER_MIN = 0.90     # x2 towers (on 2 cores) vs the unwrapped model_fn.
LINEAR_SLACK = 1.5       # late per-tower build cost / early per-tower cost.


@dataclasses.dataclass(frozen=True)
class Row:
  """One system's throughput on one model."""
  model: str
  label: str
  system: str
  towers: int
  median: float   # examples/sec over the timed windows.
  low: float
  high: float
  windows: int
  setup_seconds: float
  max_rss_mb: float
  rates: tuple = ()  # every window's examples/sec, in time order.


def to_row(timing: schedule.Timing, global_batch_size: int) -> Row:
  """Examples/sec of every window: steps x global batch / seconds."""
  rates = [timing.steps_per_window * global_batch_size / s
           for s in timing.window_seconds]
  job = timing.job
  return Row(job.model, job.label, job.system, job.towers,
             statistics.median(rates), min(rates), max(rates), len(rates),
             timing.setup_seconds, timing.max_rss_mb, tuple(rates))


def find(rows: list, model: str, system: str, towers: int) -> Optional[Row]:
  return next((r for r in rows if (r.model, r.system) == (model, system) and
               (system == "single" or r.towers == towers)), None)


def ratio(row: Row, other: Optional[Row]) -> Optional[float]:
  return row.median / other.median if other else None


def _fmt(value: Optional[float], pattern: str = "{:.2f}") -> str:
  return "-" if value is None else pattern.format(value)


def throughput_table(rows: list) -> str:
  """Markdown: one line per model and system."""
  lines = ["| model | system | examples/sec median [min-max] | vs single | "
           "vs mirrored same towers | setup s | peak RSS MB |",
           "|---|---|---|---|---|---|---|"]
  for row in rows:
    mirrored = find(rows, row.model, "mirrored", row.towers)
    lines.append(
        f"| {row.model} | {row.label} | {row.median:.0f} [{row.low:.0f}-"
        f"{row.high:.0f}] | {_fmt(ratio(row, find(rows, row.model, 'single', 1)))}x"
        f" | {_fmt(ratio(row, mirrored) if row.system != 'mirrored' else None)}"
        f" | {row.setup_seconds:.1f} | {row.max_rss_mb:.0f} |")
  return "\n".join(lines)


def graph_table(model: str, results: dict, towers: list) -> str:
  """Markdown: build seconds per tower count, with and without equality."""
  header = "| towers | " + " | ".join(str(k) for k in towers) + " |"
  lines = [f"Graph construction, {model} (seconds):", "", header,
           "|---" * (len(towers) + 1) + "|"]
  for name, result in results.items():
    seconds = (result or {}).get("seconds", {})
    lines.append(f"| {name.replace('_', ' ')} | " + " | ".join(
        _fmt(seconds.get(str(k))) for k in towers) + " |")
  return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Check:
  name: str
  passed: bool
  detail: str

  def line(self) -> str:
    return f"{'PASS' if self.passed else 'MISS'} {self.name}: {self.detail}"


def throughput_checks(rows: list, model: str, towers: list) -> list:
  """The issue's throughput targets for one model."""
  single = find(rows, model, "single", 1)
  checks = []
  for k, target in ((1, ONE_TOWER_MIN), (2, TWO_TOWER_MIN)):
    row = find(rows, model, "multi_gpu", k)
    if row and single and k in towers:
      value = ratio(row, single)
      checks.append(Check(f"{model} multi_gpu x{k} >= {target}x single",
                          value >= target, f"{value:.3f}x"))
  for k in towers:
    row, mirrored = (find(rows, model, "multi_gpu", k),
                     find(rows, model, "mirrored", k))
    if row and mirrored:
      value = ratio(row, mirrored)
      checks.append(Check(f"{model} multi_gpu x{k} faster than mirrored x{k}",
                          value > 1.0, f"{value:.3f}x"))
  return checks


def linear_check(model: str, name: str, result: Optional[dict]) -> list:
  """Per-tower build cost of the last towers vs the first ones."""
  seconds = {int(k): v for k, v in (result or {}).get("seconds", {}).items()}
  ks = sorted(seconds)
  if len(ks) < 3:
    return []
  early = (seconds[ks[1]] - seconds[ks[0]]) / (ks[1] - ks[0])
  late = (seconds[ks[-1]] - seconds[ks[-2]]) / (ks[-1] - ks[-2])
  growth = late / early if early > 0 else float("inf")
  return [Check(f"{model} graph construction linear in towers ({name})",
                growth <= LINEAR_SLACK,
                f"{early:.2f} s/tower for towers {ks[0]}->{ks[1]}, "
                f"{late:.2f} s/tower for {ks[-2]}->{ks[-1]} ({growth:.2f}x)")]


def to_json(path: str, settings: dict, rows: list, graph: dict,
            checks: list) -> None:
  with open(path, "w") as f:
    json.dump({"settings": settings,
               "throughput": [dataclasses.asdict(r) for r in rows],
               "graph_construction": graph,
               "targets": [dataclasses.asdict(c) for c in checks]}, f,
              indent=2)
