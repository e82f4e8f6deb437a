"""TensorFlow 2.15 through 2.21, and every TensorFlow internal the package uses.

`install()` runs when `estimator_multigpu` is imported: nothing on TF 2.15;
on TF >= 2.16, `tf.keras` routed to Keras 2 and tensorflow-estimator 2.15.0
bound as `tf.estimator`. Every private TensorFlow or Keras name the package
uses is registered here: a module in `INTERNALS` (reached through
`internal(key)`), a class member in `PRIVATE_MEMBERS` (reached through
`private(obj, name)` / `set_private`). When a future TensorFlow moves one,
the user gets one line (`TensorFlowMoved`) naming the TensorFlow version,
what moved and the newest tested version; `docs/compatibility.md` lists
them and `tests/core/test_compat.py` simulates each move.

Modules:

* `versions`: the supported range, the installed line, `TensorFlowMoved`
  and its one line (`moved_message`);
* `internals`: the registry of private modules, `INTERNALS`, `internal()`;
* `members`: the registry of private class members, `PRIVATE_MEMBERS`,
  `private()`, `set_private()`;
* `keras_routing`: `tf.keras` to tf-keras on TF >= 2.16;
* `estimator_shim`: `install()`, and the names TF 2.16 removed that
  tensorflow-estimator 2.15.0 imports;
* `op_hooks`: the package's one TensorFlow op callback, running its hooks
  (check_towers' fixed draws, empty-shard guards, the global batch) in
  order, never while gradients are built.

This module only re-exports the names the package uses.
"""

from estimator_multigpu.compat import estimator_shim
from estimator_multigpu.compat import internals
from estimator_multigpu.compat import keras_routing
from estimator_multigpu.compat import members
from estimator_multigpu.compat import versions
from estimator_multigpu.compat.estimator_shim import install
from estimator_multigpu.compat.internals import Internal
from estimator_multigpu.compat.internals import internal
from estimator_multigpu.compat.internals import INTERNALS
from estimator_multigpu.compat.members import private
from estimator_multigpu.compat.members import PRIVATE_MEMBERS
from estimator_multigpu.compat.members import PrivateMember
from estimator_multigpu.compat.members import set_private
from estimator_multigpu.compat.versions import FIRST_SUPPORTED
from estimator_multigpu.compat.versions import keras_package
from estimator_multigpu.compat.versions import moved_message
from estimator_multigpu.compat.versions import NEWEST_TESTED
from estimator_multigpu.compat.versions import tensorflow_version
from estimator_multigpu.compat.versions import TensorFlowMoved

__all__ = [
    "FIRST_SUPPORTED", "INTERNALS", "Internal", "NEWEST_TESTED",
    "PRIVATE_MEMBERS", "PrivateMember", "TensorFlowMoved", "install",
    "internal", "keras_package", "moved_message", "private", "set_private",
    "tensorflow_version",
    # The modules, for tests that patch one (compat.versions.X).
    "estimator_shim", "internals", "keras_routing", "members", "versions",
]
