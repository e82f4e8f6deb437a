"""The converter of issue 44: all or nothing (a failure leaves the output
folder as it was, a rerun needs no --overwrite), every format this
TensorFlow decodes, EXIF orientation applied, skipped files counted and
named; and the readers' check that a split is whole.

Images come from the pure-Python encoders of test_data.py; expected pixels
are numpy turns of the originals, written out by hand per orientation.
"""

import base64
import json
import os
import re
import struct

import numpy as np
import pytest
import tensorflow as tf
from test_data import collect
from test_data import encode_bmp
from test_data import encode_png

import datasets
from datasets import convert
from datasets import exif
from datasets import image_formats
from datasets import split_record

tf1 = tf.compat.v1
WEBP_1X1 = base64.b64decode(  # a lossless 1x1 WebP, RGBA.
    'UklGRhoAAABXRUJQVlA4TA0AAAAvAAAAEAcQERGIiP4HAA==')
BAD_PNG = b'\x89PNG\r\n\x1a\n' + b'x' * 20  # looks like PNG, does not decode.


def image(value: int, height: int = 4, width: int = 6) -> np.ndarray:
  """A [H, W, 3] uint8 image whose pixels all differ (so turns show)."""
  ramp = np.arange(height * width * 3, dtype=np.int64).reshape(
      height, width, 3)
  return ((ramp * 7 + value) % 256).astype(np.uint8)


def folder(root, classes) -> str:
  """`root/in/<class>/<name>` from {class: {name: bytes}}."""
  for name, files in classes.items():
    os.makedirs(root / 'in' / name, exist_ok=True)
    for file_name, data in files.items():
      (root / 'in' / name / file_name).write_bytes(data)
  return str(root / 'in')


def pngs(count: int, start: int = 0) -> dict:
  return {f'{i}.png': encode_png(image(start + i)) for i in range(count)}


def stored(path: str) -> list:
  """(format, height, width, label) of each record of a shard."""
  rows = []
  for record in tf1.io.tf_record_iterator(path):
    feature = tf.train.Example.FromString(record).features.feature
    rows.append((feature['image/format'].bytes_list.value[0],
                 feature['image/height'].int64_list.value[0],
                 feature['image/width'].int64_list.value[0],
                 feature['image/class/label'].int64_list.value[0]))
  return rows


# ------------------------------------------------------------ all or nothing


def test_a_failure_leaves_nothing_and_the_rerun_needs_no_overwrite(tmp_path):
  # class 'b' holds only an image that does not decode: found after 'a' and
  # part of 'b' are written, so the run fails late.
  image_dir = folder(tmp_path, {'a': pngs(5), 'b': {'bad.png': BAD_PNG}})
  out = tmp_path / 'out'
  with pytest.raises(ValueError, match=re.escape(
      f'class folder(s) b of {image_dir} hold no image that decodes (1 '
      'unreadable, e.g. b/bad.png: ')) as error:
    convert.convert_image_folder(image_dir, str(out), num_shards=2,
                                 validation_percentage=20)
  assert '\n' not in str(error.value)
  assert os.listdir(out) == []  # no labels.txt, no shard, no temp folder.
  (tmp_path / 'in' / 'b' / 'bad.png').write_bytes(encode_png(image(9)))
  paths = convert.convert_image_folder(image_dir, str(out), num_shards=2)
  assert len(paths) == 2 and sorted(os.listdir(out)) == [
      'labels.txt', 'splits.json', 'train-00000-of-00002.tfrecord',
      'train-00001-of-00002.tfrecord']


def test_an_interrupted_overwrite_keeps_the_old_split(tmp_path, monkeypatch):
  image_dir = folder(tmp_path, {'a': pngs(3), 'b': pngs(3, 10)})
  out = str(tmp_path / 'out')
  convert.convert_image_folder(image_dir, out, num_shards=3)
  before = {name: open(os.path.join(out, name), 'rb').read()
            for name in os.listdir(out)}
  calls = []

  def stop_at_the_fourth_image(*args):
    calls.append(args)
    if len(calls) == 4:
      raise KeyboardInterrupt  # Ctrl-C in the middle of the second shard.
    return serialize(*args)
  serialize = convert._serialize  # pylint: disable=protected-access
  monkeypatch.setattr(convert, '_serialize', stop_at_the_fourth_image)
  with pytest.raises(KeyboardInterrupt):
    convert.convert_image_folder(image_dir, out, num_shards=2, overwrite=True)
  after = {name: open(os.path.join(out, name), 'rb').read()
           for name in os.listdir(out)}
  assert after == before


