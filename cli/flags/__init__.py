"""The flags room: what the scripts' flags are and what they may be.

- `definitions`: every flag of train.py, eval.py and export.py, by group,
  and `read` (the settings from the flags, once, in `main`);
  `training_flags`: train.py's own groups (optimization, the `multi_gpu`
  options, checkpoints, fine-tuning, the cluster).
- `validators`: value checks while absl parses (one line each).
- `optimization`: tf-slim's optimizer and decay flags, checked together.
- `use_table`: when each flag is used; a flag a run would ignore is an
  error.
- `slim_names`: tf-slim's flag names and this project's equivalents (the
  table of docs/tf_slim.md), and the former names of renamed flags.
- `unknown`: every unknown flag of a command line, reported at once.
- `grouped_help`: `--help` by purpose.
- `advice`: what the run's settings imply before its first step (batch
  norm on few examples, a learning rate that never reaches its peak,
  `--sync_batch_norm` on a net without batch norm).
"""
