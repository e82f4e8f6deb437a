"""Results of `bench.cluster`: one job's summary, the table, the markdown."""

from __future__ import annotations

import os
import statistics

from bench import cluster_model

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def summarize(record: dict, system: str, tasks: int, towers: int,
              global_batch: int, warmup: int) -> dict:
  """Rate and bytes per step of one job, from its chief's step record."""
  steps, lo = record["steps"], record["lo_bytes"]
  timed = steps[-1] - steps[warmup - 1]
  model_bytes = record["model_bytes"]
  return {
      "examples_per_sec": cluster_model.examples_per_sec(
          record["times"], steps, global_batch, warmup),
      "timed_steps": timed, "model_bytes": model_bytes,
      "derived_bytes_per_step": cluster_model.wire_bytes_per_step(
          system, model_bytes, tasks, towers),
      "loopback_bytes_per_step": (lo[-1] - lo[warmup - 1]) / timed,
  }


def cpu_ms_per_step(records: list, warmup: int) -> float:
  """CPU milliseconds all trainers together used per global step, between
  the end of step `warmup` and their last step (each task's own count):
  less dependent on the machine's load than the rate."""
  total = 0.0
  for record in records:
    cpu, steps = record.get("cpu_seconds"), record["steps"]
    if not cpu or len(cpu) <= warmup:
      return float("nan")
    total += (cpu[-1] - cpu[warmup - 1]) / (steps[-1] - steps[warmup - 1])
  return 1000 * total


def outside_run_ms(record: dict, warmup: int) -> float:
  """Median milliseconds per step the chief spent outside its recorder's
  `session.run` (the other hooks, Estimator's loop, Python), after warm-up."""
  times, runs = record["times"], record.get("run_seconds")
  if not runs or len(times) <= warmup:
    return float("nan")
  gaps = [b - a - run for a, b, run in zip(times[warmup - 1:], times[warmup:],
                                           runs[warmup:])]
  return 1000 * statistics.median(gaps)


def rederive(run: dict) -> dict:
  """`run` with its derived bytes recomputed by the current formulas."""
  if "error" in run:
    return run
  return {**run, "derived_bytes_per_step": cluster_model.wire_bytes_per_step(
      run["system"], run["model_bytes"], run["tasks"], run["towers"])}


def run_line(run: dict) -> str:
  """One progress line per job."""
  head = (f"{run['system']} {run['model']} {run['tasks']} tasks x "
          f"{run['towers']} towers, round {run.get('round', '?')}: ")
  if "error" in run:
    return head + f"FAILED {run['error']} {run['codes']}"
  return head + (f"{run['examples_per_sec']:.0f} ex/s, "
                 f"{run['loopback_bytes_per_step'] / 1e6:.1f} MB/step on lo "
                 f"(derived {run['derived_bytes_per_step'] / 1e6:.1f}); "
                 f"{run.get('cpu_ms_per_step', float('nan')):.1f} CPU ms/step, "
                 f"{run.get('outside_run_ms', float('nan')):.1f} ms outside "
                 "session.run; job "
                 f"{run['job_seconds']:.0f} s")


def _key(run: dict) -> tuple:
  return run["model"], run["tasks"], run["towers"]


def _system_stats(runs: list) -> dict:
  """Median and range of the rates, medians of the bytes, of one system."""
  ok = [r for r in runs if "error" not in r]
  if not ok:
    return {"runs": 0}
  rates = [r["examples_per_sec"] for r in ok]
  return {"runs": len(ok), "median": statistics.median(rates),
          "min": min(rates), "max": max(rates),
          "derived_mb": ok[0]["derived_bytes_per_step"] / 1e6,
          "loopback_mb": statistics.median(
              r["loopback_bytes_per_step"] for r in ok) / 1e6,
          "model_mb": ok[0]["model_bytes"] / 1e6}


def _systems(runs: list) -> list:
  return list(dict.fromkeys(r["system"] for r in runs))


def table_rows(runs: list) -> list:
  """One row per (model, tasks, towers): every system, and the ratio of
  ours ("allreduce") to each other one."""
  rows = []
  systems = _systems(runs)
  for key in dict.fromkeys(_key(r) for r in runs):
    row = {"model": key[0], "tasks": key[1], "towers": key[2], "ratios": {}}
    for system in systems:
      row[system] = _system_stats([r for r in runs if _key(r) == key and
                                   r["system"] == system])
    for system in systems:
      if system != "allreduce" and row[system]["runs"] and row.get(
          "allreduce", {}).get("runs"):
        row["ratios"][system] = (row["allreduce"]["median"] /
                                 row[system]["median"])
    rows.append(row)
  return rows


def _cell(stats: dict) -> str:
  if not stats.get("runs"):
    return "–"
  return f"{stats['median']:.0f} [{stats['min']:.0f}–{stats['max']:.0f}]"


def _bytes(stats: dict) -> str:
  if not stats.get("runs"):
    return "–"
  return f"{stats['derived_mb']:.1f} / {stats['loopback_mb']:.1f}"


def markdown(config: dict, rows: list) -> str:
  """The results table, with the run's settings in its heading."""
  systems = [s for s in config.get("systems", ["ps", "allreduce"])
             if any(s in row for row in rows)]
  peers = [s for s in systems if s != "allreduce"]
  lines = [
      f"\n## {', '.join(systems)} on loopback ({config['cpu_count']} cores; "
      f"{config['rounds']} runs per system, alternating; {config['steps']} "
      f"steps, the first {config['warmup']} left out; load average before "
      f"{config['load_average_before']:.1f})\n",
      "| model | tasks × towers | P (MB) | " + " | ".join(
          f"{s} ex/s median [min–max]" for s in systems) + " | " + " | ".join(
              f"allreduce / {s}" for s in peers) + " | " + " | ".join(
                  f"{s} MB/step derived / lo" for s in systems) + " |",
      "|---|---|---|" + "---|" * (2 * len(systems) + len(peers))]
  for row in rows:
    model_mb = next((row[s]["model_mb"] for s in systems
                     if row.get(s, {}).get("runs")), float("nan"))
    ratios = [f"{row['ratios'][s]:.2f}×" if s in row["ratios"] else "–"
              for s in peers]
    lines.append(
        f"| {row['model']} | {row['tasks']} × {row['towers']} | "
        f"{model_mb:.2f} | " + " | ".join(_cell(row.get(s, {}))
                                         for s in systems) + " | " +
        " | ".join(ratios) + " | " +
        " | ".join(_bytes(row.get(s, {})) for s in systems) + " |")
  return "\n".join(lines)
