"""The EXIF orientation of an image file, read without an image library.

Cameras and phones store a photo as the sensor saw it and write in the EXIF
`Orientation` tag (0x0112) how to turn it for display; TensorFlow's
decoders ignore that tag, so a portrait phone photo would enter training
lying on its side. `orientation` finds the EXIF block (a JPEG's APP1
segment, a PNG's ``eXIf`` chunk, a WebP's ``EXIF`` chunk), reads the tag
from its first image directory (TIFF layout, either byte order), and
`upright` turns a decoded [H, W, C] array as Pillow's
``ImageOps.exif_transpose`` does:

====  ===========================  ====  ==========================
 2    mirror left-right             6    rotate 90° clockwise
 3    rotate 180°                   7    transverse (anti-diagonal)
 4    mirror top-bottom             8    rotate 90° counter-clockwise
 5    transpose (main diagonal)     1    as stored (also: no tag)
====  ===========================  ====  ==========================
"""

import struct
from typing import Optional

import numpy as np

UPRIGHT = 1
_TAG = 0x0112
_EXIF_HEADER = b'Exif\x00\x00'


def _jpeg_exif(data: bytes) -> Optional[bytes]:
  """The TIFF block of a JPEG's EXIF APP1 segment, or None."""
  at = 2
  while at + 4 <= len(data) and data[at] == 0xFF:
    marker = data[at + 1]
    if marker in (0xD9, 0xDA):  # end of image, start of scan: no more.
      return None
    size = struct.unpack('>H', data[at + 2:at + 4])[0]
    body = data[at + 4:at + 2 + size]
    if marker == 0xE1 and body.startswith(_EXIF_HEADER):
      return body[len(_EXIF_HEADER):]
    at += 2 + size
  return None


def _png_exif(data: bytes) -> Optional[bytes]:
  """The payload of a PNG's ``eXIf`` chunk, or None."""
  at = 8
  while at + 8 <= len(data):
    size, tag = struct.unpack('>I4s', data[at:at + 8])
    if tag == b'eXIf':
      return data[at + 8:at + 8 + size]
    if tag in (b'IDAT', b'IEND'):
      return None
    at += 12 + size
  return None


def _webp_exif(data: bytes) -> Optional[bytes]:
  """The payload of a WebP's ``EXIF`` chunk, or None."""
  at = 12
  while at + 8 <= len(data):
    tag, size = struct.unpack('<4sI', data[at:at + 8])
    if tag == b'EXIF':
      body = data[at + 8:at + 8 + size]
      return body[len(_EXIF_HEADER):] if body.startswith(_EXIF_HEADER) else (
          body)
    at += 8 + size + size % 2
  return None


def _tiff_orientation(tiff: bytes) -> int:
  """The Orientation entry of a TIFF block's first directory (1: none)."""
  order = {b'II': '<', b'MM': '>'}.get(tiff[:2])
  if order is None or len(tiff) < 8:
    return UPRIGHT
  first = struct.unpack(order + 'I', tiff[4:8])[0]
  if first + 2 > len(tiff):
    return UPRIGHT
  count = struct.unpack(order + 'H', tiff[first:first + 2])[0]
  for entry in range(first + 2, min(first + 2 + 12 * count, len(tiff) - 11),
                     12):
    tag, _, _, value = struct.unpack(order + 'HHIH', tiff[entry:entry + 10])
    if tag == _TAG:
      return value if 1 <= value <= 8 else UPRIGHT
  return UPRIGHT


def orientation(data: bytes) -> int:
  """The EXIF orientation (1-8) of JPEG, PNG or WebP file bytes; 1 when
  there is none (other formats, no EXIF, no tag, a damaged block)."""
  if data.startswith(b'\xff\xd8'):
    tiff = _jpeg_exif(data)
  elif data.startswith(b'\x89PNG'):
    tiff = _png_exif(data)
  elif data[:4] == b'RIFF' and data[8:12] == b'WEBP':
    tiff = _webp_exif(data)
  else:
    tiff = None
  try:
    return _tiff_orientation(tiff) if tiff else UPRIGHT
  except struct.error:
    return UPRIGHT


def upright(image: np.ndarray, value: int) -> np.ndarray:
  """`image` [H, W, C] as displayed for EXIF orientation `value`."""
  turned = {
      2: lambda a: a[:, ::-1],
      3: lambda a: a[::-1, ::-1],
      4: lambda a: a[::-1],
      5: lambda a: a.transpose(1, 0, 2),
      6: lambda a: np.rot90(a, k=3),
      7: lambda a: np.rot90(a, k=2).transpose(1, 0, 2),
      8: lambda a: np.rot90(a, k=1),
  }.get(value, lambda a: a)(image)
  return np.ascontiguousarray(turned)
