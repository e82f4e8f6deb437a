"""Issue 44, "a newcomer's own images": the converter's command line is all
or nothing, and train.py and eval.py refuse a split that is not whole, in
one line naming what is missing. The converter's own rows are in
tests/datasets/test_converter.py; here, the scripts."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from test_mistakes import ROOT
from test_mistakes import run_in_process
from test_mistakes import the_error_line

pytestmark = pytest.mark.usefixtures("parsed_flags")
BAD_PNG = b"\x89PNG\r\n\x1a\n" + b"x" * 20


def png(value: int) -> bytes:
  return tf.io.encode_png(np.full((8, 8, 3), value, np.uint8)).numpy()


def image_folder(root, bad_class: bool) -> str:
  """Two classes of 4 PNGs; with `bad_class`, b holds one broken PNG only."""
  for name in ("a", "b"):
    os.makedirs(root / "in" / name, exist_ok=True)
    for i in range(4):
      if name == "a" or not bad_class:
        (root / "in" / name / f"{i}.png").write_bytes(png(i + 10 * len(name)))
  if bad_class:
    (root / "in" / "b" / "broken.png").write_bytes(BAD_PNG)
  return str(root / "in")


def convert(*args) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "convert.py", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300,
                        check=False)


@pytest.mark.slow
def test_a_failed_conversion_leaves_nothing_and_reruns_without_overwrite(
    tmp_path):
  image_dir = image_folder(tmp_path, bad_class=True)
  out = tmp_path / "records"
  argv = (f"--image_dir={image_dir}", f"--output_dir={out}", "--num_shards=2")
  failed = convert(*argv)
  assert failed.returncode == 2
  line = the_error_line(failed.stderr, "convert")
  assert line.startswith(
      f"convert.py: error: class folder(s) b of {image_dir} hold no image "
      "that decodes (1 unreadable, e.g. b/broken.png: ")
  assert os.listdir(out) == []  # no labels.txt, no half-written shard.
  os.remove(os.path.join(image_dir, "b", "broken.png"))
  image_folder(tmp_path, bad_class=False)
  again = convert(*argv)
  assert again.returncode == 0, again.stderr[-2000:]
  assert sorted(os.listdir(out)) == [
      "labels.txt", "splits.json", "train-00000-of-00002.tfrecord",
      "train-00001-of-00002.tfrecord"]


def converted(tmp_path) -> str:
  """Records of 8 images: train (2 shards) and eval (2 shards)."""
  from datasets import convert as converter  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / "data")
  converter.convert_image_folder(image_folder(tmp_path, bad_class=False), out,
                                 num_shards=2, validation_percentage=50)
  return out


def test_train_and_eval_refuse_a_split_with_a_missing_shard(tmp_path, capsys):
  data = converted(tmp_path)
  model = str(tmp_path / "model")
  flags = [f"--dataset_dir={data}", "--dataset_name=tfrecord",
           "--image_size=8", "--batch_size=2", f"--model_dir={model}"]
  assert run_in_process("train", [*flags, "--max_steps=1"]) == 0
  os.remove(os.path.join(data, "eval-00001-of-00002.tfrecord"))
  os.remove(os.path.join(data, "train-00000-of-00002.tfrecord"))
  capsys.readouterr()
  assert run_in_process("train", [*flags, "--max_steps=2"]) == 2
  assert the_error_line(capsys.readouterr().err, "train") == (
      f"train.py: error: Split 'train' in {data} is incomplete: 1 of its 2 "
      "shards missing (train-00000-of-00002.tfrecord); reading the rest "
      "would train or evaluate on part of the data. Copy the missing files, "
      "or convert the images again (python convert.py).")
  assert run_in_process("eval", [f"--model_dir={model}", "--once"]) == 2
  assert the_error_line(capsys.readouterr().err, "eval") == (
      f"eval.py: error: Split 'eval' in {data} is incomplete: 1 of its 2 "
      "shards missing (eval-00001-of-00002.tfrecord); reading the rest "
      "would train or evaluate on part of the data. Copy the missing files, "
      "or convert the images again (python convert.py).")


def test_eval_counts_the_recorded_records_so_it_reads_no_further(tmp_path):
  import eval as eval_script  # pylint: disable=g-import-not-at-top
  data = converted(tmp_path)  # 4 held out: 2 of each class.
  assert eval_script.num_eval_batches("tfrecord", "eval", 3, data) == 2
  assert eval_script.num_eval_batches("tfrecord", "train", 4, data) == 1
  os.remove(os.path.join(data, "splits.json"))
  assert eval_script.num_eval_batches("tfrecord", "eval", 3, data) is None
  assert eval_script.num_eval_batches("digits", "eval", 100) == 4  # 360.