def test_splits_json_records_each_shards_records_and_bytes(tmp_path):
  image_dir = folder(tmp_path, {'a': pngs(4), 'b': pngs(3, 10)})
  out = str(tmp_path / 'out')
  convert.convert_image_folder(image_dir, out, num_shards=2,
                               validation_percentage=30)
  record = json.load(open(os.path.join(out, 'splits.json')))
  # held out: round(4 * .3) = 1 of a, round(3 * .3) = 1 of b; 5 train.
  assert sorted(record) == ['eval', 'train']
  for split, total in (('train', 5), ('eval', 2)):
    shards = record[split]
    assert [s['file'] for s in shards] == [
        f'{split}-0000{i}-of-00002.tfrecord' for i in range(2)]
    assert sum(s['records'] for s in shards) == total
    for s in shards:
      path = os.path.join(out, s['file'])
      assert s['bytes'] == os.path.getsize(path)
      assert s['records'] == len(stored(path))
  convert.convert_image_folder(image_dir, out, split='more')  # kept beside.
  assert sorted(json.load(open(os.path.join(out, 'splits.json')))) == [
      'eval', 'more', 'train']


# --------------------------------------------- formats and skipped files


def webp_decodes() -> bool:
  return image_formats.WEBP in image_formats.decodable_formats()


def test_the_decodable_formats_are_probed():
  assert image_formats.decodable_formats() >= {'bmp', 'gif', 'jpeg', 'png'}
  with tf.Graph().as_default(), tf1.Session() as session:
    try:
      session.run(tf.io.decode_image(WEBP_1X1))
      decodes = True
    except tf.errors.InvalidArgumentError:
      decodes = False
  assert webp_decodes() == decodes


@pytest.mark.parametrize('header,kind', [
    (b'\x89PNG\r\n\x1a\n' + b'\0' * 8, 'png'), (b'\xff\xd8\xff\xe0' + b'\0' * 12,
                                                'jpeg'),
    (b'GIF89a' + b'\0' * 10, 'gif'), (b'BM' + b'\0' * 14, 'bmp'),
    (WEBP_1X1[:16], 'webp'), (b'II*\x00' + b'\0' * 12, 'tiff'),
    (b'MM\x00*' + b'\0' * 12, 'tiff'),
    (b'\0\0\0\x18ftypheic\0\0\0\0', 'heic'), (b'hello, world!!!!', '')])
def test_formats_are_sniffed_from_the_bytes(header, kind):
  assert image_formats.sniff(header) == kind


def test_skipped_files_are_counted_and_named(tmp_path, caplog):
  jpeg = tf.io.encode_jpeg(image(3)).numpy()
  image_dir = folder(tmp_path, {
      'a': {**pngs(2), 'c.JPEG': jpeg, 'd.bmp': encode_bmp(image(4)),
            'x.tif': b'II*\x00' + b'\0' * 30, 'y.tif': b'MM\x00*' + b'\0' * 30,
            'notes.txt': b'some notes about the cats', '.DS_Store': b'\0' * 40,
            'e.webp': WEBP_1X1},
      'b': {**pngs(2, 10), 'bad.png': BAD_PNG,
            'photo.heic': b'\0\0\0\x18ftypheic' + b'\0' * 20,
            'renamed.txt': encode_png(image(20))}})  # a PNG, whatever its name.
  out = str(tmp_path / 'out')
  caplog.set_level('INFO')
  [path] = convert.convert_image_folder(image_dir, out, shuffle=False)
  webp = webp_decodes()
  rows = stored(path)
  assert [(f, l) for f, _, _, l in rows] == (
      [(b'png', 0)] * 2 + [(b'jpeg', 0), (b'png', 0)] + [(b'png', 0)] * webp +
      [(b'png', 1)] * 3)
  [warning] = [r.getMessage() for r in caplog.records
               if r.levelname == 'WARNING']
  skipped = 6 - webp  # x.tif, y.tif, notes.txt, photo.heic, bad.png (+webp)
  assert warning.startswith(f'Skipped {skipped} of {skipped + len(rows)} '
                            'files: ')
  for part in ('.tif 2', '.txt 1', '.heic 1', 'a/notes.txt',
               '1 unreadable, e.g. b/bad.png: ',
               f'TensorFlow {tf.__version__} decodes BMP, GIF, JPEG, PNG'):
    assert part in warning
  assert ('.webp 1' in warning) == (not webp)
  assert ('WebP from TensorFlow 2.21 on' in warning) == (not webp)
  assert '.DS_Store' not in warning and '\n' not in warning


