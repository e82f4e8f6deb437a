"""Errors in record files that name the file, and the record where known.

TensorFlow's own errors for bad records say neither: a truncated or
corrupt file is `DataLossError: ... corrupted record at 12`, an undecodable
image `Unknown image file format`, an out-of-range label an assertion on a
nameless tensor. Here:

* `check_shards` refuses a zero-byte record file before any step (it holds
  no example: a split of such files "trains" on nothing).
* `check_feature_keys` reads the first record of each file before any step
  and refuses one without the features the reader parses, naming the file,
  the keys found and the keys expected (TensorFlow's own error, at the
  first step, names no file: `Feature: image/class/label (data type:
  int64) is required but could not be found`).
* `with_file_and_index` tags every serialized record with its file and its
  index in that file, so that the in-graph checks `check_label` and
  `check_image_bytes` fail with e.g. `label 7 of record 3 in
  .../train-00000-of-00001.tfrecord is outside [0, 5)`.
* `find_damaged_record` reads the record files this process opened (they
  are remembered when the pipeline is built) and returns the first that
  cannot be read, with the record index: what a `DataLossError` means.
* `find_undecodable_image` decodes their images one by one and names the
  first that fails: what a decoder's error ("Invalid PNG", "Invalid JPEG
  data") means for an image whose first bytes looked right.
"""

import os
from typing import Dict, List, Optional, Sequence, Tuple

from google.protobuf import message as protobuf_message
import tensorflow as tf

# The first two bytes of the formats `tf.io.decode_image` reads.
IMAGE_MAGIC = (b'\x89P', b'\xff\xd8', b'GI', b'BM')
IMAGE_KEY = 'image/encoded'  # tfrecord.IMAGE_KEY (which imports this).
# The lines of an op error's message that are TensorFlow's graph traceback.
TF_NOISE = ('Graph execution error', 'Detected at node', 'File ', 'Node:',
            '[[', 'Original stack trace', 'Instructions for updating')
_opened: List[str] = []  # record files of the pipelines built here.


def check_shards(files: Sequence[str]) -> None:
  """Raises for a record file of zero bytes.

  Raises:
    ValueError: naming the empty file.
  """
  for path in files:
    if tf.io.gfile.stat(path).length == 0:
      raise ValueError(
          f'Record file {path} is empty (0 bytes), so it holds no example; '
          'expected records written by python convert.py. Rewrite '
          'the split (python convert.py --overwrite) or remove the file.')


def first_record(path: str) -> Optional[bytes]:
  """The first serialized record of a file (None: none, or unreadable: the
  pipeline's own checks name that)."""
  try:
    return next(iter(tf.compat.v1.io.tf_record_iterator(path)), None)
  except tf.errors.OpError:
    return None


def _described(kinds: Dict[str, str], separator: str = ' and ') -> str:
  """E.g. `'image/encoded' (bytes) and 'image/class/label' (int64)`."""
  return separator.join(f'{key!r} ({kind.replace("_list", "")})'
                        for key, kind in sorted(kinds.items()))


def _feature_kinds(record: bytes) -> Dict[str, str]:
  """Feature key -> kind (`'bytes_list'`, ...) of a serialized
  `tf.train.Example` ({}: none, or not an Example)."""
  try:
    found = tf.train.Example.FromString(record).features.feature
  except protobuf_message.DecodeError:
    return {}
  return {key: found[key].WhichOneof('kind') or 'empty' for key in found}


def check_feature_keys(files: Sequence[str], expected: Dict[str, str]
                       ) -> None:
  """Raises for a record file whose first record is not a
  `tf.train.Example` holding the `expected` features.

  Args:
    files: the record files of a split.
    expected: feature key -> its kind (`'bytes_list'`, `'int64_list'`).

  Raises:
    ValueError: naming the file, the keys found and the keys expected.
  """
  for path in files:
    record = first_record(path)
    found = {} if record is None else _feature_kinds(record)
    if record is None or all(found.get(key) == kind
                             for key, kind in expected.items()):
      continue
    raise ValueError(
        f'Record file {path} holds '
        f'{_described(found, ", ") if found else "no features"}, but the '
        f'reader needs {_described(expected)}: the features python '
        "convert.py (and tf-slim's converters) write. Convert the images "
        'again with python convert.py, or rewrite the records with those '
        'keys.')


def remember(files: Sequence[str]) -> None:
  """Notes record files a pipeline reads, for `find_damaged_record`."""
  _opened.extend(path for path in files if path not in _opened)


def opened_files() -> List[str]:
  """The record files remembered, that still exist."""
  return [path for path in _opened if tf.io.gfile.exists(path)]


def forget() -> None:
  """Forgets the files remembered (a new run in the same process)."""
  _opened.clear()


def with_file_and_index(path: tf.Tensor) -> tf.data.Dataset:
  """The records of one file as `(path, index in the file, serialized)`."""
  records = tf.data.TFRecordDataset(path).enumerate()
  return records.map(lambda index, record: (path, index, record))


