"""The update step: from the towers' recorded gradients to one update.

`tower_optimizer.TowerOptimizer` records each tower's weighted gradients
(`recording`; `keras_optimizer` for Keras legacy optimizers, `canned` for
the canned estimators' own); `train_spec` runs the update chain on the
built towers: `chain.UpdateChain` runs combine -> the steps -> apply, with
the plan's strategy doing both ends and `steps.steps_for` giving the steps
the options ask for, in order, each a `chain.UpdateStep` in its own module:
`loss_scaling` (skip-on-non-finite, unscale), `accumulation`, `clipping`.
`triggers` ties each optimizer call's update to what runs it.
"""
