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
SYNC_BATCH_NORM_MIN = 0.80  # sync batch norm xk vs multi_gpu xk (ours).
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
  cpu_median: float = 0.0  # examples per CPU-second (all threads).
  num_ops: int = 0  # ops in the training graph.
  graph_digest: str = ""


def to_row(timing: schedule.Timing, global_batch_size: int) -> Row:
  """Examples/sec of every window: steps x global batch / seconds."""
  examples = timing.steps_per_window * global_batch_size
  rates = [examples / s for s in timing.window_seconds]
  per_cpu = [examples / s for s in timing.window_cpu_seconds]
  job = timing.job
  return Row(job.model, job.label, job.system, job.towers,
             statistics.median(rates), min(rates), max(rates), len(rates),
             timing.setup_seconds, timing.max_rss_mb, tuple(rates),
             statistics.median(per_cpu), timing.num_ops, timing.graph_digest)


def replica_spreads(timings: list) -> list:
  """Per job run in several processes: max / min of their medians, - 1."""
  spreads = []
  for group in schedule.by_job(timings).values():
    medians = [statistics.median(t.window_seconds) for t in group]
    if len(medians) > 1:
      spreads.append(max(medians) / min(medians) - 1)
  return spreads


def find(rows: list, model: str, system: str, towers: int) -> Optional[Row]:
  return next((r for r in rows if (r.model, r.system) == (model, system) and
               (system == "single" or r.towers == towers)), None)


def ratio(row: Row, other: Optional[Row]) -> Optional[float]:
  return row.median / other.median if other else None


def _fmt(value: Optional[float], pattern: str = "{:.2f}") -> str:
  return "-" if value is None else pattern.format(value)


def _rate(value: float) -> str:
  """Examples per second: whole numbers, one decimal below 100."""
  return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def throughput_table(rows: list) -> str:
  """Markdown: one line per model and system."""
  lines = ["| model | system | examples/sec median [min-max] | vs single | "
           "vs mirrored same towers | examples/CPU-s (vs single) | setup s | "
           "peak RSS MB |", "|---|---|---|---|---|---|---|---|"]
  for row in rows:
    single = find(rows, row.model, "single", 1)
    mirrored = find(rows, row.model, "mirrored", row.towers)
    cpu_ratio = (row.cpu_median / single.cpu_median
                 if single and single.cpu_median else None)
    lines.append(
        f"| {row.model} | {row.label} | {_rate(row.median)} "
        f"[{_rate(row.low)}-{_rate(row.high)}] | {_fmt(ratio(row, single))}x"
        f" | {_fmt(ratio(row, mirrored) if row.system != 'mirrored' else None)}"
        f" | {_rate(row.cpu_median)} ({_fmt(cpu_ratio)}x)"
        f" | {row.setup_seconds:.1f} | {row.max_rss_mb:.0f} |")
  return "\n".join(lines)


def modes_table(rows: list) -> str:
  """Markdown: shared vs replicated variables at each tower count > 1."""
  lines = ["| model | towers | shared ex/s | replicated ex/s | replicated / "
           "shared | shared RSS MB | replicated RSS MB |",
           "|---|---|---|---|---|---|---|"]
  for row in rows:
    replicated = find(rows, row.model, "replicated", row.towers)
    if row.system != "multi_gpu" or replicated is None:
      continue
    lines.append(
        f"| {row.model} | {row.towers} | {_rate(row.median)} | "
        f"{_rate(replicated.median)} | {_fmt(ratio(replicated, row))}x | "
        f"{row.max_rss_mb:.0f} | {replicated.max_rss_mb:.0f} |")
  return "\n".join(lines) if len(lines) > 2 else ""


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
  """One target: met or missed, with the measured value."""
  name: str
  passed: bool
  detail: str
  shortfall: float = 0.0  # for a throughput ratio: how far below target.

  def within(self, resolution: Optional[float]) -> bool:
    """A miss by no more than the run's resolution (a ratio's shortfall)."""
    return bool(not self.passed and resolution and
                0 < self.shortfall <= resolution)

  def line(self, resolution: Optional[float] = None) -> str:
    """`PASS|MISS name: detail`; a miss smaller than the run's measured
    resolution (spread of identical processes) says so."""
    note = ""
    if self.within(resolution):
      note = (f" (short by {100 * self.shortfall:.1f}%, within the "
              f"{100 * resolution:.1f}% resolution)")
    return (f"{'PASS' if self.passed else 'MISS'} {self.name}: "
            f"{self.detail}{note}")


