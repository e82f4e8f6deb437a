"""estimator_multigpu.runtime.checkpoints: real checkpoints, really damaged."""

import os

import numpy as np
import pytest
import tensorflow as tf

from estimator_multigpu.runtime import checkpoints

tf1 = tf.compat.v1


def write_checkpoints(model_dir, steps, values=None):
  """Saves `model.ckpt-<step>` for each step (2 shards, like 2 devices).

  Variable `w` holds `values[step]` (default: the step, everywhere).
  """
  values = values or {}
  with tf.Graph().as_default():
    with tf.device("/cpu:0"):
      w = tf1.get_variable("w", [64], initializer=tf1.zeros_initializer())
    with tf.device("/cpu:1"):
      step_var = tf1.train.get_or_create_global_step()
    value = tf1.placeholder(tf.float32, [64])
    assign = w.assign(value)
    saver = tf1.train.Saver(sharded=True, save_relative_paths=True)
    config = tf1.ConfigProto(device_count={"CPU": 2})
    with tf1.Session(config=config) as session:
      session.run(tf1.global_variables_initializer())
      for step in steps:
        session.run([assign, step_var.assign(step)],
                    {value: np.full([64], values.get(step, step), np.float32)})
        saver.save(session, os.path.join(model_dir, "model.ckpt"),
                   global_step=step)


def names(model_dir):
  return sorted(os.listdir(model_dir))


def state(model_dir):
  got = tf.train.get_checkpoint_state(model_dir)
  return (os.path.basename(got.model_checkpoint_path),
          [os.path.basename(p) for p in got.all_model_checkpoint_paths])


def w_file(model_dir, step):
  """The data shard that holds `w` (the larger one)."""
  shards = [f for f in names(model_dir)
            if f.startswith(f"model.ckpt-{step}.data-")]
  return max((os.path.join(model_dir, f) for f in shards),
             key=os.path.getsize)


def test_an_intact_dir_is_left_as_it_is(tmp_path):
  write_checkpoints(str(tmp_path), [0, 5, 10])
  before = names(tmp_path)
  assert checkpoints.prepare_model_dir(str(tmp_path)).endswith("ckpt-10")
  assert names(tmp_path) == before


def test_an_empty_or_absent_dir_is_a_fresh_start(tmp_path):
  assert checkpoints.prepare_model_dir(str(tmp_path / "absent")) is None
  assert checkpoints.prepare_model_dir(str(tmp_path)) is None


@pytest.mark.parametrize("damage", ["delete", "garble", "empty"])
def test_a_lost_state_file_is_rebuilt_from_the_checkpoints(tmp_path, damage):
  write_checkpoints(str(tmp_path), [0, 5, 10])
  path = tmp_path / "checkpoint"
  if damage == "delete":
    path.unlink()
  else:
    path.write_text("garbage {{{" if damage == "garble" else "")
  assert checkpoints.prepare_model_dir(str(tmp_path)).endswith("ckpt-10")
  assert state(str(tmp_path)) == ("model.ckpt-10", ["model.ckpt-0",
                                                    "model.ckpt-5",
                                                    "model.ckpt-10"])


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_data",
                                    "delete_index", "flip_index"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(
    tmp_path, damage, caplog):
  model_dir = str(tmp_path)
  write_checkpoints(model_dir, [0, 5, 10])
  data, index = w_file(model_dir, 10), f"{model_dir}/model.ckpt-10.index"
  if damage == "truncate":
    os.truncate(data, os.path.getsize(data) // 2)
  elif damage.startswith("flip"):
    path = index if damage == "flip_index" else data
    with open(path, "r+b") as f:
      f.seek(os.path.getsize(path) // 3)
      byte = f.read(1)
      f.seek(-1, os.SEEK_CUR)
      f.write(bytes([byte[0] ^ 0xFF]))
  else:
    os.remove(data if damage == "delete_data" else index)
  with caplog.at_level("WARNING"):
    chosen = checkpoints.prepare_model_dir(model_dir)
  assert chosen == f"{model_dir}/model.ckpt-5"
  assert state(model_dir) == ("model.ckpt-5", ["model.ckpt-0",
                                               "model.ckpt-5"])
  assert not any(name.startswith("model.ckpt-10") for name in
                 names(model_dir))
  # The WARNING names the damaged checkpoint and the one chosen instead.
  warning = " ".join(r.getMessage() for r in caplog.records
                     if r.levelname == "WARNING")
  assert "model.ckpt-10 cannot be restored" in warning
  assert f"{model_dir}/model.ckpt-5, instead" in warning
  assert os.listdir(tmp_path / "corrupt")  # kept for inspection.
  assert tf.train.load_checkpoint(chosen).get_tensor("global_step") == 5


def test_a_non_finite_newest_checkpoint_falls_back(tmp_path):
  write_checkpoints(str(tmp_path), [0, 5, 10], values={10: np.nan})
  chosen = checkpoints.prepare_model_dir(str(tmp_path))
  assert chosen.endswith("model.ckpt-5")
  reason = checkpoints.unusable_reason(checkpoints.find_checkpoints(
      str(tmp_path / "corrupt"))[0])
  assert reason == "NaN/Inf in 1 variable(s), e.g. w"


def test_nothing_usable_is_an_error_not_a_fresh_start(tmp_path):
  write_checkpoints(str(tmp_path), [0], values={0: np.inf})
  with pytest.raises(checkpoints.UnusableCheckpointsError,
                     match=r"None of the 1 checkpoint\(s\) .* model.ckpt-0: "
                     r"NaN/Inf .* move them away"):
    checkpoints.prepare_model_dir(str(tmp_path))
  assert "model.ckpt-0.index" in names(tmp_path)  # nothing moved or lost.


def test_a_state_file_whose_checkpoints_are_gone_is_an_error(tmp_path):
  write_checkpoints(str(tmp_path), [0])
  for name in names(tmp_path):
    if name.startswith("model.ckpt"):
      os.remove(tmp_path / name)
  with pytest.raises(checkpoints.UnusableCheckpointsError,
                     match="names model.ckpt-0, but no checkpoint files"):
    checkpoints.prepare_model_dir(str(tmp_path))


def test_leftovers_of_interrupted_saves_are_removed(tmp_path):
  model_dir = str(tmp_path)
  write_checkpoints(model_dir, [0, 5])
  os.makedirs(f"{model_dir}/model.ckpt-6_temp/part")
  for name in ("model.ckpt-6_temp/part/x", "checkpoint.tmp1a2b",
               "model.ckpt-7.data-00000-of-00002"):  # no .index: orphan.
    open(f"{model_dir}/{name}", "w").close()
  before = names(model_dir)
  assert checkpoints.prepare_model_dir(model_dir).endswith("ckpt-5")
  assert sorted(set(before) - set(names(model_dir))) == [
      "checkpoint.tmp1a2b", "model.ckpt-6_temp",
      "model.ckpt-7.data-00000-of-00002"]
  assert state(model_dir) == ("model.ckpt-5", ["model.ckpt-0",
                                               "model.ckpt-5"])
