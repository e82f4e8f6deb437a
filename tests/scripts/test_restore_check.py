"""cli/model_dir/restore_check.py on hand-written variable lists (name -> shape)."""

import pytest

from cli.model_dir import restore_check

LENET = {"global_step": [], "LeNet/fc4/weights": [512, 10],
         "LeNet/fc4/biases": [10]}
MOMENTUM = {f"{name}/Momentum": shape for name, shape in LENET.items()
            if name != "global_step"}


@pytest.mark.parametrize("built,expected", [
    (LENET, None),  # the same graph, without the slots: eval, export.
    ({**LENET, **MOMENTUM}, None),
    ({"global_step": [], "MLP/logits/weights": [64, 10]},
     "written with --model_name=lenet; this run builds --model_name=mlp"),
    ({"global_step": [], "LeNet/fc4/weights": [512, 5],
      "LeNet/fc4/biases": [5]},
     "written with --num_classes=10 (LeNet/fc4/biases is [10]); this run "
     "builds --num_classes=5 ([5])"),
    ({**LENET, "LeNet/fc4/biases/Adam": [10]},
     "written with --optimizer=momentum; this run uses --optimizer=adam"),
    ({**LENET, "LeNet/fc4/biases/ExponentialMovingAverage": [10]},
     "which has no moving averages"),
    ({**LENET, "loss_scale": []}, "lacks 1 variable(s) of this run's graph"),
])
def test_mismatch_names_what_the_checkpoint_was_written_with(built,
                                                             expected):
  saved = {**LENET, **MOMENTUM}
  wrong = restore_check.mismatch(saved, built,
                                   built.get("LeNet/fc4/biases", [5])[0])
  if expected is None:
    assert wrong is None
  else:
    assert expected in wrong, wrong
