"""Synchronized batch norm: batch-norm moments over the global batch.

`layers` makes tf-slim, `tf.compat.v1.layers` and Keras batch-norm layers call
`moments.cross_tower_moments`, whose sums `collectives` all-reduces between
the towers with TensorFlow's collective ops (gradient included).
"""