def _where(path: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
  return tf.strings.join(['record ', tf.strings.as_string(index), ' in ',
                          path])


def _checked(value: tf.Tensor, valid: tf.Tensor, message) -> tf.Tensor:
  """`value` once `valid` holds; else an error `message()` (built only then:
  string ops on every record halved the records read per second)."""
  def fail():
    with tf.control_dependencies([tf.debugging.Assert(False, [message()])]):
      return tf.constant(False)
  check = tf.cond(valid, lambda: tf.constant(True), fail)
  with tf.control_dependencies([check]):
    return tf.identity(value)


def check_label(label: tf.Tensor, num_classes: int, path: tf.Tensor,
                index: tf.Tensor, labels_offset: int = 0) -> tf.Tensor:
  """`label`, after an in-graph check that 0 <= label < num_classes.

  `label` is the stored label minus `labels_offset` (tf-slim's flag).
  """
  offset = (f' minus --labels_offset={labels_offset}' if labels_offset
            else '')
  message = lambda: tf.strings.join([
      'label ', tf.strings.as_string(label + labels_offset), offset, ' of ',
      _where(path, index), f' is outside [0, {num_classes}): the records '
      'have more classes than --num_classes (or a label below the offset); '
      'give --num_classes larger than the largest label, or fix the '
      'records'])
  valid = tf.cast(label, tf.uint32) < num_classes  # negatives wrap: large.
  return _checked(label, valid, message)


def check_image_bytes(encoded: tf.Tensor, path: tf.Tensor,
                      index: tf.Tensor) -> tf.Tensor:
  """`encoded`, after an in-graph check that it starts like an image."""
  known = tf.reduce_any(tf.equal(tf.strings.substr(encoded, 0, 2),
                                 IMAGE_MAGIC))
  message = lambda: tf.strings.join([
      'the image of ', _where(path, index), ' cannot be decoded: it is not '
      'PNG, JPEG, GIF or BMP; rewrite the records with python convert.py'])
  return _checked(encoded, known, message)


def first_unreadable(path: str) -> Optional[Tuple[int, str]]:
  """(index of the first unreadable record, TF's reason), or None."""
  index = 0
  try:
    for _ in tf.compat.v1.io.tf_record_iterator(path):
      index += 1
  except tf.errors.OpError as error:
    return index, error.message.strip().splitlines()[-1]
  return None


def _first_problem(files: Optional[Sequence[str]], first_bad, describe
                   ) -> Optional[str]:
  """`describe(path, index, reason)` of the first file where `first_bad`
  finds a problem (`files`: default those the pipelines here opened)."""
  for path in opened_files() if files is None else files:
    found = first_bad(path)
    if found is not None:
      return describe(path, *found)
  return None


def find_damaged_record(files: Optional[Sequence[str]] = None
                        ) -> Optional[str]:
  """Describes the first record file that cannot be read, or None."""
  return _first_problem(files, first_unreadable, lambda path, index, reason: (
      f'Record file {path} is damaged from record {index} on ({reason}): '
      'truncated or corrupt, e.g. by an interrupted copy. Copy or convert '
      'it again (python convert.py), or move '
      f'{os.path.basename(path)} out of the data folder.'))


def op_error_reason(error: tf.errors.OpError) -> str:
  """TensorFlow's own line of an op error, without its graph traceback."""
  lines = [line.strip() for line in error.message.splitlines()]
  reasons = [line for line in lines if line and not line.startswith(TF_NOISE)]
  return reasons[0] if reasons else error.message


def _images(path: str):
  """(index, encoded image) of each record of one file."""
  for index, record in enumerate(tf.compat.v1.io.tf_record_iterator(path)):
    feature = tf.train.Example.FromString(record).features.feature
    yield index, feature[IMAGE_KEY].bytes_list.value[0]


def first_undecodable(path: str) -> Optional[Tuple[int, str]]:
  """(index of the first image TensorFlow cannot decode, its reason)."""
  with tf.Graph().as_default():
    encoded = tf.compat.v1.placeholder(tf.string, [])
    decoded = tf.io.decode_image(encoded, expand_animations=False)
    with tf.compat.v1.Session() as session:
      for index, image in _images(path):
        try:
          session.run(decoded, {encoded: image})
        except tf.errors.InvalidArgumentError as error:
          return index, op_error_reason(error)
  return None


def find_undecodable_image(files: Optional[Sequence[str]] = None
                           ) -> Optional[str]:
  """Describes the first image that cannot be decoded, or None."""
  return _first_problem(files, first_undecodable, lambda path, index, reason: (
      f'the image of record {index} in {path} cannot be decoded ({reason}): '
      'a damaged PNG/JPEG. Rewrite the records with python convert.py, or '
      'remove that image from the source folder.'))
