"""The model-dir room: what a model dir holds and whether a run fits it.

- `run_settings`: the table of a run's settings and their rules (must match
  on resume, may change, shared by the tasks of a job).
- `run_config`: run_config.json, the record train.py writes beside the
  checkpoints; eval.py and export.py read it.
- `run_record`: what train.py records and says on a resume.
- `resume`: a resumed train.py refuses another net or other data.
- `checkpoints`: the checkpoint a path names; a model dir that can save.
- `restore_check`: the model dir's checkpoint fits the graph this run builds.
- `train_checks`: train.py's checks before it builds the training graph.
- `eval_dirs`: the run eval.py evaluates, and where its events go.
"""