def ratio_check(name: str, value: float, target: float, detail: str = "",
                strict: bool = False) -> Check:
  """`value >= target` (or `>` when `strict`), with the shortfall kept."""
  passed = value > target if strict else value >= target
  return Check(name, passed, f"{value:.3f}x{detail}",
               max(0.0, 1 - value / target))


def throughput_checks(rows: list, model: str, towers: list) -> list:
  """The issue's throughput targets for one model."""
  single = find(rows, model, "single", 1)
  checks = []
  for k, target in ((1, ONE_TOWER_MIN), (2, TWO_TOWER_MIN)):
    row = find(rows, model, "multi_gpu", k)
    if row and single and k in towers:
      value = ratio(row, single)
      checks.append(ratio_check(f"{model} multi_gpu x{k} >= {target}x single",
                                value, target))
  for k in towers:
    row, mirrored = (find(rows, model, "multi_gpu", k),
                     find(rows, model, "mirrored", k))
    if row and mirrored:
      value = ratio(row, mirrored)
      checks.append(ratio_check(
          f"{model} multi_gpu x{k} faster than mirrored x{k}", value, 1.0,
          strict=True))
  return checks + split_checks(rows, model, towers)


def sync_batch_norm_checks(rows: list, model: str, towers: list) -> list:
  """What `sync_batch_norm=True` costs: xk with it vs xk without it."""
  checks = []
  for k in towers:
    row, plain = (find(rows, model, "multi_gpu_sync_bn", k),
                  find(rows, model, "multi_gpu", k))
    if row and plain:
      checks.append(ratio_check(
          f"{model} multi_gpu_sync_bn x{k} >= {SYNC_BATCH_NORM_MIN}x "
          f"multi_gpu x{k}", ratio(row, plain), SYNC_BATCH_NORM_MIN,
          f" ({_rate(row.median)} vs {_rate(plain.median)} examples/sec)"))
  return checks


def split_checks(rows: list, model: str, towers: list) -> list:
  """Our own target: `multi_gpu` xk within 3% of the bare k-way split.

  `split xk` (k shards, gradients summed, all on one device) is what the
  split itself costs; what `multi_gpu` adds on top is the wrapper's overhead.
  """
  single, checks = find(rows, model, "single", 1), []
  for k in towers:
    row, split = (find(rows, model, "multi_gpu", k),
                  find(rows, model, "split", k))
    if row and split and single:
      value = ratio(row, split)
      checks.append(ratio_check(
          f"{model} multi_gpu x{k} >= {ONE_TOWER_MIN}x split x{k} (1 device)",
          value, ONE_TOWER_MIN, f"; the split alone is "
          f"{ratio(split, single):.3f}x single"))
  return checks


def same_graph_check(rows: list, model: str) -> list:
  """`multi_gpu` x1 must build the unwrapped model_fn's graph, op for op."""
  single, row = (find(rows, model, "single", 1),
                 find(rows, model, "multi_gpu", 1))
  if not (single and row and single.graph_digest):
    return []
  same = row.graph_digest == single.graph_digest
  return [Check(f"{model} multi_gpu x1 builds the unwrapped graph op for op",
                same, f"{row.num_ops} ops vs {single.num_ops}" +
                ("" if same else ", different names, types or inputs"))]


def linear_check(model: str, name: str, result: Optional[dict]) -> list:
  """Seconds per tower at the most towers vs at the second-fewest.

  Linear growth a + b*k gives a ratio <= 1; quadratic growth c*k^2 gives
  8/2 = 4 from 2 to 8 towers.
  """
  seconds = {int(k): v for k, v in (result or {}).get("seconds", {}).items()}
  ks = sorted(seconds)
  if len(ks) < 3:
    return []
  early, late = seconds[ks[1]] / ks[1], seconds[ks[-1]] / ks[-1]
  growth = late / early
  return [Check(f"{model} graph construction linear in towers ({name})",
                growth <= LINEAR_SLACK,
                f"{early:.2f} s/tower at {ks[1]} towers, {late:.2f} s/tower "
                f"at {ks[-1]} ({growth:.2f}x)")]


def to_json(path: str, settings: dict, rows: list, graph: dict,
            checks: list) -> None:
  with open(path, "w") as f:
    json.dump({"settings": settings,
               "throughput": [dataclasses.asdict(r) for r in rows],
               "graph_construction": graph,
               "targets": [dataclasses.asdict(c) for c in checks]}, f,
              indent=2)
