"""What train.py, eval.py and export.py share: their flags and settings,
the model dir's record, run checks, quiet logs and grouped --help (the
library defines no flags)."""

from cli import install

install.check_tensorflow()  # before TensorFlow: names the extras if missing.
