"""Tests for the checkpoint loop (`estimator_multigpu.runtime.evaluation`)."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_multigpu.runtime import evaluation

tf1 = tf.compat.v1


def write_checkpoints(model_dir, steps):
  """Saves a global step variable at each of `steps` into `model_dir`."""
  with tf.Graph().as_default():
    step = tf1.train.get_or_create_global_step()
    saver = tf1.train.Saver()
    with tf1.Session() as session:
      for value in steps:
        session.run(step.assign(value))
        saver.save(session, str(model_dir / "model.ckpt"), global_step=value)


def fake_evaluate(evaluated):
  """An evaluate_fn that records the path and reads its global step."""

  def evaluate(checkpoint):
    evaluated.append(checkpoint)
    return {"global_step": int(checkpoint.rsplit("-", 1)[1]), "loss": 0.5}

  return evaluate


def test_once_evaluates_the_latest_checkpoint_only(tmp_path):
  write_checkpoints(tmp_path, [10, 20])
  evaluated = []
  metrics = evaluation.evaluate_checkpoints(
      fake_evaluate(evaluated), str(tmp_path), max_steps=100,
      timeout_secs=0, once=True)
  assert metrics["global_step"] == 20
  assert [path.rsplit("/", 1)[1] for path in evaluated] == ["model.ckpt-20"]


def test_once_without_a_checkpoint_says_to_train_first(tmp_path):
  with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
    evaluation.evaluate_checkpoints(fake_evaluate([]), str(tmp_path), None,
                                    timeout_secs=0, once=True)


def test_stops_at_max_steps(tmp_path):
  write_checkpoints(tmp_path, [30])
  metrics = evaluation.evaluate_checkpoints(
      fake_evaluate([]), str(tmp_path), max_steps=30, timeout_secs=0)
  assert metrics["global_step"] == 30


@pytest.mark.parametrize("require_max_steps", [True, False])
def test_timeout_before_max_steps(tmp_path, require_max_steps):
  write_checkpoints(tmp_path, [10])
  evaluate = fake_evaluate([])
  if require_max_steps:  # a cluster evaluator: the chief stopped early.
    with pytest.raises(TimeoutError, match=r"last evaluated: step 10; "
                       "waiting for step 30"):
      evaluation.evaluate_checkpoints(evaluate, str(tmp_path), 30, 0)
  else:  # eval.py: the wait ends the loop.
    metrics = evaluation.evaluate_checkpoints(evaluate, str(tmp_path), 30, 0,
                                              require_max_steps=False)
    assert metrics["global_step"] == 10


@pytest.mark.parametrize("require_max_steps", [True, False])
def test_no_checkpoint_at_all_is_a_timeout(tmp_path, require_max_steps):
  with pytest.raises(TimeoutError, match="last evaluated: none"):
    evaluation.evaluate_checkpoints(fake_evaluate([]), str(tmp_path), 30, 0,
                                    require_max_steps=require_max_steps)


def test_format_metrics():
  line = evaluation.format_metrics({"loss": np.float32(0.10254),
                                    "global_step": np.int64(1500),
                                    "accuracy": 0.96944})
  assert line == "accuracy=0.9694 global_step=1500 loss=0.1025"


def test_a_save_newer_than_the_state_file_is_not_read_yet(tmp_path):
  # A save writes the state file last: step 20's files without it naming
  # step 20 are a save still being written.
  write_checkpoints(tmp_path, [10, 20])
  tf1.train.update_checkpoint_state(str(tmp_path), "model.ckpt-10")
  evaluated = []
  evaluation.evaluate_checkpoints(fake_evaluate(evaluated), str(tmp_path),
                                  None, timeout_secs=0, once=True)
  assert [path.rsplit("/", 1)[1] for path in evaluated] == ["model.ckpt-10"]


def test_a_checkpoint_removed_while_evaluated_gives_way_to_the_newest(
    tmp_path):
  write_checkpoints(tmp_path, [10, 20, 30])
  tf1.train.update_checkpoint_state(str(tmp_path), "model.ckpt-20")
  evaluated = []
  evaluate = fake_evaluate(evaluated)

  def rotated(checkpoint):
    if checkpoint.endswith("-20"):  # the training saves 30, removes 20.
      tf1.train.update_checkpoint_state(str(tmp_path), "model.ckpt-30")
      for suffix in (".index", ".meta", ".data-00000-of-00001"):
        (tmp_path / f"model.ckpt-20{suffix}").unlink()
      tf.train.list_variables(checkpoint)  # NotFoundError, as a restore.
    return evaluate(checkpoint)

  metrics = evaluation.evaluate_checkpoints(rotated, str(tmp_path), 30,
                                            timeout_secs=0)
  assert metrics["global_step"] == 30
  assert [path.rsplit("/", 1)[1] for path in evaluated] == ["model.ckpt-30"]
  # A checkpoint that is still there: its error stands.
  def fails(checkpoint):
    raise tf.errors.NotFoundError(None, None, f"boom at {checkpoint}")

  with pytest.raises(tf.errors.NotFoundError, match="boom at .*ckpt-30"):
    evaluation.evaluate_present(fails, str(tmp_path / "model.ckpt-30"),
                                evaluation.CheckpointWatch(str(tmp_path), 0))
