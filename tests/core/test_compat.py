"""compat: one TensorFlow line looks like another; every internal is listed.

Each entry of `compat.INTERNALS` is moved away here (its module made
unimportable, or one of its names deleted) and must give the one line that
names the TensorFlow version, what moved and the newest tested version.
"""

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from estimator_multigpu import compat
from estimator_multigpu import slim_compat

ROOT = pathlib.Path(__file__).resolve().parents[2]
VERSION = compat.tensorflow_version()
NEW_LINE = pytest.mark.skipif(VERSION < (2, 16),
                              reason="TF >= 2.16 only: 2.15 has tf.estimator")
MOVED_LINE = (rf"^estimator_multigpu: TensorFlow {VERSION[0]}\.{VERSION[1]} "
              r"has no (module )?{what} \(used for .+\); the newest "
              r"TensorFlow tested is 2\.21\. Install it \(pip install "
              r"'tensorflow<2\.22'\) or a newer estimator_multigpu\.$")


def _resolve(key):
  compat.internal.cache_clear()
  try:
    return compat.internal(key)
  finally:
    compat.internal.cache_clear()


@pytest.mark.parametrize("key", sorted(compat.INTERNALS))
def test_a_moved_module_is_one_line(monkeypatch, key):
  name = compat.INTERNALS[key].module.format(keras=compat.keras_package())
  _resolve(key)  # it is there on this line.
  monkeypatch.setitem(sys.modules, name, None)  # import now fails.
  with pytest.raises(compat.TensorFlowMoved) as error:
    _resolve(key)
  assert re.match(MOVED_LINE.format(what=re.escape(name)), str(error.value))


@pytest.mark.parametrize("key", sorted(compat.INTERNALS))
def test_a_moved_name_is_one_line(monkeypatch, key):
  module = _resolve(key)
  for attribute in compat.INTERNALS[key].names:
    with monkeypatch.context() as patch:
      patch.delattr(module, attribute)
      with pytest.raises(compat.TensorFlowMoved) as error:
        _resolve(key)
    what = re.escape(f"{module.__name__}.{attribute}")
    assert re.match(MOVED_LINE.format(what=what), str(error.value))


def _sources():
  for folder in ("estimator_multigpu", "cli", "nets", "datasets",
                 "preprocessing", "bench"):
    yield from (ROOT / folder).rglob("*.py")
  yield from ROOT.glob("*.py")


def test_every_internal_goes_through_compat():
  # No `tensorflow.python` / Keras-internal import or module string outside
  # compat.py: a move then always ends in compat's one line.
  private = re.compile(r"^(tensorflow\.python|keras\.src|keras\.api|tf_keras)")
  offenders = []
  for path in _sources():
    if path.name == "compat.py":
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
               [a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.value] if isinstance(node, ast.Constant) and
               isinstance(node.value, str) else [])
      offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                    if private.match(n) and n not in slim_compat.MOVED]
  assert not offenders


@pytest.mark.parametrize("owner, member, purpose", compat.PRIVATE_MEMBERS)
def test_private_members_exist_and_are_documented(owner, member, purpose):
  assert hasattr(eval(owner, {"tf": tf}), member)  # pylint: disable=eval-used
  text = (ROOT / "docs" / "compatibility.md").read_text()
  assert f"| `{owner}.{member}` | {purpose} |" in text


def test_slim_moved_names_are_internals():
  for moved in slim_compat.MOVED.values():
    for key, attribute in moved.values():
      assert attribute in compat.INTERNALS[key].names


def test_the_docs_list_every_internal():
  text = (ROOT / "docs" / "compatibility.md").read_text()
  for key, entry in compat.INTERNALS.items():
    assert f"| `{key}` | `{entry.module}` |" in text, key


def test_the_version_is_the_imported_one():
  assert VERSION == tuple(int(p) for p in tf.__version__.split(".")[:2])
  assert compat.FIRST_SUPPORTED <= VERSION


def test_an_older_tensorflow_is_one_line(monkeypatch):
  monkeypatch.setattr(compat, "tensorflow_version", lambda: (2, 14))
  with pytest.raises(ImportError, match=r"needs TensorFlow 2\.15 to 2\.21; "
                     r"this is 2\.14\. pip install 'tensorflow>=2\.15,<2\.22'"):
    compat.install()


