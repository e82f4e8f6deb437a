"""Cross-tower communication inside the forward pass, differentiable.

`collectives` all-reduces a tensor between the towers with TensorFlow's
collective ops (a ring between CPU devices, NCCL between GPUs), gradient
included; `context` says which tower is being built and with which group.
On top of them: `moments` (the global batch's mean and variance), `layers`
(synchronized batch norm for tf-slim, `tf.compat.v1.layers` and Keras) and
`losses` (`global_ratio`, `cross_tower_sum`, `cross_tower_concat` for losses
normalized by, or coupled across, the global batch).
"""
