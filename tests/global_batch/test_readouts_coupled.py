"""Couplings of the batch in EVAL and PREDICT written with raw ops: metrics
of tf.py_func values and of batch statistics, listwise and coupled
predictions; one device's on 2 and 3 towers, a batch smaller than the
towers included (contract 24)."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

from tests import harness
from tests.global_batch import cases

tf1 = tf.compat.v1
EVAL, PREDICT = tf.estimator.ModeKeys.EVAL, tf.estimator.ModeKeys.PREDICT


def _scores(features):
  return tf.reduce_sum(cases.encoder(features["v1"]), 1)


def _eval_py_func(features, labels):
  scores = _scores(features)
  per = tf1.py_func(lambda s, l: (s - l).astype(np.float32),
                    [scores, tf.cast(labels, tf.float32)], tf.float32,
                    stateful=False)
  return {"per_example": tf1.metrics.mean(per)}


def _eval_numpy_function(features, labels):
  scores = _scores(features)
  per = tf.numpy_function(lambda s: np.abs(s).astype(np.float32), [scores],
                          tf.float32)
  per.set_shape([None])
  del labels
  return {"per_example": tf1.metrics.mean(per)}


def _eval_corpus(features, labels):
  """One statistic of the whole batch from tf.py_func (a corpus BLEU)."""
  scores = _scores(features)
  corpus = tf1.py_func(
      lambda s, l: np.float32(np.std(s) + np.mean(l)),
      [scores, tf.cast(labels, tf.float32)], tf.float32, stateful=False)
  return {"corpus": tf1.metrics.mean(corpus, tf.constant(1.0))}


def _eval_corpus_stateful(features, labels):
  scores = _scores(features)
  corpus = tf.numpy_function(lambda s: np.float32(np.max(s) - np.min(s)),
                             [scores], tf.float32)
  del labels
  return {"corpus": tf1.metrics.mean(corpus, tf.constant(1.0))}


def _eval_global_values(features, labels):
  """Values the rewrite keeps global (the batch's distinct labels), weighted
  by a tensor shaped like them and counted: the global batch's, not each
  tower's copy of it joined."""
  distinct = tf.cast(tf.unique(labels)[0], tf.float32) + 0.0 * tf.reduce_sum(
      _scores(features))
  return {"distinct": tf1.metrics.mean(distinct, tf.fill(tf.shape(distinct),
                                                         1.0)),
          "count": tf1.metrics.mean(tf.size(distinct))}


EVALS = {"py_func": _eval_py_func, "numpy_function": _eval_numpy_function,
         "corpus_py_func": _eval_corpus,
         "corpus_numpy_function": _eval_corpus_stateful,
         "global_values": _eval_global_values}


def _predict_softmax(features):
  return {"p": tf.nn.softmax(_scores(features), axis=0)}


def _predict_softmax_by_hand(features):
  e = tf.exp(_scores(features))
  return {"p": e / tf.reduce_sum(e)}


def _predict_einsum(features):
  z = cases.encoder(features["v1"])
  return {"nearest": tf.reduce_max(tf.einsum("ik,jk->ij", z, z), 1)}


def _predict_reverse_roll(features):
  s = _scores(features)
  return {"mirror": tf.reverse(s, [0]) - tf.roll(s, 1, 0)}


def _predict_argmax_top_k(features):
  z = cases.encoder(features["v1"])
  top = tf.nn.top_k(tf.transpose(z), k=1)[0]  # over the batch
  return {"best": tf.cast(tf.argmax(z, axis=0)[0], tf.float32) +
                  tf.reduce_sum(top) + 0.0 * z[:, 0]}


def _predict_range(features):
  z = cases.encoder(features["v1"])
  count = tf.cast(tf.reduce_max(tf.abs(z)) * 0 + 3, tf.int32)
  return {"ranked": tf.cast(tf.reduce_sum(tf.range(count)), tf.float32) +
                    z[:, 0]}


PREDICTS = {"softmax_axis0": _predict_softmax,
            "softmax_by_hand": _predict_softmax_by_hand,
            "einsum_ik_jk": _predict_einsum,
            "reverse_roll": _predict_reverse_roll,
            "argmax_top_k": _predict_argmax_top_k,
            "range_of_max": _predict_range}


def _model_fn(metrics_of=None, predictions_of=None):
  def model_fn(features, labels, mode):
    if mode == PREDICT:
      return tf.estimator.EstimatorSpec(mode,
                                        predictions=predictions_of(features))
    loss = tf.reduce_mean(tf.square(_scores(features)))
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, eval_metric_ops=metrics_of(features, labels))
  return model_fn


def _run(model_fn, mode, batch, session_config, towers=None):
  features, labels = cases.data(batch)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    fn = model_fn if towers is None else emg.multi_gpu(
        model_fn, devices=harness.cpu_devices(towers), global_batch=True)
    spec = harness.call(fn, tf.nest.map_structure(tf.constant, features),
                        None if mode == PREDICT else tf.constant(labels),
                        mode, session_config)
    with tf1.Session(config=session_config) as session:
      session.run([tf1.global_variables_initializer(),
                   tf1.local_variables_initializer()])
      if mode == PREDICT:
        return session.run(spec.predictions)
      session.run({k: op for k, (_, op) in spec.eval_metric_ops.items()})
      return session.run({k: v for k, (v, _) in spec.eval_metric_ops.items()})


@pytest.mark.parametrize("name", sorted(EVALS))
@pytest.mark.parametrize("towers,batch", [(2, 7), (3, 7), (3, 2)])
def test_eval_metrics_one_device(name, towers, batch, session_config):
  model_fn = _model_fn(metrics_of=EVALS[name])
  _assert_one_device(model_fn, EVAL, batch, session_config, towers)


@pytest.mark.parametrize("name", sorted(PREDICTS))
@pytest.mark.parametrize("towers,batch", [(2, 7), (3, 7), (3, 2)])
def test_predictions_one_device(name, towers, batch, session_config):
  model_fn = _model_fn(predictions_of=PREDICTS[name])
  _assert_one_device(model_fn, PREDICT, batch, session_config, towers)


def _assert_one_device(model_fn, mode, batch, session_config, towers):
  """Every metric or prediction of `towers` is one device's (1e-5)."""
  want = _run(model_fn, mode, batch, session_config)
  got = _run(model_fn, mode, batch, session_config, towers)
  for key in want:
    assert np.shape(got[key]) == np.shape(want[key]), key
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6,
                               err_msg=key)
