"""Where a task's cluster comes from, named in its first line and in the
line that ends it when a peer never came (`cluster.source`)."""

import json

from estimator_multigpu import cluster
from estimator_multigpu.cluster import source

from cli import cluster_task
from cli import settings as settings_lib

TF_CONFIG = json.dumps({"cluster": {"chief": ["127.0.0.1:1"],
                                    "worker": ["127.0.0.1:2"]},
                        "task": {"type": "chief", "index": 0}})


def test_each_source_is_named_with_how_to_train_on_one_machine_instead():
  from_env = source.detect(by_flags=False, environ={})
  assert str(from_env) == "the TF_CONFIG environment variable"
  assert "unset TF_CONFIG" in from_env.alone
  from_flags = source.detect(by_flags=True, environ={"TF_CONFIG": "{}"})
  assert "--worker_hosts" in str(from_flags)
  assert "without --ps_hosts, --worker_hosts" in from_flags.alone
  launched = source.detect(by_flags=False,
                           environ={source.LAUNCHER_VARIABLE: "1"})
  assert "python -m estimator_multigpu.cluster.launch" in str(launched)
  assert "without the launcher" in launched.alone


def test_train_py_names_the_source_in_the_first_line_of_a_cluster_task():
  task = cluster.task_from_tf_config(TF_CONFIG)
  settings = settings_lib.ClusterSettings()
  found = cluster_task.cluster_source(settings, environ={
      "TF_CONFIG": TF_CONFIG})
  line = found.start_line(cluster_task.task_names(task, False)["chief:0"],
                          task.cluster)
  assert line == (
      "This task is chief:0 of a cluster of 2 tasks (chief:0 at "
      "127.0.0.1:1, worker:0 at 127.0.0.1:2), given by the TF_CONFIG "
      "environment variable; not meant as a cluster task? To train on "
      "this machine alone instead (a TF_CONFIG left in the shell by an "
      "earlier job?), unset TF_CONFIG.")
  by_flags = cluster_task.cluster_source(
      settings_lib.ClusterSettings(worker_hosts=("h:1", "h:2"),
                                   job_name="worker"), environ={})
  assert by_flags.kind == source.FLAGS
