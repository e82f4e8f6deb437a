"""The all-reduce job's checks without processes: the settings table, the
tasks' names, the disagreement lines and the heartbeat judgement."""

import dataclasses
import json
import types

import pytest
import tensorflow as tf

import estimator_multigpu as emg
from estimator_multigpu import cluster
from estimator_multigpu.cluster.all_reduce import agreement
from estimator_multigpu.cluster.all_reduce import board_entries
from estimator_multigpu.cluster.all_reduce import heartbeat

import classifier
from cli import cluster_task
from cli import settings as settings_lib
from cli.model_dir import run_config
from cli.model_dir import run_settings

tf1 = tf.compat.v1


def test_one_table_gives_the_resume_rules_and_the_shared_settings():
  assert run_config.MUST_MATCH == ("model_name", "num_classes")
  assert run_config.SCHEDULE_FIELDS == (
      "optimizer", "learning_rate", "learning_rate_decay_type",
      "decay_steps", "decay_rate", "end_learning_rate", "warmup_steps",
      "staircase")
  shared = run_settings.across_tasks(settings_lib.TrainSettings(),
                                     classifier.ClassifierConfig(), 2)
  assert shared["towers per task"] == 2
  assert shared["--learning_rate"] == 0.05 and shared["--batch_size"] == 64
  assert shared["--learning_rate_decay_factor"] == 0.5
  assert "--save_checkpoints_steps" not in shared  # only the chief saves.


@pytest.mark.parametrize("mine,theirs,differs", [
    ({"variable_update": "auto"}, {"variable_update": "replicated"}, None),
    ({"variable_update": "auto"}, {"variable_update": "shared"},
     "--variable_update"),
    ({"dataset_split_name": None}, {"dataset_split_name": "train"}, None),
    ({"dataset_split_name": None}, {"dataset_split_name": "eval"},
     "--dataset_split_name"),
])
def test_settings_compare_as_they_resolve_in_a_job(mine, theirs, differs):
  """auto is replicated in an all-reduce job; no split is train.py's."""
  def shared(**given):
    group = "multi_gpu" if "variable_update" in given else "data"
    settings = settings_lib.TrainSettings()
    settings = dataclasses.replace(settings, **{group: dataclasses.replace(
        getattr(settings, group), **given)})
    setup = types.SimpleNamespace(
        dataset_split_name=given.get("dataset_split_name") or "train")
    return run_settings.across_tasks(settings, classifier.ClassifierConfig(),
                                     2, setup)
  found = agreement.first_difference(shared(**mine), shared(**theirs))
  assert (found or [None])[0] == differs, found


def test_tasks_are_named_as_they_were_started():
  task = cluster.task_from_flags([], ["a:1", "b:1", "c:1"], "worker", 1)
  assert cluster_task.task_names(task, by_flags=True) == {
      "chief:0": "worker --task_index=0 (the chief)",
      "worker:0": "worker --task_index=1", "worker:1": "worker --task_index=2"}
  assert cluster_task.task_names(task, by_flags=False)["worker:0"] == (
      "worker:0")


@pytest.mark.parametrize("theirs,expected", [
    ({"settings": {"--learning_rate": 0.2}},
     "Tasks disagree on --learning_rate (settings): 0.1 on chief:0, 0.2 on "
     "worker:0"),
    ({"identity": {"cluster": {"chief": ["b:1"]}}},
     "The TF_CONFIG cluster lists differ: {'chief': ['a:1']} on chief:0, "
     "{'chief': ['b:1']} on worker:0"),
])
def test_a_disagreement_is_one_line_with_both_values(theirs, expected):
  mine = {"identity": {"cluster": {"chief": ["a:1"]}},
          "settings": {"--learning_rate": 0.1}}
  line = agreement.disagreement(mine, {**mine, **{
      part: {**mine[part], **values} for part, values in theirs.items()}},
                                "chief:0", "worker:0")
  assert line.startswith(expected) and "\n" not in line
  assert agreement.disagreement(mine, dict(mine), "chief:0", "w") is None


def test_board_entries_are_keyed_and_signed_by_the_job_token():
  ours, theirs = board_entries.JobSeal("t1"), board_entries.JobSeal("t2")
  text = ours.seal("hello/worker:0", {"x": 1}, "worker:0", "w at a:1")
  assert "t1" not in text  # the token is never stored.
  assert ours.open(text) == ("hello/worker:0", {"x": 1})
  assert ours.key_name("beat/chief:0") != theirs.key_name("beat/chief:0")
  assert theirs.open(text) == board_entries.Foreign(ours.job, "worker:0",
                                                    "w at a:1")
  forged = json.loads(text)
  forged["entry"] = {"line": "the job ends"}  # changed without the token.
  assert isinstance(ours.open(json.dumps(forged)), board_entries.Foreign)
  assert ours.open(b"not json") is None
  entries, foreign = board_entries.opened_entries(
      ours, [text, theirs.seal("end/chief:0", {}, "chief:0", "c")], "hello/")
  assert entries == {"hello/worker:0": {"x": 1}}
  assert [f.task for f in foreign] == ["chief:0"]


def test_the_launcher_says_the_ports_are_open_and_how_to_close_them():
  from estimator_multigpu.cluster import launch  # pylint: disable=g-import-not-at-top
  line = launch.exposure_line([40001, 40002])
  assert "\n" not in line and "reachable from the network" in line
  assert "0.0.0.0" in line
  assert "--dports 40001,40002 ! -i lo -j DROP" in line


