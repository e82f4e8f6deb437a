"""An image-classification model_fn over `nets/`, for train.py and eval.py.

It is an ordinary single-device model_fn (wrap it with `multi_gpu`): a
`nets_factory` network, softmax cross-entropy with optional label smoothing
plus weight decay, a learning-rate schedule with warm-up, and a
`TowerOptimizer`-wrapped optimizer (inside it a `SyncReplicasOptimizer` when
`sync_replicas` is set, for synchronous training on a cluster). Everything is
configured by a plain `ClassifierConfig`; the scripts build it from flags.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Optional

import tensorflow as tf

import estimator_multigpu as emg

import nets

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys
OPTIMIZERS = ("sgd", "momentum", "adam", "rmsprop", "adadelta", "adagrad",
              "ftrl")
DECAY_TYPES = ("fixed", "exponential", "polynomial", "cosine")
# Each optimizer's settings (ClassifierConfig fields, tf-slim's flag names)
# and the argument of its tf.compat.v1.train class that each one sets.
OPTIMIZER_SETTINGS = {
    "sgd": {},
    "momentum": {"momentum": "momentum"},
    "adam": {"adam_beta1": "beta1", "adam_beta2": "beta2",
             "opt_epsilon": "epsilon"},
    "rmsprop": {"rmsprop_decay": "decay", "rmsprop_momentum": "momentum",
                "opt_epsilon": "epsilon"},
    "adadelta": {"adadelta_rho": "rho", "opt_epsilon": "epsilon"},
    "adagrad": {"adagrad_initial_accumulator_value":
                "initial_accumulator_value"},
    "ftrl": {"ftrl_learning_rate_power": "learning_rate_power",
             "ftrl_initial_accumulator_value": "initial_accumulator_value",
             "ftrl_l1": "l1_regularization_strength",
             "ftrl_l2": "l2_regularization_strength"},
}
# `opt_epsilon=None`: TensorFlow's epsilon for adam and adadelta, tf-slim's
# 1.0 for rmsprop (what these scripts always used; slim's default for all).
DEFAULT_EPSILON = {"adam": 1e-8, "adadelta": 1e-8, "rmsprop": 1.0}
# FTRL's weights are -linear * rate / sqrt(accumulator): proportional to the
# current learning rate, so a decaying rate shrinks the model to 0.
FTRL_DECAY_ERROR = (
    "`optimizer` 'ftrl' with `learning_rate_decay_type` {!r}: FTRL's "
    "weights are proportional to the current learning rate, so a decaying "
    "rate shrinks the whole model towards 0 (LeNet on the digits went from "
    "loss 0.12 back to chance as a cosine decay ended); use 'fixed'.")
# Setting -> (test of a finite value, what is expected).
SETTING_RANGES = {
    "momentum": (lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
    "adam_beta1": (lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
    "adam_beta2": (lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
    "opt_epsilon": (lambda v: v > 0.0, "a number > 0"),
    "rmsprop_decay": (lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
    "rmsprop_momentum": (lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
    "adadelta_rho": (lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
    "adagrad_initial_accumulator_value": (lambda v: v > 0.0,
                                          "a number > 0"),
    "ftrl_learning_rate_power": (lambda v: v <= 0.0, "a number <= 0"),
    "ftrl_initial_accumulator_value": (lambda v: v >= 0.0,
                                       "a number >= 0"),
    "ftrl_l1": (lambda v: v >= 0.0, "a number >= 0"),
    "ftrl_l2": (lambda v: v >= 0.0, "a number >= 0"),
    "decay_rate": (lambda v: 0.0 < v <= 1.0, "a factor in (0, 1]"),
}
LEARNING_RATE_NAME = "current_learning_rate"  # tower 0's, read by hooks.


@dataclasses.dataclass(frozen=True)
class ClassifierConfig:
  """What the classifier model_fn builds. See train.py's flags for meanings."""
  model_name: str = "lenet"
  num_classes: int = 10
  weight_decay: float = 0.0
  label_smoothing: float = 0.0
  optimizer: str = "momentum"
  learning_rate: float = 0.05
  momentum: float = 0.9
  adam_beta1: float = 0.9
  adam_beta2: float = 0.999
  opt_epsilon: Optional[float] = None  # None: DEFAULT_EPSILON.
  rmsprop_decay: float = 0.9
  rmsprop_momentum: float = 0.9
  adadelta_rho: float = 0.95
  adagrad_initial_accumulator_value: float = 0.1
  ftrl_learning_rate_power: float = -0.5
  ftrl_initial_accumulator_value: float = 0.1
  ftrl_l1: float = 0.0
  ftrl_l2: float = 0.0
  learning_rate_decay_type: str = "fixed"
  decay_steps: int = 1000
  decay_rate: float = 0.5
  staircase: bool = False  # exponential: decay in whole periods (slim's).
  end_learning_rate: float = 0.0
  warmup_steps: int = 0
  sync_replicas: int = 0  # n > 0: average n workers' gradients per step.
  trainable_scopes: tuple = ()  # slim's: train only these; () trains all.

  def __post_init__(self):
    if isinstance(self.trainable_scopes, str):
      raise TypeError(f"`trainable_scopes` is the string "
                      f"{self.trainable_scopes!r}; expected a sequence of "
                      f"scopes, e.g. ({self.trainable_scopes!r},).")
    object.__setattr__(self, "trainable_scopes",  # a JSON list: a tuple.
                       tuple(self.trainable_scopes))
    _check_choice("optimizer", self.optimizer, OPTIMIZERS)
    _check_choice("learning_rate_decay_type", self.learning_rate_decay_type,
                  DECAY_TYPES)
    nets.get_network_fn(self.model_name, self.num_classes)  # name check.
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ValueError(f"`label_smoothing` is {self.label_smoothing}; "
                       "expected a number in [0, 1).")
    if not (math.isfinite(self.learning_rate) and self.learning_rate > 0) or (
        self.decay_steps < 1 or self.warmup_steps < 0):
      raise ValueError(
          f"`learning_rate` ({self.learning_rate}) must be a finite number "
          f"> 0, "
          f"`decay_steps` ({self.decay_steps}) >= 1 and `warmup_steps` "
          f"({self.warmup_steps}) >= 0.")
    if self.sync_replicas < 0:
      raise ValueError(f"`sync_replicas` is {self.sync_replicas}; expected 0 "
                       "(asynchronous) or the number of workers.")
    self._check_settings()

  def _check_settings(self) -> None:
    for name in SETTING_RANGES:
      value = getattr(self, name)
      if not (name == "opt_epsilon" and value is None) and not in_range(
          name, value):
        raise ValueError(f"`{name}` is {value}; expected "
                         f"{SETTING_RANGES[name][1]}.")
    if self.optimizer == "ftrl" and self.learning_rate_decay_type != "fixed":
      raise ValueError(FTRL_DECAY_ERROR.format(self.learning_rate_decay_type))
    if self.staircase and self.learning_rate_decay_type != "exponential":
      raise ValueError(
          "`staircase` is True, but `learning_rate_decay_type` is "
          f"{self.learning_rate_decay_type!r}; staircase applies only to "
          "'exponential' decay.")


