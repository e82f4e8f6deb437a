"""The board's session to the chief outlives a stray task's first call.

In one process, three servers: a job's chief and worker, and a stray of
the same task name in another cluster. TensorFlow's session manager keys
the sessions a server holds for others by the name of the master task
that made them: a master of the same name with another incarnation (the
stray) makes it drop them all ("found old WorkerSessions created by the
same master task"). A plain session of the job breaks then (checked here
first: the cause); the board's renews its own and the call succeeds.
"""

import pytest
import tensorflow as tf

from estimator_multigpu.cluster import launch
from estimator_multigpu.cluster.all_reduce import board as board_lib

tf1 = tf.compat.v1
CHIEF, WORKER = "/job:chief/replica:0/task:0", "/job:worker/replica:0/task:0"


def server(cluster, job):
  return tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job,
                              task_index=0, start=True)


@pytest.fixture(scope="module", name="job")
def fixture_job():
  """{"chief": server, "worker": server, "addresses": [chief, worker]}."""
  chief, worker = [f"127.0.0.1:{port}" for port in launch.free_ports(2)]
  cluster = {"chief": [chief], "worker": [worker]}
  return {"chief": server(cluster, "chief"),
          "worker": server(cluster, "worker"), "addresses": [chief, worker]}


def plain_session(target, own, chief):
  """A session like the board's before: made once, never renewed."""
  graph = tf.Graph()
  with graph.as_default(), tf.device(chief):
    fetch = tf.constant(1)
  session = tf1.Session(target, graph=graph, config=tf1.ConfigProto(
      device_filters=sorted({own, chief})))
  session.run(fetch)
  return session, fetch


def stray_call(cluster, job, filters):
  """A stray's first call: a session on its own server reaching ours (it
  may fail: our server does not answer to the name the stray gives it)."""
  stray = server(cluster, job)
  graph = tf.Graph()
  with graph.as_default(), tf.device(filters[0]):
    fetch = tf.constant(2)
  with tf1.Session(stray.target, graph=graph,
                   config=tf1.ConfigProto(device_filters=filters)) as s:
    try:
      s.run(fetch)
    except tf.errors.InvalidArgumentError:
      pass


def test_a_stray_worker_breaks_a_plain_session_not_the_workers_board(job):
  chief, worker = job["addresses"]
  boards = {name: board_lib.Board(job[name].target, device, CHIEF,
                                  token="a", me=f"{name}:0")
            for name, device in (("chief", CHIEF), ("worker", WORKER))}
  boards["worker"].post("beat/worker:0", {"beat": 1})
  plain, fetch = plain_session(job["worker"].target, WORKER, CHIEF)
  # A worker:0 of another cluster whose chief is this job's chief.
  stray_call({"chief": [chief], "worker": [
      f"127.0.0.1:{launch.free_ports(1)[0]}"]}, "worker", [CHIEF, WORKER])
  with pytest.raises(tf.errors.OpError, match="Session handle is not found"):
    plain.run(fetch)
  boards["worker"].post("beat/worker:0", {"beat": 2})
  assert boards["worker"].get("beat/worker:0") == {"beat": 2}
  assert boards["chief"].read("beat/") == {"beat/worker:0": {"beat": 2}}


def test_a_board_run_by_the_chiefs_master_is_out_of_a_strays_reach(job):
  """The guard's workers reach the board at the chief's own address: the
  chief's master makes the sessions there, which no stray worker's
  master can make the chief's server drop; the session is never renewed."""
  chief, _ = job["addresses"]
  board = board_lib.Board(f"grpc://{chief}", WORKER, CHIEF, token="a",
                          me="worker:0")
  board.post("beat/worker:0", {"beat": 3})
  session = board._session._session
  stray_call({"chief": [chief], "worker": [
      f"127.0.0.1:{launch.free_ports(1)[0]}"]}, "worker", [CHIEF, WORKER])
  board.post("beat/worker:0", {"beat": 4})
  assert board.get("beat/worker:0") == {"beat": 4}
  assert board._session._session is session


def test_a_stray_chief_breaks_a_plain_session_not_the_chiefs_board(job):
  chief, _ = job["addresses"]
  board = board_lib.Board(job["chief"].target, CHIEF, CHIEF, token="a",
                          me="chief:0")
  board.post("beat/chief:0", {"beat": 1})
  plain, fetch = plain_session(job["chief"].target, CHIEF, CHIEF)
  # A chief of another cluster that lists this job's chief as its worker.
  stray_call({"chief": [f"127.0.0.1:{launch.free_ports(1)[0]}"],
              "worker": [chief]}, "chief", [WORKER])
  with pytest.raises(tf.errors.OpError, match="Session handle is not found"):
    plain.run(fetch)
  board.post("beat/chief:0", {"beat": 2})
  assert board.get("beat/chief:0") == {"beat": 2}
