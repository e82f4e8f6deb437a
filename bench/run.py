"""Benchmarks `multi_gpu` (shared and replicated variables, side by side)
against the unwrapped model_fn, MirroredStrategy and the hand-written tower
loop: `python -m bench.run [--quick]`.

Prints markdown tables and PASS/MISS target lines, writes JSON (--output,
default outside the checkout in the temp dir; the path is printed). Every
system runs in its own subprocess; timed windows are interleaved, so compare
ratios within one run, not absolute numbers across runs. The subprocess logs
go to a temp dir that is removed at the end unless a system failed
(--keep_logs keeps it). Progress goes to stderr as it happens (one line per
model, system ready, warm-up, round of windows and graph timing); the
tables come at the end. Exit status: 0 when every target passed or missed by
less than the run's resolution; 1 when a target missed beyond it or a system
failed.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import tempfile
import time

from absl import app
from absl import flags
from absl import logging

from cli import script_logging

script_logging.before_tensorflow()  # C++ log level: before TensorFlow.

# pylint: disable=g-import-not-at-top,wrong-import-position
from bench import report
from bench import schedule
from bench import specs

FLAGS = flags.FLAGS

flags.DEFINE_bool("quick", False, "MLP and LeNet, fewer and shorter "
                  "windows, LeNet graph builds: about 160 s on an idle "
                  "2-core machine, 400 s on a busy one.")
flags.DEFINE_list("models", None, "Models (default: mlp,lenet,resnet_v1_50; "
                  "quick: mlp,lenet). Choices: " + ",".join(specs.MODELS))
flags.DEFINE_list("towers", ["1", "2", "4"], "Tower counts for multi_gpu and "
                  "MirroredStrategy.")
flags.DEFINE_list("tutorial_towers", None, "Tower counts of the hand-written "
                  "loop, on N devices (tutorial) and on one (split) "
                  "(default: --towers without 1; quick: 2).")
flags.DEFINE_integer("replicas", 1, "Identical processes per system, "
                     "windows pooled (the baseline always runs in at least "
                     "2, which measures the resolution). More replicas "
                     "tighten the ratios and cost memory and set-up time.")
flags.DEFINE_integer("rounds", None, "Timed windows per system (default 7; "
                     "quick 5).")
flags.DEFINE_float("window_seconds", None, "Target length of one window "
                   "(default 1.5; quick 0.5).")
flags.DEFINE_string("graph_model", None, "Model whose graph construction is "
                    "timed (default resnet_v1_50; quick lenet); '' skips it.")
flags.DEFINE_list("graph_towers", ["1", "2", "4", "8"], "Tower counts of the "
                  "graph-construction timing.")
flags.DEFINE_integer("graph_repeats", None, "Builds per tower count, fastest "
                     "kept (default 1; quick 3).")
flags.DEFINE_enum("kind", "auto", ["auto", "cpu", "gpu"], "Tower devices: "
                  "virtual CPUs, or GPUs (auto: GPUs if nvidia-smi exists).")
flags.DEFINE_list("thread_variants", [], "Extra multi_gpu runs with explicit "
                  "session thread pools, as intra:inter pairs (e.g. 1:2).")
flags.DEFINE_string("output", None, "Where the JSON goes (default: "
                    "bench_results.json in the temp dir, outside the "
                    "checkout).")
flags.DEFINE_bool("keep_logs", False, "Keep the subprocess logs (kept "
                  "anyway when a system failed).")


def output_path(flag_value: str = None) -> str:
  """--output, else bench_results.json in the temp dir."""
  return flag_value or os.path.join(tempfile.gettempdir(),
                                    "bench_results.json")


def exit_status(checks: list, resolution, failures: list) -> int:
  """1 when a system failed or a target missed beyond the resolution."""
  beyond = [check for check in checks if not check.passed and
            not check.within(resolution)]
  return 1 if beyond or failures else 0


def settings() -> dict:
  """The run's settings, resolved from the flags and --quick."""
  quick = FLAGS.quick
  pick = lambda value, full, short: value if value is not None else (
      short if quick else full)
  towers = [int(k) for k in FLAGS.towers]
  return {
      "quick": quick,
      "models": pick(FLAGS.models, ["mlp", "lenet", "resnet_v1_50"],
                     ["mlp", "lenet"]),
      "towers": towers,
      "tutorial_towers": [int(k) for k in pick(
          FLAGS.tutorial_towers, [k for k in towers if k > 1], [2])],
      "replicas": FLAGS.replicas,
      "rounds": pick(FLAGS.rounds, 7, 5),
      "window_seconds": pick(FLAGS.window_seconds, 1.5, 0.5),
      "graph_model": pick(FLAGS.graph_model, "resnet_v1_50", "lenet"),
      "graph_towers": [int(k) for k in FLAGS.graph_towers],
      "graph_repeats": pick(FLAGS.graph_repeats, 1, 3),
      "thread_variants": [tuple(int(n) for n in v.split(":"))
                          for v in FLAGS.thread_variants],
      "kind": (FLAGS.kind if FLAGS.kind != "auto" else
               "gpu" if shutil.which("nvidia-smi") else "cpu"),
      "cpu_count": os.cpu_count(), "machine": platform.platform(),
      "load_average_before": os.getloadavg()[0],
      "python": platform.python_version(),
  }


