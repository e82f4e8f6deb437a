"""`tf.compat.v1.train.init_from_checkpoint` in towers: tower 0's call only.

`init_from_checkpoint(ckpt, {"backbone/": "backbone/"})` changes the
initializers of the variables it finds when it is called. Tower 0's call is
one device's: before the layers it finds nothing and restores nothing (one
device restores nothing either), after them it restores tower 0's
variables, which every tower reads (shared) or copies (replicated: a copy's
initializer reads tower 0's restored value). Towers 1.. see tower 0's
variables from their first line, so their calls would restore what one
device never restores: inside towers 1.. the call does nothing. Tower 0's
call that finds no variable for a scope it maps is a WARNING (once per
model and mode): it restores nothing, on one device too.
"""

from __future__ import annotations

import contextlib
from typing import Any

from estimator_multigpu import compat
from estimator_multigpu.graph import patching
from estimator_multigpu.graph import towers as towers_lib
from estimator_multigpu.graph import warn_once

checkpoint_utils = compat.internal("checkpoint_utils")
vs_lib = compat.internal("variable_scope")
_ORIGINAL = checkpoint_utils._init_from_checkpoint  # pylint: disable=protected-access


def _in_tower(ckpt_dir_or_file: Any, assignment_map: dict) -> None:
  """`_init_from_checkpoint` in the tower being built: tower 0's (warned
  when a scope it maps holds no variable), nothing in towers 1..."""
  tower = towers_lib.current_tower()
  if tower is not None and tower.index > 0:
    return None
  if tower is not None:
    _warn_if_nothing_found(ckpt_dir_or_file, assignment_map)
  return _ORIGINAL(ckpt_dir_or_file, assignment_map)


def _warn_if_nothing_found(ckpt_dir_or_file: Any, assignment_map: dict):
  names = list(compat.private(vs_lib._get_default_variable_store(), "_vars"))  # pylint: disable=protected-access
  empty = [current for current in assignment_map.values()
           if isinstance(current, str) and current.endswith("/") and
           not _holds(current, names)]
  if empty:
    warn_once.warn(
        f"init_from_checkpoint:{empty}",
        "multi_gpu: tf.compat.v1.train.init_from_checkpoint(%r, ...) found "
        "no variable under %s when the model_fn called it, so it restores "
        "nothing (on one device too): call it after the layers that create "
        "the variables.", str(ckpt_dir_or_file),
        ", ".join(repr(scope) for scope in empty))


def _holds(scope: str, names: list) -> bool:
  """Whether a variable of `names` is under `scope` ("/": the root)."""
  prefix = scope.rstrip("/")
  return any(not prefix or name.startswith(prefix + "/") for name in names)


def _install() -> None:
  checkpoint_utils._init_from_checkpoint = _in_tower  # pylint: disable=protected-access


def _uninstall() -> None:
  checkpoint_utils._init_from_checkpoint = _ORIGINAL  # pylint: disable=protected-access


_PATCH = patching.Patch(_install, _uninstall)


def scope():
  """Inside, a tower's `init_from_checkpoint` is tower 0's (see above)."""
  if towers_lib.current_tower() is None:
    return contextlib.nullcontext()
  return _PATCH.scope()

