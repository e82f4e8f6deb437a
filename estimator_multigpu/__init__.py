"""estimator_multigpu: train an unchanged Estimator model_fn on every GPU.

    import estimator_multigpu as emg

    @emg.multi_gpu
    def model_fn(features, labels, mode, params): ...

    opt = emg.TowerOptimizer(tf.compat.v1.train.MomentumOptimizer(lr, 0.9))

Public names load on first use (PEP 562), so `python -m
estimator_multigpu.devices` runs its module cleanly. Importing the package
changes nothing else: tf-slim's fixes for TF 2.15 (`slim_compat`) are applied
when `multi_gpu` wraps a model_fn, or explicitly with `slim_compat.apply_all()`.
"""

import importlib

_PUBLIC = {
    "multi_gpu": "replicate",
    "TowerOptimizer": "update.tower_optimizer",
    "make_session_config": "devices",
    "make_parallel": "parallel",
    "tower_devices": "build.plan",
    "cross_tower_moments": "cross_tower.moments",
    "global_ratio": "cross_tower.tools",
    "cross_tower_sum": "cross_tower.tools",
    "cross_tower_concat": "cross_tower.tools",
}

__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str):
  if name in _PUBLIC:
    module = importlib.import_module(f"{__name__}.{_PUBLIC[name]}")
    return getattr(module, name)
  try:
    return importlib.import_module(f"{__name__}.{name}")
  except ModuleNotFoundError as error:
    if error.name != f"{__name__}.{name}":
      raise
    raise AttributeError(
        f"module {__name__!r} has no attribute {name!r}") from None


def __dir__():
  return sorted(set(globals()) | set(__all__))