def jobs_for(model: str, config: dict) -> list:
  """The single-device baseline first, then every system and tower count."""
  make = lambda system, k, threads=(0, 0): schedule.Job(
      system, k, model, config["kind"], *threads)
  jobs = ([make("single", 1)] +
          [make("multi_gpu", k) for k in config["towers"]] +
          [make("replicated", k) for k in config["towers"] if k > 1] +
          [make("multi_gpu", k, v) for v in config["thread_variants"]
           for k in config["towers"]] +
          [make("multi_gpu_sync_bn", k) for k in config["towers"]
           if k > 1 and model in specs.BATCH_NORM_MODELS] +
          [make("mirrored", k) for k in config["towers"]] +
          [make(system, k) for system in ("tutorial", "split")
           for k in config["tutorial_towers"]])
  # The baseline runs at least twice: its replicas measure the resolution,
  # and every ratio's denominator is pooled over them.
  return [dataclasses.replace(job, replica=r) for job in jobs
          for r in range(max(config["replicas"], 2 if job is jobs[0] else 1))]


def main(argv) -> int:
  """Runs the benchmark; returns the exit status (see the docstring)."""
  del argv
  script_logging.configure(FLAGS.verbosity)
  start, config = time.perf_counter(), settings()
  log_dir = tempfile.mkdtemp(prefix="bench_logs_")
  rows, checks, failures, spreads = [], [], [], []
  for number, model in enumerate(config["models"], start=1):
    jobs = jobs_for(model, config)
    logging.info("Model %d/%d: %s, %d system processes side by side "
                 "(%.0f s so far)", number, len(config["models"]), model,
                 len(jobs), time.perf_counter() - start)
    timings, failed = schedule.measure_model(
        jobs, config["rounds"], config["window_seconds"], log_dir)
    failures += failed
    spreads += report.replica_spreads(timings)
    timings = schedule.pool_replicas(timings)
    batch = specs.get_model(model, config["kind"] == "gpu").global_batch_size
    rows += [report.to_row(t, batch) for t in timings]
    checks += report.throughput_checks(rows, model, config["towers"])
    checks += report.same_graph_check(rows, model)
    checks += report.sync_batch_norm_checks(rows, model, config["towers"])
  graph = {}
  if config["graph_model"]:
    graph = schedule.measure_graph_build(
        config["graph_model"], config["graph_towers"],
        config["graph_repeats"], log_dir)
    for name, result in graph.items():
      checks += report.linear_check(config["graph_model"], name, result)
  config["total_seconds"] = time.perf_counter() - start
  config["failures"] = failures
  config["replica_spread"] = max(spreads, default=None)
  output = output_path(FLAGS.output)
  report.to_json(output, config, rows, graph, checks)
  keep = FLAGS.keep_logs or bool(failures)
  if not keep:
    shutil.rmtree(log_dir, ignore_errors=True)
  print_report(config, rows, graph, checks, log_dir if keep else None,
               output)
  return exit_status(checks, config["replica_spread"], failures)


def print_report(config: dict, rows: list, graph: dict, checks: list,
                 log_dir, output: str) -> None:
  print(f"\n## Throughput ({config['kind']}, {config['cpu_count']} cores, "
        f"{config['rounds']} windows of ~{config['window_seconds']} s per "
        "system, interleaved; load average before the run "
        f"{config['load_average_before']:.1f})\n")
  print(report.throughput_table(rows))
  modes = report.modes_table(rows)
  if modes:
    print("\nVariable modes (multi_gpu shared vs replicated, same run):\n")
    print(modes)
  if graph:
    print("\n" + report.graph_table(config["graph_model"], graph,
                                    config["graph_towers"]))
  if config["load_average_before"] > 0.5 * config["cpu_count"]:
    print(f"\nNOTE: load average {config['load_average_before']:.1f} on "
          f"{config['cpu_count']} cores before the run: other processes "
          "were busy, so windows vary more; ratios are still side by side.")
  if config["replica_spread"] is not None:
    print(f"\nResolution: identical processes of one system differed by up "
          f"to {100 * config['replica_spread']:.1f}% in median step time "
          f"(the baseline runs in {max(config['replicas'], 2)} processes, "
          f"other systems in {config['replicas']}); differences smaller than "
          "that are noise.")
  print("\n## Targets\n")
  print("\n".join([check.line(config["replica_spread"]) for check in checks] +
                  [f"FAILED {failure}" for failure in config["failures"]]))
  logs = (f"subprocess logs in {log_dir}" if log_dir else
          "subprocess logs removed (--keep_logs keeps them)")
  beyond = [c for c in checks
            if not c.passed and not c.within(config["replica_spread"])]
  verdict = (f"{len(beyond)} MISS beyond the resolution: exit status 1"
             if beyond or config["failures"] else
             "every MISS within the resolution" if any(
                 not c.passed for c in checks) else "every target met")
  print(f"\n({verdict}; total {config['total_seconds']:.0f} s; {logs}; "
        f"JSON in {output})")


if __name__ == "__main__":
  app.run(main)  # exits with main's return value.
