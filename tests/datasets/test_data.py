"""Tests of estimator_multigpu.data, run in graph mode like the Estimator.

Images are written with small pure-Python PNG/BMP encoders, independent of
the TF code under test.
"""

import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import tensorflow as tf

import datasets
from datasets import convert
from datasets import digits

tf1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# Created in this (unsorted) order; labels must follow the sorted names.
CLASS_NAMES = ('zebra', 'ant', 'cow')
IMAGES_PER_CLASS = 4
HEIGHT, WIDTH = 6, 5


def encode_png(array: np.ndarray) -> bytes:
  """Encodes a uint8 [H, W, C] array (C in 1, 3, 4) as PNG, in pure Python."""
  height, width, channels = array.shape
  color_type = {1: 0, 3: 2, 4: 6}[channels]
  rows = b''.join(b'\x00' + array[y].tobytes() for y in range(height))

  def chunk(tag, data):
    crc = zlib.crc32(tag + data) & 0xffffffff
    return struct.pack('>I', len(data)) + tag + data + struct.pack('>I', crc)

  header = struct.pack('>IIBBBBB', width, height, 8, color_type, 0, 0, 0)
  return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) +
          chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b''))


def encode_bmp(array: np.ndarray) -> bytes:
  """Encodes a uint8 [H, W, 3] RGB array as a 24-bit BMP."""
  height, width, _ = array.shape
  pad = (4 - (width * 3) % 4) % 4
  rows = b''.join(array[y, :, ::-1].tobytes() + b'\x00' * pad
                  for y in reversed(range(height)))
  info = struct.pack('<IiiHHIIiiII', 40, width, height, 1, 24, 0, len(rows),
                     2835, 2835, 0, 0)
  head = struct.pack('<2sIHHI', b'BM', 14 + 40 + len(rows), 0, 0, 54)
  return head + info + rows


