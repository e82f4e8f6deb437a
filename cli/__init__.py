"""What train.py, eval.py and export.py share (the library defines no flags).

- `entry_point`: the scripts' `run(main, doc)`; the check that the
  packages are installed; every error as one line, exit status 2 or 1.
- `flags/`: the flags room: definitions and `read`, value checks, the
  flag-use table, tf-slim's names, grouped `--help`, the run's advice.
- `model_dir/` and `data/`: the checks of the model dir and of the data.
- `multi_gpu_options`: train.py's options of `emg.multi_gpu`, one row
  each: the one mapping from flags to `Options` (flags, settings, record).
- `settings`: the typed frozen settings, one dataclass per flag group.
- `run_setup` (the model and data over the model dir's record), `towers`
  (the devices a script runs on), `run_plan` (train.py's settings resolved
  once), `run_estimator` (the model_fn, its hooks, the RunConfig),
  `cluster_task` (this process's task), `fine_tuning` (tf-slim's
  fine-tuning flags), `script_logging` (quiet logs).
"""
