"""`Options` is the one source of the decorator's options (issue 45).

`multi_gpu`'s keyword arguments are `Options`' fields, in order, with the
same defaults; `check_options` runs each field's own check, so an option
added as a field is checked and reaches the pipeline without another list.
"""

import dataclasses
import inspect

import pytest

from estimator_multigpu import decorator
from estimator_multigpu import options as options_lib

FIELDS = dataclasses.fields(options_lib.Options)


def test_multi_gpu_takes_the_options_fields_in_order_with_their_defaults():
  parameters = inspect.signature(decorator.multi_gpu).parameters
  assert list(parameters)[0] == "model_fn"
  options = [p for name, p in parameters.items() if name != "model_fn"]
  assert [p.name for p in options] == [f.name for f in FIELDS]
  assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in options)
  assert {p.name: p.default for p in options} == {
      f.name: f.default for f in FIELDS}


def test_every_option_is_documented_in_the_decorators_manual():
  args = decorator.multi_gpu.__doc__.split("  Args:")[1]
  assert [f.name for f in FIELDS if f"\n    {f.name}:" not in args] == []


def test_every_field_has_its_own_check():
  assert [f.name for f in FIELDS if not callable(f.metadata.get("check"))
          ] == []


def test_the_defaults_pass_their_checks_unchanged_but_devices():
  checked = options_lib.check_options()
  assert checked == options_lib.Options(devices=None)
  assert checked.groups is None
  assert checked.packing_bytes == options_lib.all_reduce_lib.DEFAULT_PACKING_BYTES
  assert not checked.asks_for_all_reduce


@pytest.mark.parametrize("name, bad, error", [
    ("loss_reduction", "avg", ValueError),
    ("ema_decay", 1.5, ValueError),
    ("clip_gradients_by_norm", "5", TypeError),
    ("variable_update", "mirrored", ValueError),
    ("unsplit_features", "vocab", TypeError),
    ("all_reduce", "ring", ValueError),
    ("gradient_packing_bytes", -1, ValueError),
    ("accumulate_steps", 0, ValueError),
    ("mixed_precision", "float8", ValueError),
    ("sync_batch_norm", 1, TypeError),
    ("synchronization", "eventually", ValueError),
    ("global_batch", "yes", TypeError),
])
def test_each_field_check_names_its_option(name, bad, error):
  with pytest.raises(error, match=f"`{name}`"):
    options_lib.check_options(**{name: bad})
  with pytest.raises(error, match=f"`{name}`"):
    decorator.multi_gpu(**{name: bad})


def test_an_unknown_option_lists_the_options():
  with pytest.raises(TypeError, match="accumulate_step.*accumulate_steps"):
    options_lib.check_options(accumulate_step=2)


def test_checked_values_reach_the_options_the_pipeline_reads():
  checked = options_lib.check_options(
      devices=["/cpu:0", "/CPU:1"], aggregation_device="/CPU:0",
      unsplit_features=["vocab"], gradient_packing_bytes=0,
      variable_update="replicated")
  assert checked.groups == [["/device:CPU:0"], ["/device:CPU:1"]]
  assert checked.aggregation_device == "/device:CPU:0"
  assert checked.unsplit_features == ("vocab",)
  assert checked.packing_bytes == 0 and checked.asks_for_all_reduce
