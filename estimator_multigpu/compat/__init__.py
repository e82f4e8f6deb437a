"""TensorFlow 2.15 through 2.21, and every TensorFlow internal the package uses.

(Being split into modules; `estimator_shim` holds everything for now.)
"""

from estimator_multigpu.compat import estimator_shim
from estimator_multigpu.compat.estimator_shim import *  # pylint: disable=wildcard-import
from estimator_multigpu.compat.estimator_shim import (  # pylint: disable=unused-import
    _bind_estimator, _check_version, importlib, logging)