def test_the_graph_description_reads_variables_optimizer_and_towers():
  def model_fn(features, labels, mode):
    pred = tf1.layers.dense(features, 2, name="out")
    loss = tf1.losses.mean_squared_error(labels, pred)
    opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.2, 0.9))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(
        loss, tf1.train.get_or_create_global_step()))
  with tf.Graph().as_default() as graph:
    emg.multi_gpu(model_fn, devices=["/cpu:0", "/cpu:1"])(
        tf.zeros([4, 3]), tf.zeros([4, 2]), "train", {}, tf.estimator.RunConfig(
            session_config=emg.make_session_config(num_cpus=2)))
    described = agreement.graph_description(graph)
  assert described["variable out/kernel"] == [3, 2]
  assert described["towers per task"] == 2
  assert any(u.startswith("ResourceApplyMomentum(lr=0.2, momentum=0.9")
             or u.startswith("ApplyMomentum(lr=0.2, momentum=0.9")
             for u in described["optimizer updates"]), described


class FakeBoard:
  """The board as a dict; `answers=False`: the chief does not answer."""

  def __init__(self):
    self.entries, self.answers = {}, True

  def post(self, name, entry):
    if not self.answers:
      raise tf.errors.DeadlineExceededError(None, None, "silent")
    self.entries[name] = dict(entry)

  def read(self, prefix=None):
    self.post("noop", {})
    return {k: dict(v) for k, v in self.entries.items()
            if prefix is None or k.startswith(prefix)}


@pytest.fixture
def now(monkeypatch):
  """The job watch's clock, moved by hand: now[0] += seconds."""
  clock = [100.0]
  monkeypatch.setattr(heartbeat.time, "monotonic", lambda: clock[0])
  return clock


def make_watch(board, timeout=10.0, me="chief:0"):
  names = {"chief:0": "worker --task_index=0 (the chief)",
           "worker:0": "worker --task_index=1"}
  return heartbeat.JobWatch(board, me, names, heartbeat.Progress(),
                            timeout, on_end=lambda line: None)


def test_a_peer_whose_heartbeat_stops_is_named_after_the_timeout(now):
  board = FakeBoard()
  watch = make_watch(board)
  board.post("beat/worker:0", {"beat": 1, "steps": 0, "phase": "starting",
                               "slowest": 0.0})
  assert watch._check(1) is None
  now[0] += 11  # the worker's counter did not move; building is no alarm.
  assert watch._check(2).startswith(
      "task worker --task_index=1 has made no progress for 11 s")


def test_a_peer_that_never_beats_is_named_after_twice_the_timeout(now):
  """Its address may answer (another job's task listens there): the chief
  does not wait for it forever, and says where its cluster came from."""
  board = FakeBoard()
  watch = heartbeat.JobWatch(
      board, "chief:0", {"chief:0": "chief:0", "worker:0": "worker:0"},
      heartbeat.Progress(), 10.0, on_end=lambda line: None,
      addresses={"worker:0": "127.0.0.1:2"}, hint="Unset TF_CONFIG.")
  assert watch._check(1) is None
  now[0] += 19
  assert watch._check(2) is None  # twice the timeout: a slow start.
  now[0] += 2
  line = watch._check(3)
  assert line.startswith("task worker:0 (127.0.0.1:2) has not joined this "
                         "job: no heartbeat of it in 21 s"), line
  assert line.endswith("this task (chief:0) ends. Unset TF_CONFIG."), line


def test_every_task_in_a_step_with_none_finished_is_a_stuck_step(now):
  board = FakeBoard()
  watch = make_watch(board)
  watch._progress.phase, watch._progress.steps = heartbeat.STEP, 3
  watch._progress.slowest = 0.5
  for beat in range(1, 14):
    board.post("beat/worker:0", {"beat": beat, "steps": 3, "phase": "step",
                                 "slowest": 2.0})
    line = watch._check(beat)
    if line:
      break
    now[0] += 2
  assert line.startswith("no task has finished a step for 22 s (allowance "
                         "20 s): every task is inside step 4"), line
  watch._progress.phase = heartbeat.IDLE  # saving: never stuck.
  assert watch._check(99) is None


def test_a_silent_chief_and_a_peer_that_ended_end_the_task(now):
  board = FakeBoard()
  watch = make_watch(board, me="worker:0")
  board.post("end/chief:0", {"line": "task chief:0 stopped on SIGTERM"})
  assert watch._check(1) == "task chief:0 stopped on SIGTERM"
  board.answers = False
  now[0] += 11
  assert "(the chief) has not answered for 11 s" in watch._check(2)


def test_the_chief_waits_longer_for_its_own_board_and_blames_no_one(now):
  """On the chief a silent board follows a peer's death: the peer probes
  get twice the timeout to name the peer first."""
  board = FakeBoard()
  watch = make_watch(board)
  assert watch._check(1) is None
  board.answers = False
  now[0] += 11
  assert watch._check(2) is None
  now[0] += 10
  line = watch._check(3)
  assert line.startswith("this task's own job board has not answered for "
                         "21 s (a peer stopped or is unreachable)"), line
  assert "(the chief) has not answered" not in line
