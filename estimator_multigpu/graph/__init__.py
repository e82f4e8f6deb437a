"""Building one graph: plan, shards, towers, shared variables, merged spec, EMA.

In the order data flows: `plan` (which device each tower uses), `splitting`
(the global batch into per-tower shards), `towers` (the model_fn once per
tower; `sharing` gives towers 1.. tower 0's variables), `precision` (mixed
precision inside the towers), `specs` (one EstimatorSpec from the towers')
and `ema` (the moving average of the weights).
"""
