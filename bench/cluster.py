"""Ours against parameter servers and the peers, across processes on
loopback: `python -m bench.cluster [--quick]`.

For every model and (tasks, towers) pair, a job of every system in
`--systems` — a ps job (1 ps + N synchronous workers, SyncReplicasOptimizer,
shared variables), our all-reduce job (chief + N−1 workers, replicated
variables, `emg.train_and_evaluate`), MultiWorkerMirroredStrategy +
Estimator and Horovod (`bench.cluster_horovod`, when installed) — is started
on free loopback ports, one job at a time, the systems in alternating order
round after round, so drifts of a shared machine touch all alike. Each job
runs `bench.cluster_task` (`bench.cluster_jobs` starts and stops the
processes); every trainer records each step's time, global step, loopback
byte counter and its CPU time. examples/sec are the chief's after
`--warmup` steps; bytes per step are both derived from the variables
(`bench.cluster_model`) and read off `lo` (every process's loopback traffic,
so anything else on it counts too); CPU ms per step are all trainers'
together, which depend less on the machine's load than the rate. A line
per job as it ends (system, model, topology, round, examples/s), then a
markdown table; JSON (default in the temp dir); the task logs are removed
unless a job failed. Every job ends by itself or at `--timeout_secs`; its
processes are then killed by PID, also when the coordinator is interrupted.
`--report=JSON` re-renders a saved run; `--trace_step` adds what one step
runs (`bench.cluster_trace`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time

from absl import app
from absl import flags

from bench import cluster_jobs
from bench import cluster_report
from bench import cluster_trace
from bench import specs

FLAGS = flags.FLAGS
flags.DEFINE_bool("quick", False, "60 steps (10 warm-up), 2 rounds: "
                  "about 10 minutes on a busy 2-core machine.")
flags.DEFINE_list("models", ["mlp", "lenet"], "Models from bench.specs.")
flags.DEFINE_list("configs", ["2:1", "2:2", "4:1", "4:2"],
                  "tasks:towers pairs.")
flags.DEFINE_integer("steps", None, "Steps per job (default 100; quick 60).")
flags.DEFINE_integer("warmup", None, "Steps left out (default 20; quick 10).")
flags.DEFINE_integer("rounds", None, "Runs per system and config (default "
                     "3; quick 2).")
flags.DEFINE_float("timeout_secs", 300, "Per job; then its processes die.")
flags.DEFINE_string("report", None, "Re-render the table of a saved JSON "
                    "(derived bytes recomputed with the current formulas); "
                    "runs nothing.")
flags.DEFINE_string("output", None, "JSON path (default: "
                    "bench_cluster.json in the temp dir).")

flags.DEFINE_integer("trace_step", 0, "Trace this step of every chief "
                     "(FULL_TRACE) and print, per job, the ops that step "
                     "ran by type against ours (0: no trace).")
flags.DEFINE_list("systems", ["ps", "allreduce", "mwms", "horovod"],
                  "ps: 1 ps + synchronous workers; allreduce: ours (chief + "
                  "workers); mwms: MultiWorkerMirroredStrategy + Estimator "
                  "(one replica per task, run at 1 tower per task only); "
                  "horovod: Horovod with gloo, one process per tower "
                  "(skipped with one line where it is not installed).")


def settings() -> dict:
  """The run's settings from the flags (`--quick` shortens everything)."""
  quick = FLAGS.quick
  pick = lambda value, full, short: value if value is not None else (
      short if quick else full)
  return {"quick": quick, "models": FLAGS.models,
          "configs": [tuple(int(n) for n in c.split(":"))
                      for c in FLAGS.configs],
          "steps": pick(FLAGS.steps, 100, 60),
          "warmup": pick(FLAGS.warmup, 20, 10),
          "rounds": pick(FLAGS.rounds, 3, 2), "cpu_count": os.cpu_count(),
          "systems": FLAGS.systems, "trace_step": FLAGS.trace_step,
          "load_average_before": os.getloadavg()[0]}


