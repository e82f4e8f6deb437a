"""TF-GAN's own `GANEstimator` model_fn on 2 and 3 towers (issue #30).

tensorflow-gan 2.1.0 runs the generator's and the discriminator's train ops
from hooks (`get_sequential_train_hooks`: one hook each; `get_joint_train_hooks`:
one hook running both) and makes its train_op `global_step.assign_add(1)`.
Wrapped by `multi_gpu`, every variable (Adam's `beta1_power`, `global_step`
included) must match the unwrapped GANEstimator over an uneven batch of 7.
Install: pip install --no-deps tensorflow-gan==2.1.0
tensorflow-probability==0.23.0 tensorflow-hub==0.16.1 dm-tree decorator
cloudpickle. Skipped when tensorflow_gan is missing.
"""

import collections
import inspect

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

import harness

if not hasattr(inspect, "getargspec"):  # gone in Python 3.11; TF-GAN uses it.
  ArgSpec = collections.namedtuple("ArgSpec",
                                   "args varargs keywords defaults")
  inspect.getargspec = lambda fn: ArgSpec(*inspect.getfullargspec(fn)[:4])
tfgan = pytest.importorskip("tensorflow_gan")

tf1 = tf.compat.v1
BATCH = 7
STEPS = 3
REAL = np.random.RandomState(3).randn(BATCH, 2).astype(np.float32)
NOISE = np.random.RandomState(4).randn(BATCH, 3).astype(np.float32)


def generator_fn(noise):
  w = tf1.get_variable("w", initializer=tf.constant(
      [[0.3, -0.1], [0.2, 0.4], [-0.5, 0.1]]))
  return tf.matmul(noise, w)


def discriminator_fn(data, unused_conditioning):
  w = tf1.get_variable("w", initializer=tf.constant([[0.7], [-0.3]]))
  b = tf1.get_variable("b", initializer=tf.constant([0.1]))
  return tf.matmul(data, w) + b


def input_fn():
  return tf.data.Dataset.from_tensors((NOISE, REAL)).repeat()


def train(hooks_fn, wrap, model_dir, session_config, num_towers=None):
  """Trains a GANEstimator (wrapped with `num_towers`); its variables."""
  config = tf.estimator.RunConfig(model_dir=model_dir,
                                  session_config=session_config,
                                  save_summary_steps=1000)
  gan = tfgan.estimator.GANEstimator(
      generator_fn=generator_fn, discriminator_fn=discriminator_fn,
      generator_loss_fn=tfgan.losses.modified_generator_loss,
      discriminator_loss_fn=tfgan.losses.modified_discriminator_loss,
      generator_optimizer=lambda: wrap(tf1.train.MomentumOptimizer(0.2, 0.9)),
      discriminator_optimizer=lambda: wrap(tf1.train.AdamOptimizer(0.1)),
      get_hooks_fn=hooks_fn, use_loss_summaries=False, config=config)
  estimator = gan if num_towers is None else tf.estimator.Estimator(
      emg.multi_gpu(gan.model_fn,
                    devices=[f"/cpu:{i}" for i in range(num_towers)]),
      config=config)
  estimator.train(input_fn, max_steps=STEPS)
  return {name: estimator.get_variable_value(name)
          for name in estimator.get_variable_names()}


@pytest.mark.parametrize("num_towers", [2, 3])
@pytest.mark.parametrize("hooks", ["sequential", "joint"])
def test_gan_estimator_is_exact(hooks, num_towers, session_config, tmp_path):
  hooks_fn = (tfgan.get_sequential_train_hooks() if hooks == "sequential"
              else tfgan.get_joint_train_hooks())
  want = train(hooks_fn, lambda o: o, str(tmp_path / "one"), session_config)
  got = train(hooks_fn, emg.TowerOptimizer, str(tmp_path / "many"),
              session_config, num_towers)
  harness.assert_same_variables(got, want)
  assert got["global_step"] == STEPS
  # The discriminator's Adam applied once per step: β₁^(steps + 1).
  beta1_power = [v for k, v in got.items() if k.endswith("beta1_power")]
  np.testing.assert_allclose(beta1_power, [0.9 ** (STEPS + 1)], rtol=1e-6)