def in_range(name: str, value) -> bool:
  """Whether `value` is a finite number allowed for setting `name`."""
  test = SETTING_RANGES[name][0]
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and test(value))


def _check_choice(name: str, value: str, choices: tuple) -> None:
  if value not in choices:
    raise ValueError(f"`{name}` is {value!r}; expected one of "
                     f"{', '.join(choices)}.")


def learning_rate(config: ClassifierConfig,
                  global_step: tf.Tensor) -> tf.Tensor:
  """The decayed learning rate, ramped up linearly over the warm-up steps."""
  step = tf.cast(global_step, tf.float32)
  decay_step = tf.maximum(step - config.warmup_steps, 0.0)
  base, steps = config.learning_rate, float(config.decay_steps)
  decayed = {
      "fixed": lambda: tf.constant(base),
      "exponential": lambda: base * config.decay_rate ** _periods(
          decay_step / steps, config.staircase),
      "polynomial": lambda: (base - config.end_learning_rate) * (
          1.0 - tf.minimum(decay_step, steps) / steps) +
                            config.end_learning_rate,
      "cosine": lambda: config.end_learning_rate + 0.5 * (
          base - config.end_learning_rate) * (1.0 + tf.cos(
              math.pi * tf.minimum(decay_step, steps) / steps)),
  }[config.learning_rate_decay_type]()
  if config.warmup_steps:
    ramp = base * (step + 1.0) / config.warmup_steps
    decayed = tf.where(step < config.warmup_steps, ramp, decayed)
  return tf.identity(decayed, name=LEARNING_RATE_NAME)


def _periods(periods: tf.Tensor, staircase: bool) -> tf.Tensor:
  return tf.floor(periods) if staircase else periods


def optimizer_settings(config: ClassifierConfig) -> dict:
  """{setting: value} of the configured optimizer, epsilon resolved."""
  settings = {name: getattr(config, name)
              for name in OPTIMIZER_SETTINGS[config.optimizer]}
  if settings.get("opt_epsilon", 0.0) is None:
    settings["opt_epsilon"] = DEFAULT_EPSILON[config.optimizer]
  return settings


_OPTIMIZER_CLASSES = {
    "sgd": tf1.train.GradientDescentOptimizer,
    "momentum": tf1.train.MomentumOptimizer,
    "adam": tf1.train.AdamOptimizer, "rmsprop": tf1.train.RMSPropOptimizer,
    "adadelta": tf1.train.AdadeltaOptimizer,
    "adagrad": tf1.train.AdagradOptimizer, "ftrl": tf1.train.FtrlOptimizer,
}


def make_optimizer(config: ClassifierConfig,
                   rate: tf.Tensor) -> tf1.train.Optimizer:
  """The configured optimizer (not yet wrapped), as tf-slim builds it."""
  arguments = OPTIMIZER_SETTINGS[config.optimizer]
  return _OPTIMIZER_CLASSES[config.optimizer](rate, **{
      arguments[name]: value
      for name, value in optimizer_settings(config).items()})