def random_image(rng: np.random.RandomState, channels: int = 3,
                 height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
  return rng.randint(0, 256, size=(height, width, channels), dtype=np.uint8)


@pytest.fixture
def image_folder(tmp_path):
  """A folder of random RGB PNGs, one subfolder per class.

  Returns:
    `(image_dir, originals)`: originals is a list of (label, uint8 image).
  """
  rng = np.random.RandomState(42)
  image_dir = tmp_path / 'images'
  originals = []
  for name in CLASS_NAMES:
    os.makedirs(image_dir / name)
    (image_dir / name / 'notes.txt').write_text('not an image')
    for i in range(IMAGES_PER_CLASS):
      image = random_image(rng)
      (image_dir / name / f'img{i}.png').write_bytes(encode_png(image))
      originals.append((sorted(CLASS_NAMES).index(name), image))
  return str(image_dir), originals


def collect(make_dataset, max_batches=None, one_shot=True):
  """Builds a dataset in a fresh graph and returns its batches as numpy."""
  with tf.Graph().as_default():
    dataset = make_dataset()
    if one_shot:
      iterator = tf1.data.make_one_shot_iterator(dataset)
    else:
      iterator = tf1.data.make_initializable_iterator(dataset)
    next_batch = iterator.get_next()
    with tf1.Session() as sess:
      if not one_shot:
        sess.run(iterator.initializer)
      return _run(sess, next_batch, max_batches)


def _run(sess, next_batch, max_batches):
  batches = []
  while max_batches is None or len(batches) < max_batches:
    try:
      batches.append(sess.run(next_batch))
    except tf.errors.OutOfRangeError:
      break
  return batches


def check_batches(batches, shape, classes):
  """Each batch: float32 images of `shape` in [0, 1], int32 labels in range."""
  assert batches
  for images, labels in batches:
    assert images.dtype == np.float32 and labels.dtype == np.int32
    assert images.shape[1:] == shape and labels.shape == images.shape[:1]
    assert 0.0 <= images.min() and images.max() <= 1.0
    assert 0 <= labels.min() and labels.max() < classes


def concat(batches):
  return (np.concatenate([b[0] for b in batches]),
          np.concatenate([b[1] for b in batches]))


def convert_folder(image_folder, tmp_path, num_shards=3):
  image_dir, originals = image_folder
  out_dir = str(tmp_path / 'records')
  paths = convert.convert_image_folder(image_dir, out_dir, 'train', num_shards)
  return out_dir, paths, originals


# ----------------------------------------------------------------- factory


def test_dataset_names_and_metadata():
  assert datasets.DATASET_NAMES == ('digits', 'synthetic', 'tfrecord')
  assert datasets.num_classes('digits') == 10
  assert datasets.num_classes('synthetic') == 1000
  assert datasets.default_image_size('digits') == 8
  assert datasets.default_image_size('tfrecord') is None


def test_unknown_dataset_names_it_and_lists_valid_names():
  with pytest.raises(ValueError) as info:
    datasets.get_dataset('mnist', 'train', 8)
  assert str(info.value) == (
      "Unknown dataset name 'mnist'; valid names are 'digits', 'synthetic', "
      "'tfrecord'.")
  with pytest.raises(ValueError, match="'mnist'"):
    datasets.num_classes('mnist')


@pytest.mark.parametrize('batch_size', [0, -3, 2.5, True, None])
def test_bad_batch_size(batch_size):
  with pytest.raises(ValueError, match=r'batch_size must be an integer >= 1, '
                     rf'got {batch_size!r}'):
    datasets.get_dataset('digits', 'eval', batch_size)


@pytest.mark.parametrize('image_size', [0, -8, (8,), (8, 0), 'big', 2.0])
def test_bad_image_size(image_size):
  with pytest.raises(ValueError, match='image_size must be a positive int or '
                     r'a \(height, width\) pair'):
    datasets.get_dataset('synthetic', 'eval', 4, image_size=image_size)


def test_bad_split_names():
  with pytest.raises(ValueError, match="Unknown split 'test' for dataset "
                     "'digits'; expected one of 'train', 'eval'"):
    datasets.get_dataset('digits', 'test', 8)
  for split in ('train-1', '../train', '*'):
    with pytest.raises(ValueError, match='Bad split name'):
      datasets.get_dataset('tfrecord', split, 8, image_size=4, data_dir='/tmp')


def test_drop_remainder_is_refused_for_eval():
  with pytest.raises(ValueError, match='only allowed for the .train. split'):
    datasets.get_dataset('digits', 'eval', 8, drop_remainder=True)


@pytest.mark.parametrize('name,kwargs', [('digits', {}),
                                         ('synthetic', {'image_size': 6})])
def test_train_batch_dimension_is_static_eval_is_not(name, kwargs):
  with tf.Graph().as_default():
    train = datasets.get_dataset(name, 'train', 16, **kwargs)
    held_out = datasets.get_dataset(name, 'eval', 16, **kwargs)
  assert train.element_spec[0].shape[0] == 16
  assert train.element_spec[1].shape.as_list() == [16]
  assert held_out.element_spec[0].shape[0] is None
  assert held_out.element_spec[0].dtype == tf.float32
  assert held_out.element_spec[1].dtype == tf.int32


def test_make_input_fn_builds_in_the_callers_graph():
  input_fn = datasets.make_input_fn('digits', 'eval', 100)
  with tf.Graph().as_default() as graph:
    dataset = input_fn()
    assert isinstance(dataset, tf.data.Dataset)
    assert tf1.get_default_graph() is graph
  with pytest.raises(ValueError, match='batch_size'):
    datasets.make_input_fn('digits', 'eval', 0)


def test_pipelines_run_no_autotune_thread(image_folder, tmp_path):
  """tf.data's autotune thread holds a session's close for up to its
  optimization period (measured: train.py on digits, 0 to 12 s between the
  final checkpoint and "Training done" in a 35 s run, in 3 of 11 runs; 0.01 s
  in 7 of 7 without it): every pipeline here sets fixed parallelism."""
  out_dir, _, _ = convert_folder(image_folder, tmp_path, 1)
  made = [datasets.get_dataset('digits', 'train', 8),  # eagerly: options()
          datasets.get_dataset('synthetic', 'eval', 8, image_size=6),  # are
          datasets.get_dataset('tfrecord', 'train', 5, image_size=9,  # read.
                               data_dir=out_dir)]
  assert [dataset.options().autotune.enabled for dataset in made] == [
      False] * 3


# ------------------------------------------------------------------ digits


def test_digits_split_is_disjoint_stratified_and_complete():
  train, held_out = digits.split_indices('train'), digits.split_indices('eval')
  assert (len(train), len(held_out)) == (1437, 360)
  assert not set(train) & set(held_out)
  assert len(set(train) | set(held_out)) == 1797
  for split in digits.SPLITS:
    images, labels = digits.load_split(split)
    assert images.shape == (digits.SPLIT_SIZES[split], 8, 8, 1)
    assert set(labels) == set(range(10))


def test_digits_train_batches():
  make = lambda: datasets.get_dataset('digits', 'train', 64, seed=1)
  batches = collect(make, max_batches=25)
  check_batches(batches, (8, 8, 1), 10)
  assert len(batches) == 25  # Repeats past one epoch (22 full batches).
  assert all(len(labels) == 64 for _, labels in batches)
  assert concat(batches)[0].max() == 1.0  # Scaled by 16, not 255.
  first_labels = concat(batches)[1]
  np.testing.assert_array_equal(concat(collect(make, 25))[1], first_labels)
  _, train_labels = digits.load_split('train')
  assert not np.array_equal(first_labels[:64], train_labels[:64])  # Shuffled.


def test_digits_eval_is_complete_deterministic_and_keeps_last_batch():
  make = lambda: datasets.get_dataset('digits', 'eval', 64)
  first, second = collect(make), collect(make, one_shot=False)
  assert [len(labels) for _, labels in first] == [64] * 5 + [40]
  check_batches(first, (8, 8, 1), 10)
  for (a_img, a_lab), (b_img, b_lab) in zip(first, second):
    np.testing.assert_array_equal(a_img, b_img)
    np.testing.assert_array_equal(a_lab, b_lab)
  images, labels = digits.load_split('eval')
  np.testing.assert_array_equal(concat(first)[1], labels)
  np.testing.assert_allclose(concat(first)[0], images / 16.0)


def test_digits_resized():
  batches = collect(lambda: datasets.get_dataset('digits', 'eval', 50,
                                             image_size=(16, 12)), 2)
  check_batches(batches, (16, 12, 1), 10)


# --------------------------------------------------------------- synthetic


def test_synthetic_shapes_and_labels():
  make = lambda: datasets.get_dataset('synthetic', 'train', 16, image_size=(20, 24),
                                  channels=4, num_classes=7)
  batches = collect(make, max_batches=3)
  check_batches(batches, (20, 24, 4), 7)
  assert len(np.unique(concat(batches)[1])) > 1
  short_epochs = collect(lambda: datasets.get_dataset(
      'synthetic', 'train', 16, image_size=2, num_examples=20), max_batches=5)
  assert [len(labels) for _, labels in short_epochs] == [16] * 5  # Repeats.
  tiny = collect(lambda: datasets.get_dataset(
      'synthetic', 'eval', 8, image_size=2, num_examples=5))
  assert [len(labels) for _, labels in tiny] == [5]


def test_synthetic_eval_is_finite_seeded_and_keeps_last_batch():
  make = lambda: datasets.get_dataset('synthetic', 'eval', 8, image_size=4,
                                  num_classes=3, num_examples=20, seed=5)
  first, second = collect(make), collect(make)
  assert [len(labels) for _, labels in first] == [8, 8, 4]
  check_batches(first, (4, 4, 3), 3)
  np.testing.assert_array_equal(concat(first)[0], concat(second)[0])
  other = collect(lambda: datasets.get_dataset(
      'synthetic', 'eval', 8, image_size=4, num_examples=20, seed=6))
  assert not np.array_equal(concat(first)[0], concat(other)[0])


# ---------------------------------------------------------------- tfrecord


def test_tfrecord_round_trip(image_folder, tmp_path):
  out_dir, paths, originals = convert_folder(image_folder, tmp_path, 3)
  assert [os.path.basename(p) for p in paths] == [
      f'train-0000{i}-of-00003.tfrecord' for i in range(3)]
  with open(os.path.join(out_dir, 'labels.txt')) as f:
    assert f.read() == '0:ant\n1:cow\n2:zebra\n'
  batches = collect(lambda: datasets.get_dataset(
      'tfrecord', 'train', 5, image_size=(HEIGHT, WIDTH),
      data_dir=out_dir, shuffle=False, repeat=False, drop_remainder=False))
  check_batches(batches, (HEIGHT, WIDTH, 3), 3)
  images, labels = concat(batches)
  got = sorted((int(l), np.round(i * 255).astype(np.uint8).tobytes())
               for i, l in zip(images, labels))
  assert got == sorted((l, i.tobytes()) for l, i in originals)


def test_tfrecord_train_shuffles_and_repeats(image_folder, tmp_path):
  out_dir, _, _ = convert_folder(image_folder, tmp_path, 2)
  assert datasets.num_classes('tfrecord', out_dir) == 3
  make = lambda: datasets.get_dataset('tfrecord', 'train', 5, image_size=9,
                                  data_dir=out_dir, channels=1, seed=3)
  batches = collect(make, max_batches=4)
  check_batches(batches, (9, 9, 1), 3)
  assert all(len(labels) == 5 for _, labels in batches)


def test_tfrecord_label_checked_against_num_classes(image_folder, tmp_path):
  out_dir, _, _ = convert_folder(image_folder, tmp_path, 1)
  make = lambda: datasets.get_dataset('tfrecord', 'train', 12, image_size=4,
                                  data_dir=out_dir, num_classes=2, repeat=False)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'label \d+ of record \d+ in .*train-00000-of-'
                     r'00001.tfrecord is outside \[0, 2\)'):
    collect(make)


