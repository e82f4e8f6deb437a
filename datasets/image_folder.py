"""Reads a folder of images, one subfolder per class, for the converter.

Class ids follow the sorted subfolder names; a file's format comes from its
first bytes (`image_formats`), and files this TensorFlow does not decode are
counted in the scan's `convert_tally.Tally`, not listed. A subfolder without
an image is refused, naming it (`convert` explains why).
"""

import os
from typing import Dict, List, NamedTuple, Tuple

import tensorflow as tf

from datasets import convert_tally
from datasets import image_formats

Item = Tuple[str, int]


class Scan(NamedTuple):
  """What `scan_image_folder` found: the images as `(path, label)` pairs,
  the sorted class names (label `i` is `class_names[i]`), the files skipped and written."""
  items: List[Item]
  class_names: List[str]
  tally: convert_tally.Tally


def _subfolders(image_dir: str) -> List[str]:
  if not tf.io.gfile.isdir(image_dir):
    raise FileNotFoundError(f'image_dir {image_dir!r} is not a directory.')
  names = tf.io.gfile.listdir(image_dir)
  return sorted(n.rstrip('/') for n in names
                if tf.io.gfile.isdir(os.path.join(image_dir, n)))


def _header(path: str) -> bytes:
  with tf.io.gfile.GFile(path, 'rb') as f:
    return f.read(image_formats.HEADER_BYTES)


def _images_in(folder: str, tally: convert_tally.Tally) -> List[str]:
  """The files of `folder` in a format this TensorFlow decodes; the other
  files (hidden ones aside) go to `tally`."""
  decodable = image_formats.decodable_formats()
  images = []
  for name in sorted(tf.io.gfile.listdir(folder)):
    path = os.path.join(folder, name)
    if name.startswith('.') or tf.io.gfile.isdir(path):
      continue
    kind = image_formats.sniff(_header(path))
    if kind in decodable:
      images.append(path)
    else:
      tally.add_format(path, kind)
  return images


def scan_image_folder(image_dir: str) -> Scan:
  """Finds the images of a one-subfolder-per-class folder.

  Raises:
    FileNotFoundError: if `image_dir` is missing.
    ValueError: if it has no class subfolder, no image in them, or a class
      subfolder without images.
  """
  class_names = _subfolders(image_dir)
  if not class_names:
    raise ValueError(
        f'image_dir {image_dir!r} has no subfolders; expected one subfolder '
        'of images per class, e.g. image_dir/cat/1.png, image_dir/dog/2.png.')
  tally = convert_tally.Tally(image_dir)
  images = {name: _images_in(os.path.join(image_dir, name), tally)
            for name in class_names}
  if not any(images.values()):
    raise ValueError(f'No image files in the subfolders {class_names} of '
                     f'{image_dir!r}: {tally.formats_line()}.')
  _check_no_empty_class(image_dir, images, tally)
  return Scan([(path, label) for label, name in enumerate(class_names)
               for path in images[name]], class_names, tally)


def list_image_folder(image_dir: str) -> Tuple[List[Item], List[str]]:
  """`(items, class_names)` of `scan_image_folder(image_dir)`."""
  scan = scan_image_folder(image_dir)
  return scan.items, scan.class_names


def _check_no_empty_class(image_dir: str, images: Dict[str, List[str]],
                          tally: convert_tally.Tally) -> None:
  """Raises for class subfolders that hold no image (naming them)."""
  empty = [os.path.join(image_dir, name) for name, paths in images.items()
           if not paths]
  if empty:
    raise ValueError(
        f'class folder(s) {", ".join(empty)} hold no image file '
        f'({tally.formats_line()}): every subfolder of image_dir is a '
        'class, and an empty one would be a class that no image teaches. '
        'Add its images, or move the folder out of image_dir.')
