"""The update step: from the towers' recorded gradients to one update.

`tower_optimizer.TowerOptimizer` records each tower's weighted gradients;
`chain.UpdateChain` runs the explicit chain combine -> unscale -> accumulate
-> clip -> apply, with the plan's strategy doing the first and last steps.
"""
