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
  # compat/: a move then always ends in compat's one line.
  private = re.compile(r"^(tensorflow\.python|keras\.src|keras\.api|tf_keras)")
  offenders = []
  for path in _sources():
    if _in_compat(path):
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
               [a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.value] if isinstance(node, ast.Constant) and
               isinstance(node.value, str) else [])
      offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                    if private.match(n) and n not in slim_compat.MOVED]
  assert not offenders


def _in_compat(path):
  return path.parent.name == "compat" and path.parent.parent.name == (
      "estimator_multigpu")


# Instances for the members TensorFlow sets in `__init__` (not on the class).
def _saver():
  with tf.Graph().as_default():
    return tf.compat.v1.train.Saver([tf.compat.v1.get_variable("v", [1])])


def _resource_variable():
  with tf.Graph().as_default():
    return tf.compat.v1.get_variable("v", [1], use_resource=True)


def _loss_scale():
  with tf.Graph().as_default():
    return tf.compat.v1.mixed_precision.DynamicLossScale()


def _lazy_keras():
  loader = compat.internal("keras_loader").KerasLazyLoader({})
  loader._initialize()  # pylint: disable=protected-access
  return loader


INSTANCES = {
    "tf.compat.v1.train.Saver": _saver,
    "tf.compat.v1.train.Optimizer": (
        lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1)),
    "resource_variable_ops.ResourceVariable": _resource_variable,
    "variable_scope._VariableStore": lambda: compat.internal(
        "variable_scope")._get_default_variable_store(),  # pylint: disable=protected-access
    "tf.estimator.Estimator": lambda: tf.estimator.Estimator(
        lambda features, labels, mode: None),
    "tf.estimator.RunConfig": tf.estimator.RunConfig,
    "eager_context.Context": lambda: compat.internal("eager_context").context(),
    "tf.keras.optimizers.legacy.Optimizer": tf.keras.optimizers.legacy.SGD,
    "keras_loader.KerasLazyLoader": _lazy_keras,
    "tf.compat.v1.mixed_precision.DynamicLossScale": _loss_scale,
}


@pytest.mark.parametrize("entry", compat.PRIVATE_MEMBERS,
                         ids=lambda e: f"{e.owner}.{e.member}")
def test_private_members_exist_and_are_documented(entry):
  if VERSION < entry.since:
    pytest.skip(f"used from TF {entry.since} on")
  owner = compat.members.owner_class(entry.owner)
  assert hasattr(owner, entry.member) or (
      entry.owner in INSTANCES and
      hasattr(INSTANCES[entry.owner](), entry.member))
  text = (ROOT / "docs" / "compatibility.md").read_text()
  assert f"| `{entry.owner}.{entry.member}` | {entry.purpose} |" in text


class _Owner:
  _slots = "the slots"


def test_a_missing_private_member_is_one_line(monkeypatch):
  fake = _Owner()
  assert compat.private(fake, "_slots") == "the slots"
  monkeypatch.delattr(_Owner, "_slots")
  with pytest.raises(compat.TensorFlowMoved) as error:
    compat.private(fake, "_slots")
  what = r"tf\.compat\.v1\.train\.Optimizer\._slots"
  assert re.match(MOVED_LINE.format(what=what), str(error.value))
  with pytest.raises(compat.TensorFlowMoved):
    compat.set_private(fake, "_slots", {})  # would set a dead name.
  assert compat.private(fake, "_slots", None) is None  # a defensive read.


def test_a_moved_member_names_its_owner(monkeypatch):
  layer = compat.internal("keras_base_layer_v1").Layer
  monkeypatch.delattr(layer, "_handle_weight_regularization")
  with pytest.raises(compat.TensorFlowMoved) as error:
    compat.private(layer, "_handle_weight_regularization", own=True)
  what = re.escape(compat.internals.module_name("keras_base_layer_v1") +
                   ".Layer._handle_weight_regularization")
  assert re.match(MOVED_LINE.format(what=what), str(error.value))


def test_an_unregistered_private_member_is_refused():
  with pytest.raises(LookupError, match="not in compat.PRIVATE_MEMBERS"):
    compat.private(_Owner(), "_not_registered")


# Private names the source scan finds that are not TensorFlow's (it cannot
# tell an object's type), each with the reason.
OWN_PRIVATE = {
    "_replace": "namedtuple API (EstimatorSpec and the package's records)",
    "_asdict": "namedtuple API",
    "_fields": "namedtuple API (is this value a namedtuple?)",
    "_exit": "os._exit, the standard library",
    "_optimizer": "TowerOptimizer / KerasTowerOptimizer: the wrapped one",
    "_summarize_gradient_norm": "TowerOptimizer's own option",
    "_OWN": "KerasTowerOptimizer's own attribute names",
    "_original": "strategies.replicated._TowerCopy: tower 0's variable",
    "_global_batch_fetches": "graph.hook_rewrites' mark on a user's hook",
    "_distribute_coordinator_mode": "compat's RunConfig stand-in sets it as "
                                    "TF 2.15 did; tensorflow-estimator "
                                    "reads it only if present (hasattr)",
}
_STRING_READS = ("getattr", "hasattr", "setattr", "delattr")


