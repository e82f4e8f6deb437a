"""Builds a wrapped model_fn in a fresh graph and runs it in a session."""

import inspect

import numpy as np
import tensorflow as tf

import estimator_multigpu as emg

tf1 = tf.compat.v1
TRAIN = tf.estimator.ModeKeys.TRAIN


# `multi_gpu` options of each variable mode and reduction the exactness tests
# run in: shared variables, and replicated ones with every all-reduce.
VARIABLE_MODES = {
    "auto": {},  # the default: shared on CPU towers.
    "shared": {"variable_update": "shared"},
    "replicated": {"variable_update": "replicated"},
    "replicated_add_n": {"variable_update": "replicated",
                         "all_reduce": "add_n"},
    "replicated_packed": {"variable_update": "replicated",
                          "gradient_packing_bytes": 16},
    "replicated_unpacked": {"variable_update": "replicated",
                            "gradient_packing_bytes": 0},
    "replicated_hierarchical": {"variable_update": "replicated",
                                "all_reduce": "hierarchical"},
}


def cpu_devices(num_towers):
  return [f"/cpu:{i}" for i in range(num_towers)]


def config_for(session_config):
  return tf.estimator.RunConfig(session_config=session_config)


def train(model_fn, features, labels, steps, session_config, num_towers=None,
          dynamic_batch=False, local_variables=False, params=None, **options):
  """Trains `model_fn` (wrapped when num_towers is set) for `steps` steps.

  Args:
    model_fn: the unwrapped model_fn.
    features, labels: numpy structures (labels may be None), or callables
      that build the tensors inside the graph.
    steps: session.run(train_op) count.
    session_config: ConfigProto with enough virtual CPUs.
    num_towers: None for the unwrapped model_fn, else towers on /cpu:0..
    dynamic_batch: feed the inputs through placeholders whose batch
      dimension is unknown when the graph is built.
    local_variables: also return the local variables (replicated copies).
    params: the model_fn's `params` (default {}).
    **options: more `multi_gpu` options.

  Returns:
    {variable name: value} of every global variable (and local one, with
    `local_variables`) after training, and
    the spec's loss value at the first step.
  """
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    feed = {}
    features_t = _inputs(features, dynamic_batch, feed)
    labels_t = _inputs(labels, dynamic_batch, feed)
    fn = model_fn if num_towers is None else emg.multi_gpu(
        model_fn, devices=cpu_devices(num_towers), **options)
    spec = call(fn, features_t, labels_t, TRAIN, session_config, params)
    with tf1.Session(config=session_config) as session:
      # Local after global, as Estimator does: replicated towers' local
      # copies start from tower 0's values.
      initializers = [tf1.global_variables_initializer(),
                      tf1.local_variables_initializer(),
                      tf1.tables_initializer()]
      for initializer in initializers:
        session.run(initializer)
      first_loss = None
      for _ in range(steps):
        loss, _ = session.run([spec.loss, spec.train_op], feed_dict=feed)
        first_loss = loss if first_loss is None else first_loss
      variables = tf1.global_variables() + (
          tf1.local_variables() if local_variables else [])
      values = dict(zip([v.op.name for v in variables],
                        session.run(variables)))
  return values, first_loss


def assert_same_variables(got: dict, want: dict, atol: float = 1e-5):
  """The same variable names, each within `atol` of one device's value."""
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], atol=atol, err_msg=name)


def call(model_fn, features, labels, mode, session_config, params=None):
  """Calls a model_fn with the arguments it declares, like Estimator."""
  declared = inspect.signature(model_fn).parameters
  extra = {"params": params or {}, "config": config_for(session_config)}
  return model_fn(features, labels, mode,
                  **{k: v for k, v in extra.items() if k in declared})


def _inputs(structure, dynamic_batch, feed):
  """Constants, or placeholders with an unknown batch size (fed later)."""
  if structure is None:
    return None
  if callable(structure):
    return structure()
  if not dynamic_batch:
    return tf.nest.map_structure(tf.constant, structure)

  def placeholder(array):
    holder = tf1.placeholder(array.dtype, [None] + list(array.shape[1:]))
    feed[holder] = array
    return holder

  return tf.nest.map_structure(placeholder, structure)


def linear_data(batch, in_dim=3, out_dim=2, seed=0):
  rng = np.random.RandomState(seed)
  x = rng.randn(batch, in_dim).astype(np.float32)
  y = rng.randn(batch, out_dim).astype(np.float32)
  return x, y


def linear_gradients(x, y, w, b):
  """numpy: d/d(w, b) of mean((x @ w + b - y)²), the linear_data loss."""
  residual = x @ w + b - y
  scale = 2.0 / residual.size
  return scale * x.T @ residual, scale * residual.sum(axis=0)
