"""The benchmarks' saved results as plots for the docs: `python -m bench.plots`.

Reads `bench/results.json` (`python -m bench.run`) and
`bench/cluster_results.json` (`python -m bench.cluster`) and draws, into
`--output_dir` (default `docs/img`, the performance page's pictures):

- `throughput_by_towers.png`: examples/sec against towers, one panel per
  model, one line per system (the unwrapped model_fn on one device as a
  dashed reference);
- `throughput_by_system.png`: each system's examples/sec over the unwrapped
  model_fn's, grouped by towers (the bars' whiskers: the slowest and
  fastest timed window);
- `bytes_per_step.png`: bytes per step of a ps job and an all-reduce job for
  each tasks × towers, derived from the variables (bars) and measured on
  loopback (dots).

Needs matplotlib (the `docs` extra); the data functions do not.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[1]

BASELINE = "single"  # the unwrapped model_fn on one device.
CLUSTER_SYSTEMS = ("ps", "allreduce")
# One colour per system in every plot (matplotlib's cycle).
COLORS = {"multi_gpu": "C0", "mirrored": "C1", "tutorial": "C2", "split": "C3",
          "replicated": "C4", "ps": "C0", "allreduce": "C1"}
Series = Dict[str, Dict[str, List[Tuple[int, float]]]]


def load(path: str) -> dict:
  """The JSON a benchmark wrote."""
  with open(path) as f:
    return json.load(f)


def throughput_by_towers(results: dict) -> Series:
  """model -> system -> [(towers, median examples/sec)], towers ascending."""
  series: Series = {}
  for row in results["throughput"]:
    systems = series.setdefault(row["model"], {})
    systems.setdefault(row["system"], []).append((row["towers"], row["median"]))
  for systems in series.values():
    for points in systems.values():
      points.sort()
  return series


def relative_to_baseline(results: dict) -> Dict[str, Dict[str, tuple]]:
  """model -> label -> (system, towers, median, low, high), each rate over
  the baseline's median."""
  rows = results["throughput"]
  base = {r["model"]: r["median"] for r in rows if r["system"] == BASELINE}
  return {model: {r["label"]: (r["system"], r["towers"],
                               r["median"] / base[model],
                               r["low"] / base[model], r["high"] / base[model])
                  for r in rows if r["model"] == model
                  and r["system"] != BASELINE}
          for model in base}


def bytes_per_step(cluster: dict) -> Dict[str, List[tuple]]:
  """model -> [(tasks x towers, system, derived MB, loopback MB)] per row."""
  found: Dict[str, List[tuple]] = {}
  for row in cluster["rows"]:
    topology = f"{row['tasks']}x{row['towers']}"
    for system in CLUSTER_SYSTEMS:
      if system in row:
        found.setdefault(row["model"], []).append(
            (topology, system, row[system]["derived_mb"],
             row[system]["loopback_mb"]))
  return found


def _figure(panels: int):
  """A row of `panels` axes, matplotlib's headless backend."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, axes = pyplot.subplots(1, panels, figsize=(4.2 * panels, 3.4),
                                 squeeze=False)
  return figure, axes[0]


def _save(figure, path: str) -> None:
  figure.tight_layout()
  figure.savefig(path, dpi=90, metadata={"Software": None})
  figure.clf()


def draw_by_towers(series: Series, path: str) -> None:
  """Examples/sec against towers: one panel per model, a line per system."""
  figure, axes = _figure(len(series))
  for ax, (model, systems) in zip(axes, series.items()):
    for system, points in systems.items():
      towers, rates = zip(*points)
      if system == BASELINE:
        ax.axhline(rates[0], color="gray", linestyle="--", label=system)
      else:
        ax.plot(towers, rates, marker="o", label=system,
                color=COLORS.get(system, "C7"))
    ax.set(title=model, xlabel="towers", ylabel="examples/sec",
           xticks=sorted({t for p in systems.values() for t, _ in p}))
  axes[0].legend(fontsize="small")
  _save(figure, path)


def draw_by_system(ratios: Dict[str, Dict[str, tuple]], path: str) -> None:
  """Each system's speed over the unwrapped model_fn's, per model."""
  figure, axes = _figure(len(ratios))
  for ax, (model, labels) in zip(axes, ratios.items()):
    names = sorted(labels, key=lambda name: (labels[name][1], name))
    values = [labels[name][2] for name in names]
    whiskers = [[labels[n][2] - labels[n][3] for n in names],
                [labels[n][4] - labels[n][2] for n in names]]
    ax.barh(names, values, xerr=whiskers, alpha=0.85,
            color=[COLORS.get(labels[n][0], "C7") for n in names])
    ax.axvline(1.0, color="gray", linestyle="--")
    ax.invert_yaxis()
    ax.set(title=model, xlabel=f"examples/sec vs {BASELINE}")
    ax.tick_params(axis="y", labelsize="small")
  _save(figure, path)


def draw_bytes(found: Dict[str, List[tuple]], path: str) -> None:
  """Bytes per step of ps and all-reduce jobs, derived and measured."""
  figure, axes = _figure(len(found))
  for ax, (model, rows) in zip(axes, found.items()):
    topologies = list(dict.fromkeys(row[0] for row in rows))
    for k, system in enumerate(CLUSTER_SYSTEMS):
      mine = {row[0]: row for row in rows if row[1] == system}
      xs = [i + 0.4 * k - 0.2 for i, t in enumerate(topologies) if t in mine]
      kept = [t for t in topologies if t in mine]
      ax.bar(xs, [mine[t][2] for t in kept], width=0.4, label=system,
             color=COLORS[system])
      ax.plot(xs, [mine[t][3] for t in kept], "k.", label=None if k else
              "measured on loopback")
    ax.set_xticks(range(len(topologies)), topologies)
    ax.set(title=model, xlabel="tasks x towers", ylabel="MB per step")
  axes[0].legend(fontsize="small")
  _save(figure, path)


def draw_all(results_path: str, cluster_path: str, output_dir: str) -> list:
  """Draws the three plots; returns their paths."""
  os.makedirs(output_dir, exist_ok=True)
  results, cluster = load(results_path), load(cluster_path)
  paths = [os.path.join(output_dir, name) for name in (
      "throughput_by_towers.png", "throughput_by_system.png",
      "bytes_per_step.png")]
  draw_by_towers(throughput_by_towers(results), paths[0])
  draw_by_system(relative_to_baseline(results), paths[1])
  draw_bytes(bytes_per_step(cluster), paths[2])
  return paths


def main(argv: Optional[Sequence[str]] = None) -> None:
  """Draws the plots; prints each file's path. (argparse: the flags of
  convert.py and bench's absl modules stay apart.)"""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--results", default=str(ROOT / "bench" / "results.json"),
                      help="JSON of `python -m bench.run`.")
  parser.add_argument("--cluster_results",
                      default=str(ROOT / "bench" / "cluster_results.json"),
                      help="JSON of `python -m bench.cluster`.")
  parser.add_argument("--output_dir", default="docs/img",
                      help="where the PNGs go (default: docs/img).")
  args = parser.parse_args(argv)
  for path in draw_all(args.results, args.cluster_results, args.output_dir):
    print(path)


if __name__ == "__main__":
  main()
