"""estimator_multigpu: train an unchanged Estimator model_fn on every GPU.

    import estimator_multigpu as emg

    @emg.multi_gpu
    def model_fn(features, labels, mode, params): ...

    opt = emg.TowerOptimizer(tf.compat.v1.train.MomentumOptimizer(lr, 0.9))

The public surface is `__all__`: the names below, and the modules
`devices` (device spellings, session configs, `python -m
estimator_multigpu.devices`), `cluster` (several machines), `runtime` (the
hooks, guards, evaluation loop and model-dir tools of a training job) and
`slim_compat` (tf-slim 1.1.0's fixes, for a tf-slim net outside
`multi_gpu`). Everything else is internal and may change without notice.
Public names load on first use (PEP 562).

Inside, from the top down (a module imports only those below it):
`decorator` (`multi_gpu`) checks its `options` and hands each graph to
`pipeline` (plan -> shards -> towers -> update chain -> spec); `check`,
`check_report` and `check_readouts` are `check_towers`; `parallel` calls
one function per device. `update/` turns the towers' gradients into one
update (the chain of steps); `strategies/` say where variables live and how
gradients combine; `cross_tower/` communicates between towers while they
are built; `graph/` builds one graph; `collectives` holds TensorFlow's
collective ops between towers; `runtime/`, `cluster/` and `devices/` run a
job; `compat` is every TensorFlow internal used, by version;
`log_handlers` gives the package's absl lines one handler (each line once).

Importing the package gives the root logger a handler when it has none
(`log_handlers`). The rest depends on the TensorFlow line
(`compat.install`): on TF 2.15 nothing (TensorFlow is not even imported); on
TF 2.16 to 2.21 it imports TensorFlow with `tf.keras` routed to tf-keras
(`TF_USE_LEGACY_KERAS=1`) and makes tensorflow-estimator 2.15.0 available as
`tf.estimator` and `tf.compat.v1.estimator`, so import it before the first
use of `tf.estimator` or `tf.keras`. tf-slim's fixes (`slim_compat`) are
applied once, when `multi_gpu` first wraps a model_fn, or with
`slim_compat.apply_all()`.
"""

import importlib

from estimator_multigpu import compat as _compat
from estimator_multigpu import log_handlers as _log_handlers

_log_handlers.install()  # before any module logs: each line once.

# Public name -> the module that defines it.
_PUBLIC = {
    "multi_gpu": "decorator",
    "TowerOptimizer": "update.tower_optimizer",
    "make_session_config": "devices",
    "make_parallel": "parallel",
    "tower_devices": "graph.plan",
    "cross_tower_moments": "cross_tower.moments",
    "global_ratio": "cross_tower.losses",
    "cross_tower_sum": "cross_tower.losses",
    "cross_tower_concat": "cross_tower.losses",
    "check_towers": "check",
    "TowerCheck": "check_report",
    "train_and_evaluate": "cluster.all_reduce.training",
    "VARIABLE_UPDATES": "strategies",
    "averaged_variables": "graph.ema",
    "global_batch_ops": "graph.global_batch.scopes",
}
_PUBLIC_MODULES = ("devices", "cluster", "runtime", "slim_compat")

__all__ = sorted(_PUBLIC) + list(_PUBLIC_MODULES)
__version__ = "0.1.0"


def __getattr__(name: str):
  if name in _PUBLIC:
    module = _import(f"{__name__}.{_PUBLIC[name]}")
    return getattr(module, name)
  if name in _PUBLIC_MODULES:
    return _import(f"{__name__}.{name}")
  raise AttributeError(
      f"module {__name__!r} has no attribute {name!r}; its public names "
      f"are {', '.join(__all__)}.")


def _import(module: str, load=None):
  """Imports `module` (or runs `load`); without TensorFlow, names the extras."""
  try:
    return (load or importlib.import_module)(module)
  except ModuleNotFoundError as error:
    if error.name not in ("tensorflow", "tensorflow_estimator"):
      raise
    raise ModuleNotFoundError(
        f"estimator_multigpu needs TensorFlow 2.15 to 2.21, which is not "
        f"installed (no module named {error.name!r}). Install the package "
        "with the extra for your machine: pip install -e '.[cpu]' (CPU only) "
        "or pip install -e '.[gpu]' (NVIDIA GPUs).", name=error.name) from None


_import(__name__, lambda _: _compat.install())  # TF >= 2.16: tf.estimator.


def __dir__():
  return sorted(set(globals()) | set(__all__))
