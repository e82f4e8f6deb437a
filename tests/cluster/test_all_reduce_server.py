"""What an all-reduce task's server is given (`cluster.all_reduce.servers.server_config`).

No server starts here: the ConfigProto is checked field by field.
"""

import tensorflow as tf

from estimator_multigpu.cluster.all_reduce import servers
from estimator_multigpu.cross_tower import across_tasks

tf1 = tf.compat.v1


def _cluster(task_type="worker", index=0):
  return across_tasks.AllReduceCluster(
      {"chief": ["localhost:1"], "worker": ["localhost:2"]}, task_type, index)


def test_server_config_keeps_devices_and_names_the_leader():
  base = tf1.ConfigProto(device_count={"CPU": 2})
  base.device_filters.append("/job:worker/task:0")
  config = servers.server_config(_cluster(), base)
  assert config.device_count["CPU"] == 2
  assert list(config.device_filters) == []  # every task reaches the others.
  assert (config.experimental.collective_group_leader ==
          "/job:chief/replica:0/task:0")
  assert list(base.device_filters) == ["/job:worker/task:0"]  # not mutated.


def test_tensors_between_tasks_go_in_64_kib_pieces_unless_the_user_says():
  # TensorFlow's 0 means 4 KiB pieces; the job's servers use 64 KiB.
  assert servers.server_config(_cluster(), None).experimental. \
      recv_buf_max_chunk == 65536
  own = tf1.ConfigProto()
  own.experimental.recv_buf_max_chunk = -1  # one piece: the user's choice.
  assert servers.server_config(
      _cluster("chief"), own).experimental.recv_buf_max_chunk == -1