def test_tfrecord_empty_data_dir_message(tmp_path):
  empty = str(tmp_path)
  with pytest.raises(FileNotFoundError) as info:
    datasets.get_dataset('tfrecord', 'eval', 8, image_size=32, data_dir=empty)
  pattern = os.path.join(empty, 'eval-*-of-*')
  assert str(info.value).startswith(
      f"No TFRecord files for split 'eval' in data_dir {empty!r}: nothing "
      f'matches {pattern!r}.')
  with pytest.raises(FileNotFoundError, match='is not a directory'):
    datasets.get_dataset('tfrecord', 'eval', 8, image_size=32,
                     data_dir=os.path.join(empty, 'missing'))
  with pytest.raises(ValueError, match='needs data_dir'):
    datasets.get_dataset('tfrecord', 'eval', 8, image_size=32)


def test_tfrecord_needs_image_size(tmp_path):
  with pytest.raises(ValueError, match="'tfrecord' needs image_size"):
    datasets.get_dataset('tfrecord', 'eval', 8, data_dir=str(tmp_path))
  with pytest.raises(ValueError, match='reads labels.txt'):
    datasets.num_classes('tfrecord', str(tmp_path))


# --------------------------------------------------------------- converter


def _records(path):
  return [tf.train.Example.FromString(r)
          for r in tf1.io.tf_record_iterator(path)]


