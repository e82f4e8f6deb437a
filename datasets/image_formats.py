"""Which image formats a file holds and which the installed TensorFlow
decodes.

A file's format comes from its first bytes, not its name (a `.jpg` that is
really a PNG converts; a `.txt` is no image). The decodable set is probed,
not read off the version string: `tf.io.decode_image` reads BMP, GIF, JPEG
and PNG everywhere, and WebP from TensorFlow 2.21 on, which
`decodable_formats` finds by decoding a 1x1 WebP once.
"""

import base64
import functools
from typing import FrozenSet

import tensorflow as tf

BMP, GIF, JPEG, PNG, WEBP = 'bmp', 'gif', 'jpeg', 'png', 'webp'
ALWAYS = frozenset((BMP, GIF, JPEG, PNG))
# Stored in the records as they are; the others are re-encoded as PNG.
STORED_AS_IS = (JPEG, PNG)
HEADER_BYTES = 16
# A lossy 1x1 WebP (the one browsers' feature tests decode).
_WEBP_SAMPLE = base64.b64decode(
    'UklGRiIAAABXRUJQVlA4IBYAAAAwAQCdASoBAAEADsD+JaQAA3AAAAAA')


def sniff(header: bytes) -> str:
  """The format of file bytes starting with `header` (>= 16 bytes), e.g.
  'jpeg', 'tiff', 'heic'; '' for none known."""
  if header.startswith(b'\x89PNG\r\n\x1a\n'):
    return PNG
  if header.startswith(b'\xff\xd8\xff'):
    return JPEG
  if header.startswith((b'GIF87a', b'GIF89a')):
    return GIF
  if header.startswith(b'BM'):
    return BMP
  if header[:4] == b'RIFF' and header[8:12] == b'WEBP':
    return WEBP
  if header.startswith((b'II*\x00', b'MM\x00*')):
    return 'tiff'
  if header[4:8] == b'ftyp' and header[8:12] in (b'heic', b'heix', b'mif1',
                                                 b'heim', b'avif'):
    return 'avif' if header[8:12] == b'avif' else 'heic'
  return ''


def _decodes(data: bytes) -> bool:
  """Whether this TensorFlow's `decode_image` reads `data`."""
  with tf.Graph().as_default():
    image = tf.io.decode_image(data, expand_animations=False)
    with tf.compat.v1.Session() as session:
      try:
        session.run(image)
        return True
      except tf.errors.InvalidArgumentError:
        return False


@functools.lru_cache(maxsize=None)
def decodable_formats() -> FrozenSet[str]:
  """The formats `tf.io.decode_image` of the installed TensorFlow reads."""
  return ALWAYS | ({WEBP} if _decodes(_WEBP_SAMPLE) else frozenset())


def describe(formats) -> str:
  """E.g. 'BMP, GIF, JPEG, PNG'."""
  return ', '.join(sorted(name.upper() for name in formats))
