"""The supported TensorFlow range, the installed line, and the "moved" error.

Holds:

* `FIRST_SUPPORTED`, `NEWEST_TESTED`: the range the package is tested on;
* `tensorflow_version()`, `version_text()`, `keras_package()`: what is
  installed, read from the distribution's metadata so that TF 2.15 is not
  imported;
* `TensorFlowMoved` and `moved_message()`: the one line a user gets when a
  TensorFlow or Keras internal is gone (`internals`, `members` raise it).

The other compat modules call these through the module (`versions.X()`), so
a test that patches `compat.versions.tensorflow_version` patches them all.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from typing import Optional, Tuple

FIRST_SUPPORTED = (2, 15)
NEWEST_TESTED = (2, 21)
_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu",
                  "tensorflow-intel", "tensorflow-macos", "tensorflow-aarch64",
                  "tensorflow-cpu-aws", "tf-nightly", "tf-nightly-cpu")


class TensorFlowMoved(ImportError):
  """A TensorFlow or Keras internal the package relies on is not there."""


def tensorflow_version() -> Tuple[int, int]:
  """(major, minor) of the TensorFlow installed (imported if it must be)."""
  if "tensorflow" in sys.modules:
    return _parse(sys.modules["tensorflow"].__version__)
  version = _installed_version()
  if version is None:
    version = _parse(importlib.import_module("tensorflow").__version__)
  return version


def _parse(text: str) -> Tuple[int, int]:
  major, minor = text.split(".")[:2]
  return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _installed_version() -> Optional[Tuple[int, int]]:
  """The version of the distribution that owns `tensorflow`, from metadata."""
  spec = importlib.util.find_spec("tensorflow")
  if spec is None:
    raise ModuleNotFoundError("No module named 'tensorflow'",
                              name="tensorflow")
  for name in _DISTRIBUTIONS:
    try:
      dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
      continue
    owned = os.path.realpath(str(dist.locate_file("tensorflow/__init__.py")))
    if owned == os.path.realpath(spec.origin or ""):
      return _parse(dist.version)
  return None


def version_text() -> str:
  """The installed TensorFlow line, e.g. "2.21"."""
  return ".".join(map(str, tensorflow_version()))


def keras_package() -> str:
  """The Keras 2 package of the installed line: `keras` or `tf_keras`."""
  return "keras" if tensorflow_version() < (2, 16) else "tf_keras"


def moved_message(what: str, purpose: str) -> str:
  """The one line a user gets when a TensorFlow internal moved."""
  newest = ".".join(map(str, NEWEST_TESTED))
  return (f"estimator_multigpu: TensorFlow {version_text()} has no {what} "
          f"(used for {purpose}); the newest TensorFlow tested is {newest}. "
          f"Install it (pip install 'tensorflow<{NEWEST_TESTED[0]}."
          f"{NEWEST_TESTED[1] + 1}') or a newer estimator_multigpu.")
