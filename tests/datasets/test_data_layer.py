"""The data packages' own checks (issue 35): nothing in nets/, datasets/,
preprocessing/ imports cli/; the converter refuses an empty class folder;
records with other features are refused before any step, naming the file,
the keys found and the keys expected."""

import ast
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import datasets
from datasets import convert
from datasets import image_formats
from datasets import record_checks
from datasets import tfrecord

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARD = 'train-00000-of-00001.tfrecord'


def imported_modules(path: pathlib.Path) -> set:
  """The top-level names of every module a file imports (anywhere in it)."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names |= {alias.name.split('.')[0] for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module.split('.')[0])
  return names


@pytest.mark.parametrize('package', ['nets', 'datasets', 'preprocessing'])
def test_the_data_and_model_packages_do_not_import_cli(package):
  files = sorted((ROOT / package).rglob('*.py'))
  assert files
  importing = [str(f.relative_to(ROOT)) for f in files
               if 'cli' in imported_modules(f)]
  assert not importing


# ----------------------------------------------------------- the converter


def png() -> bytes:
  return tf.io.encode_png(np.zeros((4, 4, 3), np.uint8)).numpy()


def test_converter_refuses_a_class_folder_without_images(tmp_path):
  for name in ('ant', 'cow'):
    os.makedirs(tmp_path / 'in' / name)
  (tmp_path / 'in' / 'ant' / 'a.png').write_bytes(png())
  (tmp_path / 'in' / 'cow' / 'notes.txt').write_text('no image here')
  os.makedirs(tmp_path / 'in' / 'dog')
  with pytest.raises(ValueError) as error:
    convert.convert_image_folder(str(tmp_path / 'in'), str(tmp_path / 'out'))
  decodable = ', '.join(sorted(  # WebP too from TF 2.21 (probed).
      f.upper() for f in image_formats.decodable_formats()))
  assert str(error.value).startswith(
      f"class folder(s) {tmp_path}/in/cow, {tmp_path}/in/dog hold no image "
      f'file (TensorFlow {tf.__version__} decodes {decodable}; found '
      'instead: .txt 1)')
  assert 'Add its images, or move the folder out of image_dir' in str(
      error.value)
  assert not os.path.exists(tmp_path / 'out')  # nothing written.


# ------------------------------------------------------- records' features


def write(folder: pathlib.Path, examples) -> str:
  os.makedirs(folder, exist_ok=True)
  tfrecord.write_label_file(['a', 'b'], str(folder))
  path = str(folder / SHARD)
  with tf.io.TFRecordWriter(path) as writer:
    for example in examples:
      writer.write(example if isinstance(example, bytes)
                   else example.SerializeToString())
  return path


def example(**features) -> tf.train.Example:
  def feature(value):
    if isinstance(value, bytes):
      return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    if isinstance(value, float):
      return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
  return tf.train.Example(features=tf.train.Features(feature={
      key.replace('__', '/'): feature(value)
      for key, value in features.items()}))


def build(folder) -> None:
  with tf.Graph().as_default():
    datasets.get_dataset('tfrecord', 'train', 2, image_size=4,
                         data_dir=str(folder))


EXPECTED = "'image/class/label' (int64) and 'image/encoded' (bytes)"


@pytest.mark.parametrize('features,found', [
    (dict(image__raw=b'x', label=1), "'image/raw' (bytes), 'label' (int64)"),
    (dict(image__encoded=b'x', image__class__label=1.0),
     "'image/class/label' (float), 'image/encoded' (bytes)"),
])
def test_records_with_other_features_are_refused_naming_them(
    tmp_path, features, found):
  path = write(tmp_path, [example(**features)])
  with pytest.raises(ValueError) as error:
    build(tmp_path)
  assert str(error.value).startswith(
      f'Record file {path} holds {found}, but the reader needs {EXPECTED}:')
  assert 'python convert.py' in str(error.value)


def test_records_that_are_not_examples_are_refused(tmp_path):
  path = write(tmp_path, [b'\xff\x00 not a protocol buffer'])
  with pytest.raises(ValueError, match=(
      f'Record file {path} holds no features, but the reader needs')):
    build(tmp_path)


def test_every_shard_is_checked_and_good_records_pass(tmp_path):
  good = example(image__encoded=png(), image__class__label=1,
                 image__format=b'png')
  write(tmp_path, [good])
  build(tmp_path)  # the converter's features (plus others): accepted.
  bad = str(tmp_path / 'train-00001-of-00002.tfrecord')
  with tf.io.TFRecordWriter(bad) as writer:
    writer.write(example(image=b'x').SerializeToString())
  with pytest.raises(ValueError, match=f'Record file {bad} holds'):
    record_checks.check_feature_keys(
        [str(tmp_path / SHARD), bad],
        {tfrecord.IMAGE_KEY: 'bytes_list', tfrecord.LABEL_KEY: 'int64_list'})
