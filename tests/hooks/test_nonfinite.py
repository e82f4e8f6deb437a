"""FiniteCheckpointListener: no NaN or Inf reaches a checkpoint, ever."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_multigpu.runtime import guards

tf1 = tf.compat.v1
BAD_STEP = 3  # the update of step 3 makes `w` NaN; the loss stays finite.


def model_fn(features, labels, mode):
  """Weights turn NaN in one update while the loss never does."""
  del labels
  w = tf1.get_variable("w", [2], initializer=tf1.ones_initializer())
  loss = tf.reduce_mean(features) + 0.0 * tf.reduce_sum(
      tf.where(tf.math.is_finite(w), w, tf.zeros_like(w)))
  step = tf1.train.get_global_step()
  poison = tf.cond(tf.equal(step + 1, BAD_STEP),
                   lambda: tf.fill([2], np.nan), lambda: w.read_value())
  with tf.control_dependencies([w.assign(poison)]):
    train_op = step.assign_add(1)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn():
  return tf.data.Dataset.from_tensors((tf.ones([4, 2]), tf.ones([4]))).repeat()


class StopAt(tf1.train.SessionRunHook):
  """Requests a stop (as SIGTERM does) once the step reaches `step`."""

  def __init__(self, step):
    self._step = step

  def begin(self):
    self._global_step = tf1.train.get_global_step()

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self._global_step)

  def after_run(self, run_context, run_values):
    if run_values.results + 1 >= self._step:
      run_context.request_stop()


def train(model_dir, save_steps, hooks_=()):
  estimator = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(
      model_dir=model_dir, save_checkpoints_steps=save_steps,
      log_step_count_steps=None))
  estimator.train(input_fn, max_steps=10, hooks=list(hooks_),
                  saving_listeners=[guards.FiniteCheckpointListener(model_dir)])


def saved_steps(model_dir):
  state = tf.train.get_checkpoint_state(model_dir)
  return [int(path.rsplit("-", 1)[1])
          for path in state.all_model_checkpoint_paths]


def assert_all_finite(model_dir):
  for path in tf.train.get_checkpoint_state(model_dir).all_model_checkpoint_paths:
    reader = tf.train.load_checkpoint(path)
    assert np.all(np.isfinite(reader.get_tensor("w"))), path


@pytest.mark.parametrize("save_steps,stop,last_good", [
    (1, None, BAD_STEP - 1),   # periodic save right after the bad update.
    (1000, BAD_STEP, 0),       # the final save at a stop (SIGTERM, end()).
])
def test_non_finite_variables_are_never_saved(tmp_path, save_steps, stop,
                                              last_good):
  model_dir = str(tmp_path)
  with pytest.raises(guards.NonFiniteLossError) as raised:
    train(model_dir, save_steps, [StopAt(stop)] if stop else [])
  message = str(raised.value)
  assert message.startswith(f"1 variable(s) hold NaN or Inf at step "
                            f"{BAD_STEP} (e.g. w); checkpoint {BAD_STEP} was "
                            "not written.")
  # The checkpoint it names is the newest one, and it is finite.
  assert (f"The newest checkpoint, {model_dir}/model.ckpt-{last_good}, holds "
          "only finite values") in message
  assert saved_steps(model_dir)[-1] == last_good
  assert_all_finite(model_dir)


def test_without_any_checkpoint_the_message_says_so(tmp_path):
  message = guards.last_checkpoint_sentence(str(tmp_path))
  assert message.startswith("No checkpoint was written before it")
