"""docs/cluster's TFJob and Slurm script start docs/distributed.md's job.

No cluster and no network: the TFJob manifest is read and given the TF_CONFIG
Kubeflow's controller would set in each pod; the Slurm script's TF_CONFIG
helper runs with a fake `scontrol` and fake SLURM_* variables. Each TF_CONFIG
goes through train.py's cluster parsing (`cluster.resolve_task`) and
Estimator's RunConfig.
"""

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import tensorflow as tf
import yaml

from estimator_multigpu import cluster
from estimator_multigpu.cluster import slurm

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
TFJOB = DOCS / "cluster" / "tfjob.yaml"
SBATCH = DOCS / "cluster" / "slurm.sbatch"
NODES = ["node01", "node02", "node03", "node04", "node05", "node06"]


def kubeflow_tf_configs(manifest: dict) -> dict:
  """{(type, index): TF_CONFIG} as Kubeflow's TFJob controller sets them.

  Its rule (training-operator, `genClusterSpec`): every replica type,
  lowercased, is a job of the cluster whose task i is at
  `<name>-<type>-<i>.<namespace>.svc:<port>`, the port being the
  `tensorflow` container's `tfjob-port` (default 2222); the task is the
  pod's type and index.
  """
  name, namespace = (manifest["metadata"]["name"],
                     manifest["metadata"].get("namespace", "default"))
  specs = {kind.lower(): spec for kind, spec in
           manifest["spec"]["tfReplicaSpecs"].items()}
  cluster_spec = {
      job: [f"{name}-{job}-{i}.{namespace}.svc:{tfjob_port(spec)}"
            for i in range(spec.get("replicas", 1))]
      for job, spec in specs.items()}
  return {(job, i): json.dumps({"cluster": cluster_spec,
                                "task": {"type": job, "index": i},
                                "environment": "cloud"})
          for job, hosts in cluster_spec.items() for i in range(len(hosts))}


def tfjob_port(spec: dict) -> int:
  container, = [c for c in spec["template"]["spec"]["containers"]
                if c["name"] == "tensorflow"]
  ports = [p["containerPort"] for p in container.get("ports", [])
           if p["name"] == "tfjob-port"]
  return ports[0] if ports else 2222


def doc_job() -> tuple:
  """distributed.md's example: its flags, ps and worker addresses."""
  text = (DOCS / "distributed.md").read_text().replace("\\\n", " ")
  values = dict(re.findall(r'^(CLUSTER|FLAGS)="([^"]*)"', text, re.M))
  hosts = dict(re.findall(r"--(ps_hosts|worker_hosts)=(\S+)",
                          values["CLUSTER"]))
  return (values["FLAGS"].split(), hosts["ps_hosts"].split(","),
          hosts["worker_hosts"].split(","))


def check_roles(tasks: dict, addresses: dict) -> None:
  """`tasks`: {(type, index): Task} of a whole job; `addresses`: its cluster."""
  _, ps_hosts, worker_hosts = doc_job()
  assert sorted(tasks) == (
      [("chief", 0), ("evaluator", 0)] +
      [("ps", i) for i in range(len(ps_hosts))] +
      [("worker", i) for i in range(len(worker_hosts) - 1)])
  for (job, index), task in tasks.items():
    assert (task.type, task.index) == (job, index)
    assert task.device == f"/job:{job}/task:{index}"
    assert task.is_chief == (job == "chief")
    assert task.cluster == addresses  # the evaluator is not part of it.
    # Worker 0 of the doc's flags is the chief; 1 and 2 are worker 0, 1.
    assert task.trainers == ["chief:0", "worker:0", "worker:1"]


def run_config(task: cluster.Task, monkeypatch) -> tf.estimator.RunConfig:
  """Estimator's view of the TF_CONFIG train.py sets for `task`."""
  monkeypatch.setenv("TF_CONFIG", task.tf_config())
  return tf.estimator.RunConfig()