def run_job(job: dict, warmup: int, log_root: str) -> dict:
  """One job ({system, model, tasks, towers, steps, trace_step, round}),
  start to end: the chief's rate and bytes, or the failure."""
  work_dir = tempfile.mkdtemp(
      prefix=f"{job['model']}-{job['system']}-{job['tasks']}x"
      f"{job['towers']}-", dir=log_root)
  began, processes = time.monotonic(), []
  try:
    cluster_jobs.start_job(job, work_dir, processes)
    codes = cluster_jobs.wait_and_stop(processes, FLAGS.timeout_secs)
  finally:  # also on SIGTERM or Ctrl-C: no task outlives the coordinator.
    cluster_jobs.wait_and_stop(processes, 0.0)
  result = {key: job[key] for key in ("system", "model", "tasks", "towers",
                                      "round")}
  result.update(codes=codes, log_dir=work_dir,
                job_seconds=time.monotonic() - began)
  return {**result, **read_chief(result, warmup)}


def read_chief(result: dict, warmup: int) -> dict:
  """The summary of the chief's step record (with every trainer's CPU time
  and traced step), or an error."""
  name = "worker0.json" if result["system"] == "ps" else "chief0.json"
  records = task_records(result["log_dir"])
  if name not in records:
    return {"error": f"no step record; see {result['log_dir']}"}
  batch = result["tasks"] * specs.get_model(result["model"]).global_batch_size
  summary = cluster_report.summarize(records[name], result["system"],
                                     result["tasks"], result["towers"],
                                     batch, warmup)
  summary["cpu_ms_per_step"] = cluster_report.cpu_ms_per_step(
      list(records.values()), warmup)
  summary["outside_run_ms"] = cluster_report.outside_run_ms(records[name],
                                                           warmup)
  if records[name].get("trace"):
    summary["trace"] = records[name]["trace"]
    summary["timelines"] = {task: record.get("timeline")
                            for task, record in records.items()}
  return summary


def task_records(log_dir: str) -> dict:
  """{task name: step record} of every trainer of a job that wrote one."""
  records = {}
  for name in sorted(os.listdir(log_dir)):
    if name.endswith(".json"):
      with open(os.path.join(log_dir, name)) as record_file:
        records[name] = json.load(record_file)
  return records


def rerender(path: str) -> int:
  """Prints the table of a saved run, derived bytes recomputed."""
  with open(path) as saved:
    data = json.load(saved)
  runs = [cluster_report.rederive(run) for run in data["runs"]]
  print(cluster_report.markdown(data["settings"],
                                cluster_report.table_rows(runs)))
  return 0


def _raise_interrupt(signum, frame):
  del signum, frame
  raise KeyboardInterrupt


def run_all(config: dict, todo: list, log_root: str) -> list:
  """Runs the jobs `todo` one at a time, a progress line after each."""
  runs = []
  for job in todo:
    runs.append(run_job(job, config["warmup"], log_root))
    print(cluster_report.run_line(runs[-1]), flush=True)
  return runs


def write_json(config: dict, runs: list, rows: list) -> str:
  """Writes the run to --output (default: the temp dir); returns the path."""
  output = FLAGS.output or os.path.join(tempfile.gettempdir(),
                                        "bench_cluster.json")
  with open(output, "w") as out:
    json.dump({"settings": config, "runs": runs, "rows": rows}, out, indent=1)
  return output


def main(argv) -> int:
  """Runs the benchmark; exit status 1 when a job failed, 2 when no system
  given can run here."""
  del argv
  if FLAGS.report:
    return rerender(FLAGS.report)
  signal.signal(signal.SIGTERM, _raise_interrupt)  # runs run_job's finally.
  config, start = settings(), time.monotonic()
  todo = cluster_jobs.jobs(config)
  if not todo:
    print(f"Nothing to run: --systems={','.join(config['systems'])} has no "
          "system this Python can run; name another (ps, allreduce, mwms).")
    return 2
  log_root = tempfile.mkdtemp(prefix="bench_cluster_")
  runs = run_all(config, todo, log_root)
  config["total_seconds"] = time.monotonic() - start
  rows = cluster_report.table_rows(runs)
  output = write_json(config, runs, rows)
  failed = any("error" in run for run in runs)
  if not failed:
    shutil.rmtree(log_root, ignore_errors=True)
  print(cluster_report.markdown(config, rows))
  if config["trace_step"]:
    print(cluster_trace.comparison(runs))
  print(f"\n(total {config['total_seconds']:.0f} s; JSON in {output}; logs "
        f"{'kept in ' + log_root if failed else 'removed'})")
  return 1 if failed else 0


if __name__ == "__main__":
  app.run(main)
