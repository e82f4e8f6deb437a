"""All-reduce jobs: a chief and workers, no parameter server.

- `training`: `train_and_evaluate` for such a job (starts the task's server,
  runs it under its guard).
- `servers`: what each task's server offers (devices, collective leader).
- `guard`: what keeps a task from hanging or training wrongly.
- `agreement`: tasks that disagree are refused before the first step.
- `board`, `board_entries`, `board_session`: the job's notice board on the
  chief's server, its entries sealed with the job token, its session
  renewed when the chief's server drops it.
- `strays`: a task of another job, or a second task of a live task's
  name, refuses itself before it joins.
- `heartbeat`: a peer that stops making progress ends the job.
- `peer_probe`: a dead peer ends the task, within a bounded time.
- `stop_signal`: a stop signal to any task stops the whole job at one step.
"""