def test_the_manifest_and_the_script_run_the_docs_flags():
  flags, ps_hosts, worker_hosts = doc_job()
  manifest = yaml.safe_load(TFJOB.read_text())
  specs = manifest["spec"]["tfReplicaSpecs"]
  for spec in specs.values():
    container, = spec["template"]["spec"]["containers"]
    assert container["command"] + container["args"] == [
        "python", "train.py", *flags]
  assert {kind: spec["replicas"] for kind, spec in specs.items()} == {
      "Chief": 1, "Worker": len(worker_hosts) - 1, "PS": len(ps_hosts),
      "Evaluator": 1}
  script = SBATCH.read_text().replace("\\\n", " ")
  assert re.search(r'^FLAGS="([^"]*)"', script, re.M).group(1).split() == (
      flags)
  assert "exec python train.py '\"$FLAGS\"" in script


def test_tfjob_tf_configs_give_the_docs_roles(monkeypatch):
  configs = kubeflow_tf_configs(yaml.safe_load(TFJOB.read_text()))
  tasks = {key: cluster.resolve_task(None, None, None, 0, config)
           for key, config in configs.items()}
  check_roles(tasks, {
      "chief": ["flowers-chief-0.default.svc:2222"],
      "worker": ["flowers-worker-0.default.svc:2222",
                 "flowers-worker-1.default.svc:2222"],
      "ps": ["flowers-ps-0.default.svc:2222",
             "flowers-ps-1.default.svc:2222"]})
  chief = run_config(tasks["chief", 0], monkeypatch)
  assert chief.is_chief and chief.num_ps_replicas == 2
  assert chief.num_worker_replicas == 3  # the chief and 2 workers.
  evaluator = run_config(tasks["evaluator", 0], monkeypatch)
  assert evaluator.task_type == "evaluator" and not evaluator.is_chief


@pytest.fixture(name="fake_scontrol")
def fixture_fake_scontrol(tmp_path, monkeypatch):
  """An `scontrol` on PATH that expands node[01-06] and nothing else."""
  script = tmp_path / "scontrol"
  script.write_text(
      '#!/bin/sh\n[ "$*" = "show hostnames node[01-06]" ] || '
      '{ echo "bad node list: $*" >&2; exit 1; }\n'
      f'printf "%s\\n" {" ".join(NODES)}\n')
  script.chmod(0o755)
  monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def sbatch_helper_args() -> list:
  """The arguments the sbatch script gives the `cluster.slurm` helper."""
  script = SBATCH.read_text()
  assert f"#SBATCH --nodes={len(NODES)}\n" in script
  assert "#SBATCH --ntasks-per-node=1\n" in script
  return shlex.split(re.search(
      r"python -m estimator_multigpu\.cluster\.slurm ([^)]*)\)",
      script).group(1))


def slurm_env(rank, nodes=len(NODES)):
  return {"SLURM_JOB_NODELIST": "node[01-06]", "SLURM_PROCID": str(rank),
          "SLURM_NTASKS": str(nodes)}


@pytest.mark.usefixtures("fake_scontrol")
def test_slurm_tf_configs_give_the_docs_roles(capsys, monkeypatch):
  tasks = {}
  for rank in range(len(NODES)):
    assert slurm.main(sbatch_helper_args(), slurm_env(rank)) == 0
    task = cluster.resolve_task(None, None, None, 0,
                                capsys.readouterr().out.strip())
    tasks[task.type, task.index] = task
  # Rank order: chief, 2 workers, 2 ps, the evaluator (node06).
  check_roles(tasks, {"chief": ["node01:2222"],
                      "worker": ["node02:2222", "node03:2222"],
                      "ps": ["node04:2222", "node05:2222"]})
  worker = run_config(tasks["worker", 1], monkeypatch)
  assert (worker.task_type, worker.task_id) == ("worker", 1)
  assert worker.num_ps_replicas == 2 and worker.num_worker_replicas == 3


