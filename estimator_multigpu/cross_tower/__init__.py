"""Communication between towers, differentiable, while the towers are built.

The collective ops themselves are `estimator_multigpu.collectives` (a ring
between CPU devices, NCCL between GPUs, gradient included); `context` says
which tower is being built and with which group. On top of them:

- `moments`: the global batch's mean and variance, inside one tower;
- `sync_batch_norm`: synchronized batch norm for tf-slim,
  `tf.compat.v1.layers` and Keras (`multi_gpu(..., sync_batch_norm=True)`);
- `losses`: `global_ratio`, `cross_tower_sum`, `cross_tower_concat` for
  losses normalized by, or coupled across, the global batch;
- `v1_losses`: `tf.compat.v1.losses` over the global batch, unchanged
  model_fns;
- `regularization`: regularization counted once per global batch under
  every loss reduction;
- `across_tasks`: the graph side of an all-reduce job across machines
  (its tasks, a sum over them, the chief's variables broadcast at start).
"""

# The layer these tools build on, still reachable by its old path
# (`estimator_multigpu.cross_tower.collectives`, as user code patches it).
from estimator_multigpu import collectives  # noqa: F401
