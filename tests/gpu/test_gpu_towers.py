"""On real GPUs: the default all-reduce among the GPUs trains exactly.

Runs only where TensorFlow sees two or more GPUs (skipped otherwise, with
the reason); `tests/core/test_gpu_graph.py` checks the same graph's
structure on any machine. Two and three towers (an uneven 7-row batch),
the default (`variable_update="auto"`: a copy per GPU, one packed NCCL
all-reduce) against one device, and the host on request.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

tf1 = tf.compat.v1
GPUS = len(tf.config.list_physical_devices("GPU"))
pytestmark = pytest.mark.skipif(
    GPUS < 2, reason=f"needs 2 or more GPUs; TensorFlow sees {GPUS} "
    "(CUDA_VISIBLE_DEVICES, a CUDA build of TensorFlow)")
X, Y = harness.linear_data(7)


def model_fn(features, labels, mode):
  h = tf1.layers.dense(features, 5, tf.nn.tanh, name="hidden",
                       kernel_initializer=tf1.glorot_uniform_initializer(1))
  pred = tf1.layers.dense(h, 2, name="out",
                          kernel_initializer=tf1.glorot_uniform_initializer(2))
  loss = tf.reduce_mean(tf.square(pred - labels))
  opt = emg.TowerOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9))
  return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=opt.minimize(loss,
                                             tf1.train.get_global_step()))


def train(devices, **options):
  config = emg.make_session_config(num_cpus=1)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    fn = emg.multi_gpu(model_fn, devices=devices, **options) if len(
        devices) > 1 else model_fn
    spec = fn(tf.constant(X), tf.constant(Y), "train", {},
              tf.estimator.RunConfig(session_config=config))
    with tf1.Session(config=config) as session:
      session.run(tf1.global_variables_initializer())
      session.run(tf1.local_variables_initializer())
      for _ in range(3):
        session.run(spec.train_op)
      variables = tf1.global_variables()
      return dict(zip([v.op.name for v in variables],
                      session.run(variables)))


@pytest.mark.parametrize("num_towers", [2, 3])
@pytest.mark.parametrize("options", [{}, {"variable_update": "shared"},
                                     {"gradient_packing_bytes": 0}])
def test_gpu_towers_train_like_one_gpu(num_towers, options):
  if num_towers > GPUS:
    pytest.skip(f"needs {num_towers} GPUs; TensorFlow sees {GPUS}")
  one = train(["/gpu:0"])
  many = train([f"/gpu:{i}" for i in range(num_towers)], **options)
  assert sorted(many) == sorted(one)
  for name, value in one.items():
    np.testing.assert_allclose(many[name], value, rtol=1e-4, atol=1e-5,
                               err_msg=name)
