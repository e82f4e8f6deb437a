"""What train.py, eval.py and export.py share (the library defines no flags).

- `entry_point`: the scripts' `run(main, doc)`; the check that the
  packages are installed; every error as one line, exit status 2 or 1.
- `flags/`: the flags room: definitions and `read`, value checks, the
  flag-use table, tf-slim's names, grouped `--help`, the run's advice.
- `model_dir/` and `data/`: the checks of the model dir and of the data.
- `multi_gpu_options`: train.py's options of `emg.multi_gpu`, one row
  each: the one mapping from flags to `Options` (flags, settings, record).
- Settings, run setup, logs, fine-tuning and the cluster task: modules here.
"""