def test_a_newer_tensorflow_warns_once(monkeypatch):
  warnings = []
  monkeypatch.setattr(compat, "tensorflow_version", lambda: (2, 22))
  monkeypatch.setattr(compat.logging, "warning",
                      lambda text, *args: warnings.append(text % args))
  compat._check_version((2, 22))  # pylint: disable=protected-access
  assert warnings == ["estimator_multigpu: TensorFlow 2.22 is newer than the "
                      "newest tested (2.21); an internal that moved will be "
                      "named in one line."]


def test_estimator_that_cannot_import_is_one_line(monkeypatch):
  def fails(name):
    raise ImportError("cannot import name 'gone' from "
                      "'tensorflow.python.util.nest'",
                      name="tensorflow.python.util.nest")
  monkeypatch.setattr(compat.importlib, "import_module", fails)
  with pytest.raises(compat.TensorFlowMoved) as error:
    compat._bind_estimator(tf)  # pylint: disable=protected-access
  assert re.match(MOVED_LINE.format(
      what=r"tensorflow\.python\.util\.nest\.gone"), str(error.value))


def _python(code, env=None):
  """Runs `code` in a fresh Python, as a user's process starts (this one set
  TF_USE_LEGACY_KERAS when it imported the package)."""
  fresh = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
  return subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=120, cwd=ROOT,
                        env={**fresh, **(env or {})})


def test_importing_the_package_gives_tf_estimator():
  result = _python(
      "import sys, estimator_multigpu as emg\n"
      "print('tensorflow' in sys.modules)\n"
      "import tensorflow as tf\n"
      "print(tf.estimator.Estimator.__name__, "
      "tf.compat.v1.estimator.tpu.TPUEstimatorSpec.__name__, "
      "tf.compat.v1.estimator.Estimator.__name__)\n"
      "print(type(tf.keras.layers.Dense(1)).__module__.split('.')[0])")
  loaded, names, keras = result.stdout.split("\n")[:3]
  # TF 2.15: the package imports nothing. Later: TensorFlow, Keras 2.
  assert loaded == str(VERSION >= (2, 16)), result.stderr[-2000:]
  assert names == "EstimatorV2 TPUEstimatorSpec Estimator"
  assert keras == ("keras" if VERSION < (2, 16) else "tf_keras")


@NEW_LINE
def test_tensorflow_imported_first_still_gets_keras_2():
  result = _python("import tensorflow as tf\nimport estimator_multigpu\n"
                   "from tensorflow.keras import layers\n"
                   "print(layers.Dense.__module__)")
  assert result.stdout.startswith("tf_keras."), result.stderr[-2000:]


@NEW_LINE
def test_a_failed_tensorflow_estimator_import_before_still_works():
  result = _python("try:\n  import tensorflow_estimator\n"
                   "except ImportError:\n  pass\n"
                   "import estimator_multigpu, tensorflow as tf\n"
                   "print(tf.estimator.Estimator.__name__)")
  assert result.stdout.strip() == "EstimatorV2", result.stderr[-2000:]


@NEW_LINE
def test_keras_3_chosen_by_the_user_is_one_line():
  result = _python("import estimator_multigpu",
                   env={"TF_USE_LEGACY_KERAS": "0"})
  assert result.stderr.strip().splitlines()[-1] == (
      "ImportError: estimator_multigpu: TF_USE_LEGACY_KERAS=0 routes "
      "tf.keras to Keras 3, which cannot build layers in a graph-mode "
      "Estimator model_fn; unset TF_USE_LEGACY_KERAS or set it to 1 "
      "(tf-keras, Keras 2).")


@NEW_LINE
def test_tf_keras_used_first_as_keras_3_is_one_line():
  result = _python("import tensorflow as tf\ntf.keras.layers.Dense\n"
                   "import estimator_multigpu")
  assert "ImportError: estimator_multigpu: tf.keras was already used as " \
      "Keras 3 in this process" in result.stderr, result.stderr[-2000:]


@NEW_LINE
def test_the_distribute_coordinator_is_refused():
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  os.environ["TF_CONFIG"] = ('{"cluster": {"chief": ["localhost:1"], '
                             '"worker": ["localhost:2"]}, '
                             '"task": {"type": "chief", "index": 0}}')
  try:
    with pytest.raises(ValueError, match="distribute coordinator, which "
                       r"TensorFlow 2\.\d+ no longer has"):
      tf.estimator.RunConfig(train_distribute=strategy)
  finally:
    del os.environ["TF_CONFIG"]


@NEW_LINE
def test_tpu_embedding_names_refuse_when_used():
  module = sys.modules["tensorflow.python.tpu.tpu_embedding"]
  with pytest.raises(NotImplementedError, match="TPU embeddings"):
    module.TPUEmbedding()