@pytest.mark.usefixtures("fake_scontrol")
@pytest.mark.parametrize("args,env,message", [
    (["--num_ps=5", "--evaluator"], slurm_env(0),
     r"6 node\(s\) for --num_ps=5 and an evaluator; expected at least one ps "
     "and one node left for the chief: raise #SBATCH --nodes"),
    (["--num_ps=2"], slurm_env(0, nodes=12),
     "SLURM_NTASKS is 12 on 6 nodes; expected one task per node: #SBATCH "
     "--ntasks-per-node=1"),
    (["--num_ps=2"], slurm_env(6), r"SLURM_PROCID is 6; expected 0..5"),
    (["--num_ps=2"], {"SLURM_PROCID": "0"},
     "SLURM_JOB_NODELIST, SLURM_NTASKS not set: run this in a task that srun"),
    (["--num_ps=2"], dict(slurm_env(0), SLURM_JOB_NODELIST="gpu[1-2]"),
     r"`scontrol show hostnames gpu\[1-2\]` failed: bad node list"),
])
def test_slurm_mistakes_are_one_line_and_status_2(args, env, message, capsys):
  assert slurm.main(args, env) == 2
  out, err = capsys.readouterr()
  assert not out and len(err.strip().splitlines()) == 1
  assert re.search(message, err), err


@pytest.mark.parametrize("tf_config,message", [
    # Kubeflow with two Evaluator replicas.
    ({"cluster": {"chief": ["c:1"], "ps": ["p:1"],
                  "evaluator": ["e0:1", "e1:1"]},
      "task": {"type": "evaluator", "index": 1}},
     "The cluster lists 2 evaluators .*expected at most one.*Evaluator "
     "replicas: 1"),
    # A TFJob with enableDynamicWorker: true.
    ({"sparseCluster": {"worker": {"0": "w:1"}, "ps": ["p:1"]},
      "task": {"type": "worker", "index": 0}},
     "TF_CONFIG has a `sparseCluster` and no `cluster`.*set "
     "enableDynamicWorker: false"),
    # A TFJob with Worker and PS replica specs but no Chief.
    ({"cluster": {"worker": ["w:1"], "ps": ["p:1"]},
      "task": {"type": "worker", "index": 0}},
     "0 chief.*a TFJob needs a Chief replica spec with replicas: 1"),
])
def test_what_a_tfjob_can_give_but_train_py_cannot_run(tf_config, message):
  with pytest.raises(ValueError, match=message):
    cluster.resolve_task(None, None, None, 0, json.dumps(tf_config))


@pytest.mark.slow
def test_the_sbatch_script_gives_each_task_its_tf_config(tmp_path):
  """The script itself, under bash with a fake srun, scontrol and train.py."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  fakes = {
      "scontrol": 'printf "%s\\n" n1 n2 n3 n4 n5 n6',
      # One task per rank in $RANKS; the first failure is srun's status.
      "srun": 'shift; for r in $RANKS; do SLURM_PROCID=$r "$@" || exit; done',
      # `python -m ...` is the real one; `python train.py` prints its input.
      "python": f'[ "$1" = -m ] && exec {sys.executable} "$@"; '
                'echo "$TF_CONFIG"; echo "$*"'}
  for name, body in fakes.items():
    (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
    (bin_dir / name).chmod(0o755)
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
             PYTHONPATH=str(DOCS.parent), SLURM_JOB_NODELIST="n[1-6]",
             SLURM_NTASKS="6", RANKS="1")
  done = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True,
                        text=True, timeout=120, check=False)
  assert done.returncode == 0, done.stderr
  tf_config, command = done.stdout.splitlines()
  assert command.split() == ["train.py", *doc_job()[0]]
  worker = cluster.resolve_task(None, None, None, 0, tf_config)
  assert worker.device == "/job:worker/task:0"  # rank 1: the first worker.
  assert worker.cluster["ps"] == ["n4:2222", "n5:2222"]
  # A helper error ends the task before train.py, with status 2.
  failed = subprocess.run(["bash", str(SBATCH)], env=dict(
      env, SLURM_NTASKS="12", RANKS="0"), capture_output=True, text=True,
                          timeout=120, check=False)
  assert failed.returncode == 2 and not failed.stdout
  assert "expected one task per node" in failed.stderr
