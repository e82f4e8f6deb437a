"""check_towers says true things (#52 row 4).

- Exact runs pass: a canned head's `average_loss` summary (a SUM loss over
  the sum of the weights, a count TensorFlow folds into a constant for a
  static shard) is one device's, so the check says OK; a mode the one
  device cannot run on the training inputs (a ranker whose PREDICT graph
  scores single examples) is not compared, and the report says so.
- A real difference leads with the largest variable difference, however
  large a summary's is: `worst` then holds the variables (largest first),
  `readouts` what the user reads, and the message says both.
- Lookup tables in the Scaffold's `local_init_op`, and a warm start by
  `Saver.restore` in a Scaffold `init_fn` under replicated variables, run.
- The cause named is the real one: with `accumulate_steps` each micro-batch
  is normalized by batch norm with its own statistics, which no option of
  the towers changes (the towers equal one device accumulating).
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
_RNG = np.random.RandomState(2052)
X = _RNG.randn(7, 3).astype(np.float32)
Y = _RNG.randn(7, 1).astype(np.float32)
W0 = np.array([[0.5], [-1.0], [0.25]], np.float32)
TOWERS = [2, 3]


def _input_fn():
  return tf.data.Dataset.from_tensors((X, Y)).repeat()


def _train_op(loss):
  return emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(
      0.05)).minimize(loss, tf1.train.get_global_step())


def canned_head_fn(features, labels, mode):
  """A v1 canned head's losses: SUM of the weighted losses, and its
  `average_loss` summary over the sum of the weights."""
  w = tf1.get_variable("w", initializer=W0)
  unreduced = tf.square(tf.matmul(features, w) - labels)
  weights = tf.ones_like(labels)  # static shard: a constant 4, 3, ...
  loss = tf1.losses.compute_weighted_loss(
      unreduced, weights, reduction=tf1.losses.Reduction.SUM)
  tf1.summary.scalar("average_loss", loss / tf.reduce_sum(
      weights * tf.ones_like(unreduced)))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=_train_op(loss))


def _first_summaries(model_fn, num_towers, session_config):
  """{tag: value} of the scalar summaries of the first training step."""
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    fn = emg.multi_gpu(model_fn, devices=harness.cpu_devices(num_towers))
    spec = harness.call(fn, tf.constant(X), tf.constant(Y),
                        tf.estimator.ModeKeys.TRAIN, session_config)
    summaries = tf1.summary.merge_all()
    with tf1.Session(config=session_config) as session:
      session.run(tf1.global_variables_initializer())
      serialized, _ = session.run([summaries, spec.train_op])
  return {v.tag: v.simple_value
          for v in tf1.Summary.FromString(serialized).value}


@pytest.mark.parametrize("num_towers", TOWERS)
def test_a_canned_heads_average_loss_is_one_devices(num_towers,
                                                    session_config):
  loss = np.sum((X @ W0 - Y) ** 2)
  got = _first_summaries(canned_head_fn, num_towers, session_config)
  np.testing.assert_allclose(got["average_loss"], loss / 7, rtol=1e-5)
  report = emg.check_towers(canned_head_fn, _input_fn,
                            harness.cpu_devices(num_towers), modes=())
  assert report.ok, str(report)


def pointwise_predict_fn(features, labels, mode):
  """A ranker's shape: lists of 7 examples in TRAIN, single examples
  (a reshape to [-1, 2] of what it is given) in PREDICT."""
  w = tf1.get_variable("w", initializer=W0)
  scores = tf.matmul(features, w)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions=tf.reshape(
        tf.concat([scores, scores], 1), [-1, 5]))
  loss = tf.reduce_mean(tf.square(scores - labels))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=_train_op(loss))


def _dynamic_input_fn():
  """Batches of 7 whose size the graph does not know."""
  return tf.data.Dataset.from_tensor_slices((X, Y)).batch(7).repeat()


def test_a_mode_one_device_cannot_run_is_not_compared():
  report = emg.check_towers(pointwise_predict_fn, _dynamic_input_fn,
                            harness.cpu_devices(2))
  assert report.ok, str(report)
  assert "predict not compared" in str(report)
  assert "InvalidArgumentError" in str(report)


def clipped_per_tower_fn(features, labels, mode):
  """A clip by norm in the model_fn (each tower clips its own gradient:
  not one device's), and a summary of the gradient's norm that differs
  more than any variable."""
  w = tf1.get_variable("w", initializer=W0)
  loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
  opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.05))
  (grad, var), = opt.compute_gradients(loss, [w])
  tf1.summary.scalar("gradient_norm", tf.norm(grad) * 100.0)
  train_op = opt.apply_gradients([(tf.clip_by_norm(grad, 0.01), var)],
                                 tf1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_the_verdict_leads_with_the_largest_variable_difference():
  report = emg.check_towers(clipped_per_tower_fn, _input_fn,
                            harness.cpu_devices(2), modes=())
  assert not report.ok
  assert [name for name, _ in report.worst] == ["w", "global_step"]
  assert report.worst[0][1] > 1e-4
  summary = dict(report.readouts)["summary/gradient_norm"]
  assert summary > report.worst[0][1]
  text = str(report)
  assert text.split("largest differences: ")[1].startswith("w ")
  assert "What the user reads differs too: summary/gradient_norm" in text


def tables_fn(features, labels, mode):
  """Words looked up in a table the Scaffold's local_init_op fills."""
  table = tf1.lookup.StaticHashTable(tf1.lookup.KeyValueTensorInitializer(
      tf.constant([0, 1, 2], tf.int64), tf.constant([1.0, 2.0, 3.0])), 0.0)
  ids = tf.cast(tf.round(tf.abs(features[:, :1])), tf.int64)
  w = tf1.get_variable("w", initializer=W0)
  pred = tf.matmul(features, w) * table.lookup(ids)
  scaffold = tf1.train.Scaffold(local_init_op=tf.group(
      tf1.local_variables_initializer(), tf1.tables_initializer()))
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions=pred,
                                      scaffold=scaffold)
  loss = tf.reduce_mean(tf.square(pred - labels))
  metrics = {"mse": tf1.metrics.mean_squared_error(labels, pred)}
  scaffold = tf1.train.Scaffold(local_init_op=tf.group(
      tf1.local_variables_initializer(), tf1.tables_initializer()))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=_train_op(loss), predictions=pred,
      eval_metric_ops=metrics, scaffold=scaffold)


