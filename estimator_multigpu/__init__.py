"""estimator_multigpu: train an unchanged Estimator model_fn on every GPU.

    import estimator_multigpu as emg

    @emg.multi_gpu
    def model_fn(features, labels, mode, params): ...

    opt = emg.TowerOptimizer(tf.compat.v1.train.MomentumOptimizer(lr, 0.9))

The public surface is `__all__`: the names below, and the subpackages
`devices` (device spellings, session configs, `python -m
estimator_multigpu.devices`) and `cluster` (several machines). Everything
else is internal and may change. Public names load on first use (PEP 562),
so `import estimator_multigpu` does not import TensorFlow, and importing the
package changes nothing else: tf-slim's fixes for TF 2.15 (`slim_compat`) are
applied when `multi_gpu` wraps a model_fn, or explicitly with
`slim_compat.apply_all()`.
"""

import importlib

# Public name -> the module that defines it.
_PUBLIC = {
    "multi_gpu": "replicate",
    "TowerOptimizer": "update.tower_optimizer",
    "make_session_config": "devices",
    "make_parallel": "parallel",
    "tower_devices": "graph.plan",
    "cross_tower_moments": "cross_tower.moments",
    "global_ratio": "cross_tower.tools",
    "cross_tower_sum": "cross_tower.tools",
    "cross_tower_concat": "cross_tower.tools",
    "check_towers": "check",
    "TowerCheck": "check",
    "train_and_evaluate": "cluster.all_reduce_training",
}
_PUBLIC_MODULES = ("devices", "cluster")

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


def _import(module: str):
  """Imports `module`; without TensorFlow, says which extra installs it."""
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as error:
    if error.name not in ("tensorflow", "tensorflow_estimator"):
      raise
    raise ModuleNotFoundError(
        f"estimator_multigpu needs TensorFlow 2.15, which is not installed "
        f"(no module named {error.name!r}). Install the package with the "
        "extra for your machine: pip install -e '.[cpu]' (CPU only) or "
        "pip install -e '.[gpu]' (NVIDIA GPUs).", name=error.name) from None


def __dir__():
  return sorted(set(globals()) | set(__all__))
