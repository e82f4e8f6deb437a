"""The global batch by default: an op stays on its tower's shard only where
its batch semantics are known (contract item 24).

While each tower's model_fn builds its forward pass, every new op is
classified from the kinds of its inputs (`kinds`: uniform, per-example on
an axis, rows counted by their values, a shape of the shard, a statistic
of the shard) against one table of op types (`table`, `shape_rules`). An op
the table knows stays per shard. Any other op that touches the shard is
rewritten (`rewrite`, with `exchange` for what the towers send each other
and `probe` for which of its outputs are per example; `op_view` is one op
as the table reads it, `state` the tower being built and what package
code declares, `scopes` the towers' scope, the INFO line and the listing):

- *local*: its statistics and sizes replaced by their global values (an
  all-reduce each), the op itself per shard (`x - mean(x)`, batch norm by
  hand, a loss over a count);
- *combined*: a max, min, product, all or any over the batch axis, the
  towers' results combined;
- *global*: its per-example inputs gathered from every tower (in input
  order, differentiable, empty shards included), the op recreated on the
  global batch, its per-example outputs sliced back to the tower's rows and
  the others kept global (in-batch similarity matrices, softmax over the
  batch, sort and top_k along it, `tf.py_func`, unknown op types). A
  stateful op runs in tower 0 only, once per step.

Gradient construction is never rewritten: a tower's gradient is its share
of the global gradient, and a tower's loss is counted once by the towers'
combination (`TowerRewrite.tower_loss`: a global loss under "sum" by the
tower's share, a sum of the shard under "mean" made global). A write (an op
without outputs) meeting the global batch's values gathers the shard's rows
and writes once, in tower 0; a scatter of per-example ids and rows runs in
every tower (`state_updates`). Ops inside `tf.cond` branches are rewritten
like the others (a branch on the global batch under a predicate of the
tower's own rows is an error). With one tower, with
`multi_gpu(global_batch=False)`, or in asynchronous training, nothing is
installed. `log_rewrites` writes one INFO line per model and mode;
`rewrites(graph)` lists them.

What stays inferred (kept per shard as written): ops of rows counted by
their values (`tf.where` of the shard, SparseTensor components, and what is
computed from them), ops inside `tf.while_loop` bodies (`tf.map_fn`,
`tf.foldl`; a statistic of the batch meeting its examples there is an
error), and training batch norm's statistics without `sync_batch_norm` (the
one documented warning).
"""