def test_lookup_tables_in_local_init_op_in_every_mode():
  report = emg.check_towers(tables_fn, _input_fn, harness.cpu_devices(2))
  assert report.ok, str(report)
  assert {"eval/mse", "predict/predictions"} <= set(dict(report.worst))


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("backbone") / "model.ckpt")
  with tf.Graph().as_default():
    w = tf1.get_variable("w", initializer=np.full([3, 1], 0.75, np.float32))
    with tf1.Session() as session:
      session.run(w.initializer)
      tf1.train.Saver([w]).save(session, path)
  return path


def init_fn_restore_fn(features, labels, mode, params):
  """Object Detection's fine-tune checkpoint: Saver.restore in init_fn."""
  w = tf1.get_variable("w", initializer=W0)
  saver = tf1.train.Saver([w])
  scaffold = tf1.train.Scaffold(init_fn=lambda _, session: saver.restore(
      session, params["backbone"]))
  loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=_train_op(loss),
                                    scaffold=scaffold)


@pytest.mark.parametrize("variable_update", ["shared", "replicated"])
def test_a_warm_start_by_init_fn_restore(backbone, variable_update):
  report = emg.check_towers(init_fn_restore_fn, _input_fn,
                            harness.cpu_devices(3), params={
                                "backbone": backbone}, modes=(),
                            variable_update=variable_update)
  assert report.ok, str(report)
  w = np.full([3, 1], 0.75, np.float32)
  np.testing.assert_allclose(report.loss_towers,
                             np.mean((X @ w - Y) ** 2), rtol=1e-5)


def batch_norm_fn(features, labels, mode):
  h = tf1.layers.dense(features, 4, name="h", kernel_initializer=(
      tf1.glorot_uniform_initializer(seed=1)))
  h = tf1.layers.batch_normalization(h, training=mode == "train", name="bn")
  loss = tf1.losses.mean_squared_error(labels, tf1.layers.dense(
      h, 1, name="out", kernel_initializer=tf1.glorot_uniform_initializer(
          seed=2)))
  with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      train_op=_train_op(loss))


def _batches_of_5():
  return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(5)


def test_sync_batch_norm_with_accumulate_steps_names_the_micro_batches():
  report = emg.check_towers(batch_norm_fn, _batches_of_5,
                            harness.cpu_devices(2), steps=2, modes=(),
                            sync_batch_norm=True, accumulate_steps=2)
  assert not report.ok
  causes = " ".join(cause for cause, _ in report.causes)
  assert "micro-batch" in causes and "own statistics" in causes, causes
  assert "divides by a count" not in causes


def test_batch_norm_per_tower_with_accumulate_steps_names_sync():
  report = emg.check_towers(batch_norm_fn, _batches_of_5,
                            harness.cpu_devices(2), steps=2, modes=(),
                            accumulate_steps=2)
  assert not report.ok
  fixes = " ".join(fix for _, fix in report.causes)
  assert "sync_batch_norm=True" in fixes, report.causes
