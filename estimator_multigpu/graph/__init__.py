"""Building one graph: plan, shards, towers, shared variables, merged spec, EMA.

In the order data flows: `plan` (which device each tower uses), `splitting`
(the global batch into per-tower shards; `empty_shards` keeps oneDNN away
from an empty one on a CPU), `towers` (the model_fn once per tower, called
through `calling`; `sharing` gives towers 1.. tower 0's variables;
`patching` installs a module patch while towers are built), `precision`
(mixed precision inside the towers), `specs` (one EstimatorSpec from the
towers'), `nan_guard` (a NaN loss names its inputs) and `ema` (the moving
average of the weights).

What the user reads and writes: `global_calls` (metric and summary APIs
built once from the global batch; `readout_apis` lists them,
`global_values` feeds them the global batch's values), `metrics` (metric
code of its own, inferred), `readouts`, `hook_fetches` and `hook_rewrites`
(summaries and hooks), `state_updates` and `writes` (variables the
model_fn writes; `runnable`: which ops a session can run), `model_savers`,
`warm_starts` (`init_from_checkpoint` is tower 0's), `batch_size_param`,
`prediction_padding`;
`dataflow` reads the graph for all of them (the one walker, collectives,
op types by meaning), `tensor_kinds` says what a tensor is relative to the
shard, `shard_statistics` how a statistic combines over the towers, and
`warn_once` says each warning once per model. `global_batch` runs the ops
that couple a batch's examples on the global batch
(`multi_gpu(global_batch=True)`).
"""