def test_webp_converts_where_tensorflow_decodes_it(tmp_path):
  if not webp_decodes():
    pytest.skip(f'TensorFlow {tf.__version__} does not decode WebP: the '
                'skip is tested in test_skipped_files_are_counted_and_named')
  image_dir = folder(tmp_path, {'a': {'p.webp': WEBP_1X1}})
  [path] = convert.convert_image_folder(image_dir, str(tmp_path / 'out'),
                                        min_classes=1)
  assert stored(path) == [(b'png', 1, 1, 0)]


def test_one_class_is_refused_naming_it(tmp_path):
  # Issue 54: it converted, and train.py trained a 1-class net to
  # accuracy=1.0000 without a word.
  image_dir = folder(tmp_path, {'cats': pngs(2)})
  with pytest.raises(ValueError, match=re.escape(
      f'image_dir {image_dir} has one class subfolder, cats (2 images): a '
      'classifier needs two or more')):
    convert.convert_image_folder(image_dir, str(tmp_path / 'out'))
  assert not os.path.exists(tmp_path / 'out')


def test_a_class_of_undecodable_formats_only_is_refused(tmp_path):
  image_dir = folder(tmp_path, {'a': pngs(2),
                                'b': {'1.heic': b'\0\0\0\x18ftypheic' * 2,
                                      '2.tif': b'II*\x00' + b'\0' * 20}})
  with pytest.raises(ValueError, match=re.escape(
      f'class folder(s) {image_dir}/b hold no image file (TensorFlow '
      f'{tf.__version__} decodes BMP, GIF, JPEG, PNG')):
    convert.convert_image_folder(image_dir, str(tmp_path / 'out'))
  assert not os.path.exists(tmp_path / 'out')


# ------------------------------------------------------- EXIF orientation


def tiff_block(orientation: int, order: str = '<') -> bytes:
  """A TIFF block whose first directory holds the Orientation tag only."""
  mark = b'II' if order == '<' else b'MM'
  return (mark + struct.pack(order + 'HI', 42, 8) + struct.pack(
      order + 'H', 2) + struct.pack(order + 'HHIHH', 0x010F, 2, 1, 0, 0) +
          struct.pack(order + 'HHIHH', 0x0112, 3, 1, orientation, 0) +
          struct.pack(order + 'I', 0))


def png_with_exif(array: np.ndarray, orientation: int) -> bytes:
  """A PNG with an eXIf chunk before its image data."""
  plain = encode_png(array)
  block = tiff_block(orientation)
  chunk = (struct.pack('>I', len(block)) + b'eXIf' + block + struct.pack(
      '>I', 0))  # CRC unchecked by readers of eXIf here and in TF.
  at = 8 + 25  # signature + IHDR chunk.
  return plain[:at] + chunk + plain[at:]


def jpeg_with_exif(jpeg: bytes, orientation: int, order: str) -> bytes:
  body = b'Exif\x00\x00' + tiff_block(orientation, order)
  return jpeg[:2] + b'\xff\xe1' + struct.pack('>H', len(body) + 2) + body + (
      jpeg[2:])


# By hand: the 2x3 image [[a b c], [d e f]] as displayed for each value.
DISPLAYED = {1: [['a', 'b', 'c'], ['d', 'e', 'f']],
             2: [['c', 'b', 'a'], ['f', 'e', 'd']],
             3: [['f', 'e', 'd'], ['c', 'b', 'a']],
             4: [['d', 'e', 'f'], ['a', 'b', 'c']],
             5: [['a', 'd'], ['b', 'e'], ['c', 'f']],
             6: [['d', 'a'], ['e', 'b'], ['f', 'c']],
             7: [['f', 'c'], ['e', 'b'], ['d', 'a']],
             8: [['c', 'f'], ['b', 'e'], ['a', 'd']]}


@pytest.mark.parametrize('value', sorted(DISPLAYED))
def test_upright_turns_as_the_exif_standard_says(value):
  letters = np.array([['a', 'b', 'c'], ['d', 'e', 'f']])[..., None]
  turned = exif.upright(letters, value)[..., 0]
  assert turned.tolist() == DISPLAYED[value]


@pytest.mark.parametrize('order', ['<', '>'])
def test_orientation_is_read_from_jpeg_png_and_webp(order):
  jpeg = tf.io.encode_jpeg(image(0)).numpy()
  assert exif.orientation(jpeg) == 1
  assert exif.orientation(jpeg_with_exif(jpeg, 6, order)) == 6
  assert exif.orientation(png_with_exif(image(0), 8)) == 8
  assert exif.orientation(encode_png(image(0))) == 1
  body = b'Exif\x00\x00' + tiff_block(3, order)
  riff = WEBP_1X1[12:] + b'EXIF' + struct.pack('<I', len(body)) + body
  webp = b'RIFF' + struct.pack('<I', len(riff) + 4) + b'WEBP' + riff
  assert exif.orientation(webp) == 3
  assert exif.orientation(jpeg_with_exif(jpeg, 6, order)[:30]) == 1  # cut.