def _is_private(name):
  return (isinstance(name, str) and re.match(r"^_[A-Za-z]\w*$", name) and
          not name.endswith("__"))


def _private_reads(tree):
  """(line, name, how) of each private member read or written: `x._name`,
  `getattr(x, "_name")` (and has/set/delattr), `vars(x)[...]/.get(...)`."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and _is_private(node.attr):
      receiver = node.value
      if not (isinstance(receiver, ast.Name) and
              receiver.id in ("self", "cls")):
        yield node.lineno, node.attr, "attribute"
    elif isinstance(node, ast.Call) and len(node.args) >= 2:
      function, name = node.func, node.args[1]
      called = getattr(function, "id", getattr(function, "attr", None))
      if (isinstance(name, ast.Constant) and _is_private(name.value) and
          called in _STRING_READS + ("private", "set_private")):
        yield node.lineno, name.value, called


def _overrides(tree):
  """(line, name) of each private member a class defines over a TensorFlow
  base's (a base from `tf.*`, `tf1.*` or `compat.internal`, or an alias)."""
  scope = {"tf": tf, "tf1": tf.compat.v1, "compat": compat}
  for node in tree.body:  # module-level aliases: Legacy = tf.keras....
    if (isinstance(node, ast.Assign) and len(node.targets) == 1 and
        isinstance(node.targets[0], ast.Name) and
        ast.unparse(node.value).split(".")[0] in scope):
      scope[node.targets[0].id] = eval(  # pylint: disable=eval-used
          ast.unparse(node.value), dict(scope))
  for node in ast.walk(tree):
    if not isinstance(node, ast.ClassDef):
      continue
    bases = [eval(ast.unparse(b), dict(scope)) for b in node.bases  # pylint: disable=eval-used
             if ast.unparse(b).split(".")[0] in scope]
    for item in node.body:
      name = getattr(item, "name", None)
      if _is_private(name) and any(hasattr(b, name) for b in bases):
        yield item.lineno, name


def test_every_private_member_goes_through_compat():
  # Outside compat/, a private member of a TensorFlow object is only read
  # through compat.private / set_private, with a registered name; compat's
  # own accesses are registered. Module-level names of `INTERNALS` modules
  # (`losses_impl._safe_mean`) are checked by `internal()`.
  registered = {entry.member for entry in compat.PRIVATE_MEMBERS}
  module_names = {n for entry in compat.INTERNALS.values()
                  for n in entry.names}
  offenders = []
  for path in _sources():
    tree = ast.parse(path.read_text())
    where = str(path.relative_to(ROOT))
    for line, name, how in _private_reads(tree):
      if name in OWN_PRIVATE or name in module_names:
        continue
      direct = how not in ("private", "set_private")
      if name not in registered or (direct and not _in_compat(path)):
        offenders.append(f"{where}:{line}: {name} ({how})")
    offenders += [f"{where}:{line}: def {name} (override)" for line, name
                  in _overrides(tree) if name not in registered]
  assert not offenders, "\n".join(offenders)


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
  monkeypatch.setattr(compat.versions, "tensorflow_version", lambda: (2, 14))
  with pytest.raises(ImportError, match=r"needs TensorFlow 2\.15 to 2\.21; "
                     r"this is 2\.14\. pip install 'tensorflow>=2\.15,<2\.22'"):
    compat.install()


def test_a_newer_tensorflow_warns_once(monkeypatch):
  warnings = []
  monkeypatch.setattr(compat.versions, "tensorflow_version", lambda: (2, 22))
  monkeypatch.setattr(compat.estimator_shim.logging, "warning",
                      lambda text, *args: warnings.append(text % args))
  compat.estimator_shim._check_version((2, 22))  # pylint: disable=protected-access
  assert warnings == ["estimator_multigpu: TensorFlow 2.22 is newer than the "
                      "newest tested (2.21); an internal that moved will be "
                      "named in one line."]


def test_estimator_that_cannot_import_is_one_line(monkeypatch):
  def fails(name):
    raise ImportError("cannot import name 'gone' from "
                      "'tensorflow.python.util.nest'",
                      name="tensorflow.python.util.nest")
  monkeypatch.setattr(compat.estimator_shim.importlib, "import_module",
                      fails)
  with pytest.raises(compat.TensorFlowMoved) as error:
    compat.estimator_shim._bind_estimator(tf)  # pylint: disable=protected-access
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
