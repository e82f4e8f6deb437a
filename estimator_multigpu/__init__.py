"""estimator_multigpu: train an unchanged Estimator model_fn on every GPU.

    import estimator_multigpu as emg

    @emg.multi_gpu
    def model_fn(features, labels, mode, params): ...

    opt = emg.TowerOptimizer(tf.compat.v1.train.MomentumOptimizer(lr, 0.9))
"""

from estimator_multigpu import slim_compat
from estimator_multigpu.devices import make_session_config
from estimator_multigpu.gradients import TowerOptimizer
from estimator_multigpu.plan import tower_devices
from estimator_multigpu.replicate import multi_gpu

__all__ = ["multi_gpu", "TowerOptimizer", "make_session_config",
           "tower_devices"]
__version__ = "0.1.0"

slim_compat.apply_all()