@pytest.mark.parametrize('value', [3, 6, 8])
def test_the_converter_stores_photos_upright(tmp_path, value):
  original = image(5, height=4, width=6)
  jpeg = tf.io.encode_jpeg(original, quality=100).numpy()
  image_dir = folder(tmp_path, {'a': {
      'p.png': png_with_exif(original, value),
      'j.jpg': jpeg_with_exif(jpeg, value, '>')}})
  out = str(tmp_path / 'out')
  [path] = convert.convert_image_folder(image_dir, out, 'eval', shuffle=False,
                                        min_classes=1)
  height, width = (6, 4) if value in (6, 8) else (4, 6)
  assert stored(path) == [(b'jpeg', height, width, 0),
                          (b'png', height, width, 0)]
  [(images, _)] = collect(lambda: datasets.get_dataset(
      'tfrecord', 'eval', 2, image_size=(height, width), data_dir=out))
  want = exif.upright(original, value)
  np.testing.assert_array_equal(np.round(images[1] * 255), want)  # PNG.
  assert np.abs(images[0] * 255 - want).mean() < 8  # JPEG, twice encoded.


# ------------------------------------------------------ the split is whole


def shards_of(out: str, split: str = 'train') -> list:
  return sorted(os.path.join(out, n) for n in os.listdir(out)
                if n.startswith(split + '-'))


@pytest.fixture
def converted(tmp_path) -> str:
  image_dir = folder(tmp_path, {'a': pngs(3), 'b': pngs(3, 10)})
  out = str(tmp_path / 'out')
  convert.convert_image_folder(image_dir, out, num_shards=3)
  return out


def test_a_missing_shard_is_refused_naming_it(converted):
  os.remove(os.path.join(converted, 'train-00001-of-00003.tfrecord'))
  with pytest.raises(ValueError) as error:
    datasets.find_shards(converted, 'train')
  assert str(error.value) == (
      f"Split 'train' in {converted} is incomplete: 1 of its 3 shards "
      'missing (train-00001-of-00003.tfrecord); reading the rest would '
      'train or evaluate on part of the data. Copy the missing files, or '
      'convert the images again (python convert.py).')
  os.remove(os.path.join(converted, 'splits.json'))  # by the names alone.
  with pytest.raises(ValueError, match='1 of its 3 shards missing'):
    datasets.find_shards(converted, 'train')


def test_shards_of_two_conversions_are_refused(converted, tmp_path):
  os.remove(os.path.join(converted, 'splits.json'))
  other = tmp_path / 'in'
  convert.convert_image_folder(str(other), str(tmp_path / 'o2'), num_shards=2)
  os.rename(tmp_path / 'o2' / 'train-00000-of-00002.tfrecord',
            os.path.join(converted, 'train-00000-of-00002.tfrecord'))
  with pytest.raises(ValueError, match=re.escape(
      "Split 'train' in " + converted + ' mixes the shards of 2 '
      'conversions: -of-00002 (1 files), -of-00003 (3 files).')):
    datasets.find_shards(converted, 'train')


def test_a_cut_shard_is_refused_by_its_recorded_size(converted):
  path = shards_of(converted)[2]
  size = os.path.getsize(path)
  os.truncate(path, size - 5)
  with pytest.raises(ValueError, match=re.escape(
      f'Shard train-00002-of-00003.tfrecord of split \'train\' in '
      f'{converted} holds {size - 5} bytes, but the converter wrote {size} '
      '(2 records) (splits.json)')):
    datasets.find_shards(converted, 'train')


def test_a_recorded_shard_renamed_away_is_refused(converted):
  record = split_record.read(converted)
  record['train'].append({'file': 'train-00003-of-00003.tfrecord',
                          'records': 4, 'bytes': 10})
  split_record.write(os.path.join(converted, 'splits.json'), record)
  with pytest.raises(ValueError, match=re.escape(
      'Shard train-00003-of-00003.tfrecord of split \'train\' in '
      f'{converted} is missing: the converter wrote it (4 records)')):
    datasets.find_shards(converted, 'train')


def test_records_without_a_record_file_still_read(converted):
  os.remove(os.path.join(converted, 'splits.json'))
  assert len(datasets.find_shards(converted, 'train')) == 3