def test_converter_keeps_jpeg_and_reencodes_bmp(tmp_path):
  rng = np.random.RandomState(0)
  bmp_image = random_image(rng, height=3, width=7)
  os.makedirs(tmp_path / 'in' / 'a')
  (tmp_path / 'in' / 'a' / 'x.bmp').write_bytes(encode_bmp(bmp_image))
  with tf.Graph().as_default(), tf1.Session() as sess:
    jpeg = sess.run(tf.io.encode_jpeg(random_image(rng)))
  (tmp_path / 'in' / 'a' / 'y.JPG').write_bytes(jpeg)
  [path] = convert.convert_image_folder(str(tmp_path / 'in'),
                                        str(tmp_path / 'out'), 'eval',
                                        shuffle=False, min_classes=1)
  bmp_rec, jpeg_rec = [e.features.feature for e in _records(path)]
  assert bmp_rec['image/format'].bytes_list.value == [b'png']
  assert bmp_rec['image/height'].int64_list.value == [3]
  assert bmp_rec['image/width'].int64_list.value == [7]
  assert jpeg_rec['image/format'].bytes_list.value == [b'jpeg']
  assert jpeg_rec['image/encoded'].bytes_list.value == [jpeg]
  [(images, labels)] = collect(lambda: datasets.get_dataset(
      'tfrecord', 'eval', 4, image_size=(3, 7), data_dir=str(tmp_path / 'out')))
  assert list(labels) == [0, 0] and images.shape == (2, 3, 7, 3)
  np.testing.assert_array_equal(np.round(images[0] * 255), bmp_image)