def model_fn(features: tf.Tensor, labels: Optional[tf.Tensor], mode: str,
             params: dict, config: Optional[tf.estimator.RunConfig] = None
             ) -> tf.estimator.EstimatorSpec:
  """Classifies `features` (NHWC images) with `params["classifier"]`.

  `config.is_chief` (RunConfig) picks the SyncReplicasOptimizer hook's role.
  """
  is_chief = getattr(config, "is_chief", True)
  config: ClassifierConfig = params["classifier"]
  network_fn = nets.get_network_fn(config.model_name, config.num_classes,
                                   config.weight_decay,
                                   is_training=mode == ModeKeys.TRAIN)
  logits, _ = network_fn(features)
  # Softmax and loss in float32 even when the towers compute in bfloat16 or
  # float16 (`multi_gpu(mixed_precision=...)`); a no-op in float32.
  logits = tf.cast(logits, tf.float32)
  predictions = {"classes": tf.argmax(logits, axis=1, output_type=tf.int32),
                 "probabilities": tf.nn.softmax(logits)}
  if mode == ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions=predictions,
                                      export_outputs=_export_outputs(
                                          predictions))
  loss = _loss(config, logits, labels)
  if mode == ModeKeys.EVAL:
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=(
        eval_metrics(config, logits, labels, predictions)))
  train_op, hooks = _train_op(config, loss, is_chief)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                    training_hooks=hooks)


def _loss(config: ClassifierConfig, logits, labels) -> tf.Tensor:
  one_hot = tf.one_hot(labels, config.num_classes)
  tf1.losses.softmax_cross_entropy(one_hot, logits,
                                   label_smoothing=config.label_smoothing)
  # Cross-entropy + weight decay, as `get_total_loss()`, summed in float32:
  # with mixed precision, tf.layers-based nets regularize the low-precision
  # casts of their weights.
  return tf.math.add_n(
      [tf.cast(loss, tf.float32) for loss in
       tf1.losses.get_losses() + tf1.losses.get_regularization_losses()],
      name="total_loss")


def _train_op(config: ClassifierConfig, loss: tf.Tensor,
              is_chief: bool) -> tuple:
  """The train op and its hooks (SyncReplicasOptimizer's, when synced)."""
  global_step = tf1.train.get_or_create_global_step()
  rate = learning_rate(config, global_step)
  tf1.summary.scalar("learning_rate", rate)
  optimizer = emg.TowerOptimizer(_maybe_synced(
      config, make_optimizer(config, rate)), summarize_gradient_norm=True)
  with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    train_op = optimizer.minimize(
        loss, global_step, var_list=variables_to_train(config.trainable_scopes))
  if not config.sync_replicas:
    return train_op, []
  # No initial tokens: each worker waits for the first aggregated update, so
  # every step averages one gradient from each of the n workers.
  return train_op, [optimizer.make_session_run_hook(is_chief, num_tokens=0)]


def in_scopes(name: str, scopes) -> bool:
  """Whether a variable name matches a scope (a regex from its start), as
  `get_collection(TRAINABLE_VARIABLES, scope)` in slim's --trainable_scopes."""
  return any(re.match(scope, name) for scope in scopes)


def variables_to_train(scopes: tuple) -> Optional[list]:
  """The trainable variables in `scopes`, or None (all) for no scopes.

  Names are matched relative to the current name scope, so that a tower
  of `multi_gpu` whose variables are its own copies (`tower_1/LeNet/...`,
  variable_update="replicated") selects the same variables as tower 0.

  Raises:
    ValueError: no trainable variable matches.
  """
  if not scopes:
    return None
  prefix = tf1.get_default_graph().get_name_scope()
  prefix = prefix + "/" if prefix else ""
  selected = [v for v in tf1.trainable_variables() if in_scopes(
      v.op.name[len(prefix):] if v.op.name.startswith(prefix) else v.op.name,
      scopes)]
  if not selected:
    some = ", ".join(v.op.name for v in tf1.trainable_variables()[:3])
    raise ValueError(f"`trainable_scopes` {list(scopes)} match no trainable "
                     "variable; expected regexes matching the start of "
                     f"variable names such as {some}.")
  return selected


def _maybe_synced(config: ClassifierConfig,
                  optimizer: tf1.train.Optimizer) -> tf1.train.Optimizer:
  if not config.sync_replicas:
    return optimizer
  return tf1.train.SyncReplicasOptimizer(
      optimizer, replicas_to_aggregate=config.sync_replicas,
      total_num_replicas=config.sync_replicas)


def eval_metrics(config: ClassifierConfig, logits, labels,
                 predictions) -> dict:
  """Accuracy, and top-5 accuracy when there are more than 5 classes."""
  metrics = {"accuracy": tf1.metrics.accuracy(labels, predictions["classes"])}
  if config.num_classes > 5:
    in_top_5 = tf.nn.in_top_k(predictions=logits, targets=labels, k=5)
    metrics["top_5"] = tf1.metrics.mean(tf.cast(in_top_5, tf.float32))
  return metrics


def _export_outputs(predictions: dict) -> dict:
  key = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
  return {key: tf.estimator.export.PredictOutput(predictions)}
