"""The `multi_gpu` decorator: one tower per device, one merged EstimatorSpec."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from estimator_multigpu import options as options_lib
from estimator_multigpu import pipeline
from estimator_multigpu import slim_compat
from estimator_multigpu.graph import plan as plan_lib
from estimator_multigpu.graph import warn_once

tf1 = tf.compat.v1
ModeKeys = tf.estimator.ModeKeys
ModelFn = Callable[..., tf.estimator.EstimatorSpec]
Options = options_lib.Options


def multi_gpu(model_fn: Optional[ModelFn] = None, *,
              devices: plan_lib.DevicesOption = None,
              aggregation_device: Optional[str] = None,
              loss_reduction: str = "mean",
              ema_decay: Optional[float] = None,
              clip_gradients_by_norm: Optional[float] = None,
              use_ema_weights: bool = True,
              variable_update: str = "auto",
              unsplit_features: Sequence[str] = (),
              all_reduce: Optional[str] = None,
              gradient_packing_bytes: Optional[int] = None,
              accumulate_steps: int = 1,
              mixed_precision: Optional[str] = None,
              sync_batch_norm: bool = False,
              synchronization: str = "sync",
              prediction_pad_value: Any = None,
              global_batch: bool = True) -> Any:
  """Makes a single-device Estimator `model_fn` train on several devices.

  The global batch that `input_fn` yields is cut into one contiguous shard
  per device (a *tower*); the `model_fn` is called once per tower with its
  shard; the towers share one set of variables; and one `EstimatorSpec`
  covering the whole global batch is returned. N towers compute the same
  loss, gradients, metrics and predictions as the unwrapped `model_fn` on
  one device, up to floating-point rounding.

  Rules the `model_fn` must follow:

    1. Wrap every optimizer in `TowerOptimizer` (an unwrapped one is an error
       with more than one tower): a `tf.compat.v1.train` one or a Keras 2
       legacy one (`tf.keras.optimizers.legacy.*`; non-legacy and Keras 3
       optimizers are an error naming the legacy class, and Keras ones need
       variable_update="shared", synchronization="sync"). The one exception:
       the optimizers a tensorflow-estimator canned estimator builds itself
       are wrapped for you, so `tf.estimator.Estimator(multi_gpu(devices=...)(
       canned.model_fn), config=...)` trains `DNNClassifier`,
       `LinearClassifier`, `DNNLinearCombinedClassifier`, `DNNEstimator` &co.
       with their own optimizers. Call it the same way in every tower. Its
       `apply_gradients` weights whatever gradients it gets, once: from
       `minimize`, either optimizer's `compute_gradients`, `tf.gradients`,
       or your own code. A custom `tf.compat.v1.train.Optimizer` (BERT's
       AdamWeightDecay) and a hand-incremented `global_step` (tower 0's
       train_op runs once per step) work; `TowerOptimizer(TowerOptimizer(
       opt))` is `TowerOptimizer(opt)`. With `tf_slim.optimize_loss`, pass
       `optimizer=lambda lr: TowerOptimizer(...)`, not a name. Each
       optimizer's combined update runs when its own tower-0 op runs (the
       train_op, a hook's `run` as in TF-GAN, a `tf.cond` branch: compute
       the losses before the `tf.cond`) and applies only its variables.
    2. With `loss_reduction="mean"` (default) the loss must be a mean over
       the tower's examples, plus any batch-independent terms such as weight
       decay; with `"sum"` it must be a sum over them (a batch-independent
       term would then be counted once per tower). `tf.compat.v1.losses`
       terms are exact under every reduction, weights and masks included
       (each becomes its tower's share of its global normalizer). A loss you
       divide by a count of the batch (tokens, matches) divides with
       `global_ratio`; a loss in which examples see each other (in-batch
       negatives) gathers them with `cross_tower_concat`. `check_towers`
       tells whether a model_fn follows this rule.
    3. Create the same variables in every tower, unconditionally. Variables
       get exactly the unwrapped names; towers 1.. reuse them, whether made
       by `tf.compat.v1.get_variable`, tf-slim, `tf.compat.v1.layers`, Keras
       layers built inside the `model_fn`, or `tf.Variable`.
    4. Batch-norm statistics inside a tower come from that tower's shard
       unless `sync_batch_norm=True`, which makes them the global batch's;
       the UPDATE_OPS of tower 0 run once per step (towers 1.. are not run, so
       control dependencies around the optimizer call are dropped in towers
       1..; compute gradients with `tf.gradients` outside a
       `tf.control_dependencies(update_ops)` block, or towers 1..'s updates
       would run too). Tower 0 gets an example whenever the batch has one,
       so the moving averages never come from an empty shard. What tower 0
       puts under the control of its optimizer call (its own
       `ExponentialMovingAverage.apply`) runs after the combined update
       (with `accumulate_steps=1`).
    5. Gradient clipping written inside the `model_fn` (BERT's
       `tf.clip_by_global_norm`, `tf.clip_by_norm`, `tf.clip_by_value`, by
       any name) clips each tower's own gradient before the towers are
       combined; it is found from the graph's structure and warned about
       once. For the single-device clip of the combined gradient remove it
       and pass `clip_gradients_by_norm`.
    6. Metrics and summaries go through their APIs, which are built once,
       in tower 0, from the global batch (`graph.global_calls`): every
       `tf.compat.v1.metrics`, tf-slim and TF-Ranking metric, a Keras
       `Metric.update_state` (the canned heads' included), a
       `TPUEstimatorSpec`'s `eval_metrics` and `host_call` (returned, or
       converted in the model_fn), and `tf.compat.v1.summary.*` / TF2
       `tf.summary.*` (`tf.summary.write` too). The API sees the
       towers' per-example tensors concatenated in input order, and each
       scalar it is fed as the global batch's: the loss and LOSSES terms
       with the towers' loss weights, a mean, sum, max, min or count of the
       shard's examples, a sum over a sum or a count (a weighted mean). So
       any such metric (`mean_iou`, AUC, `precision_at_k`, Pearson) is one
       device's, and repeated evaluations agree. Still inferred, with a
       WARNING naming it (once per model_fn and mode): a scalar of another
       kind (a variance, a ratio of means: tower 0's), a metric that builds
       its own variables and assignments outside those APIs (weighted or
       ordered from its ops, `graph.metrics`), a raw `ScalarSummary` op,
       and a per-example input computed before the call from a statistic of
       the batch (a softmax over axis 0): compute such a statistic with
       `cross_tower_sum` / `cross_tower_concat`. Tensors held by hooks (an
       attribute, a dict, list or tuple) read the global batch's value
       when they are the loss, a LOSSES term, a mean or a sum.
    7. Inputs: every feature and label is cut along axis 0, except the
       feature keys named in `unsplit_features`, which every tower gets
       whole. `tf.RaggedTensor` inputs and a global batch of 0 examples in
       TRAIN or EVAL are errors; every prediction needs a batch dimension.
    8. The model_fn returns an `EstimatorSpec`, or a `TPUEstimatorSpec`
       (converted with `as_estimator_spec()`, as `TPUEstimator(use_tpu=False)`
       does).

  Shared and per tower: variables, optimizer slots, metric state, hooks and
  the scaffold exist once; ops, shards and batch statistics are per tower.
  Inside a tower, the LOSSES, UPDATE_OPS, SUMMARIES and REGULARIZATION_LOSSES
  collections show only that tower's items, so `get_total_loss()` works;
  weight regularization counts once per global batch under either
  `loss_reduction` (with "sum", towers 1.. see their weight terms as 0;
  `cross_tower.regularization`). The Savers and Scaffold `init_op` a
  model_fn builds also save and initialize what is created after them
  (optimizer slots, EMA shadows: `graph.model_savers`).
  With variable_update="replicated", trainable variables and optimizer slots
  are per tower in TRAIN (towers 1.. hold local copies `tower_<i>/<name>`,
  and `trainable_variables()` inside a tower lists its own); the rest stays
  shared.

  How each mode is merged:
    - TRAIN: loss = Σ (nᵢ/n)·lossᵢ ("mean") or Σ lossᵢ ("sum"); gradients
      summed on the aggregation device (sparse stays sparse) and applied once;
      tower 0's train_op, hooks, scaffold and summaries are kept. State the
      train_op writes from the batch outside UPDATE_OPS: counts and sums are
      every tower's, values made global with the cross-tower tools are written
      once, anything else is one WARNING naming the variables. A NaN loss fails
      the step with how many values of each feature and label are NaN or Inf
      (one device: Estimator's bare NanLossDuringTrainingError).
    - EVAL: the loss as in TRAIN; each metric one device's (rule 6).
    - PREDICT: predictions and export outputs concatenated in input order
      (batch-level ones through the cross-tower tools, rule 6); other axes that
      differ between towers are padded to the largest across towers with
      `prediction_pad_value`.
    - Export (every SavedModel Estimator writes, its TRAIN and EVAL meta
      graphs too: `graph.calling`): one tower, no device placement, so the
      SavedModel loads on any machine at any batch size.

  With `ema_decay`, shadow variables `<name>/ExponentialMovingAverage` track
  the trainable variables and batch-norm moving statistics after every step
  (see `estimator_multigpu.graph.ema`), and EVAL, PREDICT and export use them.

  Gradient accumulation (`accumulate_steps=k`, `estimator_multigpu.
  update.accumulation`): each training step reads k consecutive batches from
  `input_fn`, runs each through the towers, sums their weighted gradients on
  the aggregation device (sparse stays sparse) and applies one update, equal
  to one step on the k batches' concatenation (weighted by examples, so a
  short last batch counts exactly). `global_step` counts updates:
  `Estimator.train(steps=1)` reads k batches, and learning-rate schedules,
  checkpoints, summaries and the EMA move once per update. Batch-norm
  UPDATE_OPS run with every micro-batch. Effective batch = k × global batch.

  Mixed precision (`mixed_precision="bfloat16"` or `"float16"`,
  `estimator_multigpu.graph.precision`): inside the towers the floating
  features are cast to the low precision and variables requested in it by
  `get_variable`, tf-slim, `tf.compat.v1.layers` or Keras layers are float32
  masters read through casts; the loss is differentiated in float32 and the
  gradients are combined in float32. Compute the loss in float32: cast the
  logits, and the regularization terms of `tf.compat.v1.layers`-based layers
  (they regularize the low-precision casts), with `tf.cast`. float16 adds
  TensorFlow's `DynamicLossScale` (start 2¹⁵, doubles after 2000 finite
  steps, halves on Inf/NaN): an update with a non-finite gradient is skipped
  whole (`global_step` and the EMA do not move), logged as a WARNING and
  counted in the `skipped_updates` summary. Export stays float32.

  Examples:
    >>> @multi_gpu(devices=2)
    ... def model_fn(features, labels, mode, params):
    ...   logits = tf.compat.v1.layers.dense(features["x"], 10)
    ...   loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    ...   opt = TowerOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    ...   train_op = opt.minimize(loss, tf.compat.v1.train.get_global_step())
    ...   return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  Args:
    model_fn: `(features, labels, mode[, params][, config]) -> EstimatorSpec`.
      When omitted, `multi_gpu(...)` returns the decorator.
    devices: None (every visible GPU, else one CPU tower), an int n (the
      first n GPUs), or device strings (`/gpu:0`, `/GPU:0`, `/device:GPU:0`,
      `/cpu:1`). Each must exist in the session; for N towers on a CPU, use
      `make_session_config(num_cpus=N)` in the RunConfig. A list of device
      groups (`[["/gpu:0", "/gpu:1"], ["/gpu:2", "/gpu:3"]]`) gives each
      tower a group: its ops default to the group's first device and the
      model_fn may place layers on the others (`tower_devices()`).
    aggregation_device: where shared variables live and gradients are
      combined. None: `/cpu:0` with several towers; the tower's own device
      with one (`devices.aggregation_device_for`).
    loss_reduction: "mean" or "sum", what the model_fn's loss is (rule 2).
    ema_decay: float in (0, 1) to keep an exponential moving average of the
      weights; None for none.
    clip_gradients_by_norm: clip the combined gradients to this global norm.
    use_ema_weights: with `ema_decay`, evaluate, predict and export with the
      averaged weights (True) or the raw ones (False).
    variable_update: how towers share variables and combine gradients
      (`strategies`). "auto" (default): "replicated" with two or more GPU
      towers, in an all-reduce cluster (chief + workers, no ps), or when
      `all_reduce` or `gradient_packing_bytes` is given; "shared" otherwise
      (CPU towers, one GPU, a ps cluster, `synchronization="async"`).
      "shared": one copy on the aggregation device (the host by default);
      each tower reads it and sends its gradient there (tf_cnn_benchmarks'
      `parameter_server`, tensorpack's `SyncMultiGPUTrainerParameterServer`):
      ask for it to keep one copy of the variables in host memory.
      "replicated": each tower trains its own copy of the trainable
      variables and optimizer slots, the gradients are all-reduced and every
      tower applies the same update (tf_cnn_benchmarks' `replicated`,
      tensorpack's `SyncMultiGPUTrainerReplicated`, MirroredStrategy); tower
      0's copies keep the single-device names and are the only ones saved.
      It costs a copy of the variables and optimizer slots per tower.
      Not with `SyncReplicasOptimizer` or parameter-server clusters.
    all_reduce: with a copy per tower: "collective" (default on one machine;
      TensorFlow's collective ops, NCCL on GPUs, a ring on CPUs), "add_n"
      (one sum on the aggregation device that every tower reads) or
      "hierarchical" (default across tasks: summed within each task, across
      tasks once by each task's first tower, read back by its other towers).
    gradient_packing_bytes: with a copy per tower: concatenate dense
      gradients into buffers of at most this many bytes before the
      all-reduce (fewer, larger reductions, like tf_cnn_benchmarks'
      `--gradient_repacking` and Horovod's tensor fusion); None:
      `strategies.all_reduce.DEFAULT_PACKING_BYTES` (64 MiB); 0: each gradient alone.
    accumulate_steps: k >= 1 input batches per update (1: none).
    mixed_precision: None (float32), "bfloat16" or "float16" (with dynamic
      loss scaling): the precision the towers compute in; variables,
      gradient combination and the update stay float32.
    sync_batch_norm: True: in TRAIN mode with several towers, every
      batch-norm layer (tf-slim `batch_norm`, `tf.compat.v1.layers`, Keras
      `BatchNormalization`; fused or not) normalizes with the moments of the
      global batch: per-tower sums, sums of squares and counts are
      all-reduced between the towers with TensorFlow's collective ops (one
      all-reduce of 3·C numbers per layer forward, one backward), so the
      loss, gradients and moving statistics equal one device's on the whole
      batch. All towers then run every step together; a step that reaches
      only some of them fails after `collectives.TIMEOUT_SECONDS`. EVAL,
      PREDICT and export are unchanged (moving statistics, no collectives).
      Custom normalization code can call `cross_tower_moments`.
    synchronization: "sync" (default): the towers' gradients are combined
      into one update per step. "async" (tensorpack's
      `AsyncMultiGPUTrainer`): every tower applies its own gradient (of
      its own mean loss, not averaged) to the shared variables as soon as
      it has it; within a step the applies run one after another in tower
      order, so no update is lost, and a tower may read the weights before
      or after another tower's update. `global_step` moves once per step.
      With plain SGD and gradients taken at the step's weights, a step is
      w - lr·Σᵢ gᵢ. A tower's training step is its own: its ops run on its
      shard, whatever `global_batch` says. Not with "replicated",
      accumulation, sync batch norm or float16.
    unsplit_features: keys of the features dict that are not batch-major
      (a vocabulary, a lookup table): every tower gets them whole.
    prediction_pad_value: what pads a prediction whose other dimensions
      differ between towers (decoded ids of the shard's longest sequence,
      a shard's boxes) to the largest across towers, at the end of each
      differing axis: None (0 for numbers, False for booleans, "" for
      strings), one value, or a dict {prediction key: value}.
    global_batch: True: every op of a tower's forward pass that couples the
      examples of the batch (an in-batch similarity matrix, a softmax or
      sort along the batch, `x - tf.reduce_mean(x)`, `tf.py_func`, an op
      type the package does not know) runs on the global batch; only ops
      whose batch semantics the package knows stay on the shard
      (`emg.global_batch_ops(graph)` lists what was rewritten), inside
      `tf.cond` branches too; a statistic meeting the examples inside a
      `tf.while_loop` body is an error. A tower's loss counts once by the
      `loss_reduction`'s combination, however the model_fn normalized it.
      Not in `synchronization="async"` training, whose towers step on their
      own shards. False: every op runs on its shard, as written (the
      couplings the package recognizes are still combined or warned).

  Returns:
    The wrapped `model_fn(features, labels, mode, params, config)`.

  Raises:
    TypeError, ValueError: an option is malformed (raised when wrapping);
      devices that do not exist and model_fn mistakes raise when the graph
      is built.
  """
  given = dict(locals())  # the options, named as `Options`' fields.
  del given["model_fn"]
  slim_compat.apply_all()  # tf-slim model_fns work on TF 2.15.
  options = options_lib.check_options(**given)
  if model_fn is None:
    return lambda fn: _wrap(fn, options)
  return _wrap(model_fn, options)


def _wrap(model_fn: ModelFn, options: Options) -> ModelFn:
  if not callable(model_fn):
    raise TypeError(f"`multi_gpu` wraps a model_fn; got {model_fn!r}.")

  def replicated_model_fn(features, labels, mode, params, config):
    with warn_once.model_scope(replicated_model_fn, mode):
      return pipeline.build_spec(model_fn, options, features, labels, mode,
                                 params, config)

  replicated_model_fn.__name__ = getattr(model_fn, "__name__", "model_fn")
  replicated_model_fn.__doc__ = model_fn.__doc__
  return replicated_model_fn
