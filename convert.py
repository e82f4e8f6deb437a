"""Converts a folder of images, one subfolder per class, to TFRecords.

    python convert.py --image_dir=photos --output_dir=/data/flowers \
        --num_shards=4 --validation_percentage=10

writes `train-0000i-of-00004.tfrecord` (and, with --validation_percentage,
the held-out `eval` split that eval.py reads by default) plus labels.txt and
splits.json (each shard's record count and size, which train.py and eval.py
check), for train.py --dataset_name=tfrecord --dataset_dir=/data/flowers.
Every subfolder is a class (class ids follow the sorted names); one without
images is refused. Every format the installed TensorFlow decodes converts
(BMP, GIF, JPEG, PNG; WebP from TensorFlow 2.21 on), photos turned upright
by their EXIF orientation; other files (TIFF, HEIC, ...) and images that do
not decode are skipped and named in one WARNING (datasets/convert.py).
All or nothing: the files are written to a temporary folder and moved into
place at the end, so a failed run leaves nothing and a rerun needs no
--overwrite. Logs are quiet as the other scripts'; a mistake is one line
and exit status 2 (--overwrite replaces a split a finished run wrote).
"""

from __future__ import annotations

import os
from typing import Sequence

# First: a missing package is one line; then the C++ log level, set before
# anything imports TensorFlow (script_logging.before_tensorflow).
from cli import entry_point

# isort: split

# pylint: disable=g-import-not-at-top,wrong-import-position,g-bad-import-order
from absl import flags
from absl import logging

from cli import script_logging
from datasets import convert

FLAGS = flags.FLAGS

flags.DEFINE_string("image_dir", None, "Folder: one subfolder of images per "
                    "class.")
flags.DEFINE_string("output_dir", None, "Folder for the records and "
                    "labels.txt (created if needed).")
flags.DEFINE_integer("num_shards", 1, "Number of record files per split.")
flags.DEFINE_string("split", "train", "Split name used in the file names.")
flags.DEFINE_integer("seed", 0, "Seed of the shuffle across shards.")
flags.DEFINE_bool("shuffle", True, "Shuffle the images across shards.")
flags.DEFINE_bool("overwrite", False, "Replace the files of a split a "
                  "finished conversion wrote before (a failed one leaves "
                  "none).")
flags.DEFINE_float("validation_percentage", 0.0, "Hold out this percentage "
                   "of each class (e.g. 10) as the eval split, which eval.py "
                   "reads by default.")
flags.DEFINE_string("validation_split", "eval", "The held-out split.")
flags.mark_flags_as_required(["image_dir", "output_dir"])


def expand(path: str) -> str:
  """`path` with `~` and environment variables expanded."""
  return os.path.expanduser(os.path.expandvars(path))


def main(argv: Sequence[str]) -> None:
  """Converts --image_dir into --output_dir."""
  del argv
  script_logging.configure(FLAGS.verbosity)
  paths = convert.convert_image_folder(
      expand(FLAGS.image_dir), expand(FLAGS.output_dir), FLAGS.split,
      FLAGS.num_shards, shuffle=FLAGS.shuffle, seed=FLAGS.seed,
      overwrite=FLAGS.overwrite,
      validation_percentage=FLAGS.validation_percentage,
      validation_split=FLAGS.validation_split)
  logging.info("Done: %d shard(s) in %s; next: python train.py "
               "--dataset_name=tfrecord --dataset_dir=%s --image_size=...",
               len(paths), FLAGS.output_dir, FLAGS.output_dir)


if __name__ == "__main__":
  entry_point.run(main, __doc__)
