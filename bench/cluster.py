"""Parameter servers vs all-reduce across processes on loopback:
`python -m bench.cluster [--quick]`.

For every model and (tasks, towers) pair, a ps job (1 ps + N synchronous
workers, SyncReplicasOptimizer, shared variables) and an all-reduce job
(chief + N−1 workers, replicated variables, `emg.train_and_evaluate`) are
started on free loopback ports, one job at a time, in alternating order
round after round (ps, all-reduce, all-reduce, ps, ...), so drifts of a
shared machine touch both alike. Each job runs `bench.cluster_task`; the
chief records every step's time, global step and loopback byte counter.
examples/sec are taken after `--warmup` steps; bytes per step are both
derived from the variables (`bench.cluster_model`) and read off `lo`
(every process's loopback traffic, so anything else on it counts too).
Prints a markdown table; writes JSON (default in the temp dir); the task
logs are removed unless a job failed. Every job ends by itself or at
`--timeout_secs`; its processes (own sessions) are then killed by PID, also
when the coordinator is interrupted. `--report=JSON` re-renders a saved run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from bench import cluster_model
from bench import cluster_report
from bench import cluster_trace
from bench import specs
from estimator_multigpu.cluster import launch

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
flags.DEFINE_list("systems", ["ps", "allreduce", "mwms"], "ps: 1 ps + "
                  "synchronous workers; allreduce: ours (chief + workers); "
                  "mwms: MultiWorkerMirroredStrategy + Estimator (one "
                  "replica per task, run at 1 tower per task only).")


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


def task_commands(system: str, tasks: int) -> list:
  """[(name, extra flags, extra environment)] of every process of a job."""
  ports = [f"localhost:{p}" for p in launch.free_ports(tasks + 1)]
  if system == "ps":
    hosts = [f"--ps_hosts={ports[0]}", f"--worker_hosts={','.join(ports[1:])}"]
    return [(f"{job}{i}", hosts + [f"--job_name={job}", f"--task_index={i}"],
             {}) for job, i in [("ps", 0)] + [("worker", i)
                                             for i in range(tasks)]]
  spec = {"chief": ports[:1], "worker": ports[1:tasks]}
  names = [("chief", 0)] + [("worker", i) for i in range(tasks - 1)]
  return [(f"{job}{i}", [], {"TF_CONFIG": json.dumps(
      {"cluster": spec, "task": {"type": job, "index": i}})})
          for job, i in names]


def start_job(system: str, model: str, tasks: int, towers: int, steps: int,
              work_dir: str, started: list) -> None:
  """Starts the job's processes, each in its own session, appending
  (name, Popen) to `started` at once (so a failure half-way leaves the
  caller every process to stop)."""
  for name, flags_, env in task_commands(system, tasks):
    command = [sys.executable, "-m", "bench.cluster_task",
               f"--system={system}", f"--model={model}",
               f"--towers={towers}", f"--steps={steps}",
               f"--model_dir={os.path.join(work_dir, name)}",
               f"--out={os.path.join(work_dir, name + '.json')}",
               f"--trace_step={FLAGS.trace_step}", *flags_]
    with open(os.path.join(work_dir, name + ".log"), "w") as log:
      started.append((name, subprocess.Popen(
          command, cwd=cluster_report.REPO_ROOT, env={**os.environ, **env},
          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)))


def wait_and_stop(processes: list, timeout_secs: float) -> dict:
  """Waits for the trainers (not the ps), then kills what is left by PID."""
  deadline = time.monotonic() + timeout_secs
  for name, process in processes:
    if not name.startswith("ps"):
      try:
        process.wait(timeout=max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        break
  codes = {name: process.poll() for name, process in processes}
  for _, process in processes:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)  # its own session: pgid = pid.
      process.wait()
  return codes


def run_job(system: str, model: str, tasks: int, towers: int,
            config: dict, log_root: str) -> dict:
  """One job, start to end: the chief's rate and bytes, or the failure."""
  work_dir = tempfile.mkdtemp(prefix=f"{model}-{system}-{tasks}x{towers}-",
                              dir=log_root)
  began, processes = time.monotonic(), []
  try:
    start_job(system, model, tasks, towers, config["steps"], work_dir,
              processes)
    codes = wait_and_stop(processes, FLAGS.timeout_secs)
  finally:  # also on SIGTERM or Ctrl-C: no task outlives the coordinator.
    wait_and_stop(processes, 0.0)
  result = {"system": system, "model": model, "tasks": tasks,
            "towers": towers, "codes": codes, "log_dir": work_dir,
            "job_seconds": time.monotonic() - began}
  return {**result, **read_chief(result, config["warmup"])}


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


def run_all(config: dict, log_root: str) -> list:
  """Every job, round after round, ps and all-reduce in alternating order."""
  runs = []
  for round_index in range(config["rounds"]):
    systems = config["systems"]
    order = systems if round_index % 2 == 0 else systems[::-1]
    for model in config["models"]:
      for tasks, towers in config["configs"]:
        for system in order:
          if system == "mwms" and towers != 1:
            continue
          runs.append(run_job(system, model, tasks, towers, config, log_root))
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
  """Runs the benchmark; exit status 1 when a job failed."""
  del argv
  if FLAGS.report:
    return rerender(FLAGS.report)
  signal.signal(signal.SIGTERM, _raise_interrupt)  # runs run_job's finally.
  config, start = settings(), time.monotonic()
  log_root = tempfile.mkdtemp(prefix="bench_cluster_")
  runs = run_all(config, log_root)
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
