"""The model-dir room: what a model dir holds and whether a run fits it.

- `run_settings`: the table of a run's settings and their rules (must match
  on resume, may change, shared by the tasks of a job).
- `run_config`: run_config.json, the record train.py writes beside the
  checkpoints (in a model dir that is a folder); eval.py and export.py read
  it.
- `run_record`: what train.py records and says on a resume.
- `resume`: a resumed train.py refuses another net or other data;
  `resume_settings`: on a resume, what was not given comes from the record.
- `checkpoints`: the checkpoint a path names; a model dir that can save;
  train.py's lock on it.
- `restore_check`: the model dir's checkpoint fits the graph this run builds.
- `start`: the model dir at the start of training (restore check, nothing
  left to train, the run recorded).
- `eval_dirs`: the run eval.py evaluates, and where its events go.
"""
