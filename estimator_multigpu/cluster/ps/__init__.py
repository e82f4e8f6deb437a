"""Parameter-server jobs: ps tasks hold the variables, workers train.

- `job`: how a job starts and ends beyond what Estimator does (waiting for
  the ps and the chief, reporting to the ps, `run_trainer`).
- `control_queues`: the job's control plane, small shared queues and probes
  kept on the ps tasks.
- `watchdogs`: a trainer's watch on its ps tasks and its chief.
"""