def test_converter_errors(image_folder, tmp_path):
  image_dir, _ = image_folder
  out_dir = str(tmp_path / 'out')
  with pytest.raises(ValueError, match='num_shards=13 exceeds the 12 images'):
    convert.convert_image_folder(image_dir, out_dir, num_shards=13)
  with pytest.raises(ValueError, match='No image files'):
    convert.convert_image_folder(str(tmp_path), out_dir)  # Only 'images/'.
  os.makedirs(tmp_path / 'empty')
  with pytest.raises(ValueError, match='has no subfolders'):
    convert.convert_image_folder(str(tmp_path / 'empty'), out_dir)
  convert.convert_image_folder(image_dir, out_dir, num_shards=2)
  with pytest.raises(FileExistsError, match='already match'):
    convert.convert_image_folder(image_dir, out_dir, num_shards=3)
  convert.convert_image_folder(image_dir, out_dir, num_shards=3, overwrite=True)
  assert len(datasets.find_shards(out_dir, 'train')) == 3
  (tmp_path / 'images' / 'ant' / 'bad.png').write_bytes(b'\x89PNG\r\n\x1a\nxx')
  # skipped and named (tests/datasets/test_converter.py): the 12 written.
  paths = convert.convert_image_folder(image_dir, str(tmp_path / 'out2'))
  assert sum(1 for _ in tf1.io.tf_record_iterator(paths[0])) == 12


def run_converter(*args):
  return subprocess.run([sys.executable, 'convert.py', *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=120,
                        check=False)


@pytest.mark.slow
def test_converter_command_line(image_folder, tmp_path):
  # As quiet as the scripts: its own lines only (converting, one per shard,
  # the files skipped, done), no TensorFlow start-up, INFO or deprecation
  # lines.
  image_dir, _ = image_folder
  out_dir = str(tmp_path / 'cli')
  argv = (f'--image_dir={image_dir}', f'--output_dir={out_dir}',
          '--num_shards=2', '--split=validation')
  result = run_converter(*argv)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stderr.splitlines()
  assert len(lines) == 5, lines  # converting, 2 x wrote, skipped, done.
  assert 'Converting 12 images of 3 classes' in lines[0]
  assert 'Skipped 3 of 15 files: 3 in other formats (.txt 3;' in lines[3]
  assert 'tensorflow' not in '\n'.join(lines[:3] + lines[4:]).lower()
  assert sorted(os.listdir(out_dir)) == [
      'labels.txt', 'splits.json', 'validation-00000-of-00002.tfrecord',
      'validation-00001-of-00002.tfrecord']
  assert datasets.read_label_file(out_dir) == {0: 'ant', 1: 'cow', 2: 'zebra'}
  again = run_converter(*argv)  # the same folder again: one line, status 2.
  assert again.returncode == 2
  assert again.stderr.splitlines() == [
      f"convert.py: error: 2 file(s) already match '{out_dir}/validation-*-"
      "of-*'; they would be read together with the new ones. Pass "
      'overwrite=True (--overwrite) to replace them, or choose another '
      'output_dir (--output_dir).']
  moved = subprocess.run([sys.executable, '-m', 'datasets.convert'], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
  assert moved.returncode == 2
  assert moved.stderr.splitlines()[-1].startswith(
      'datasets.convert: error: the converter is a script now')
