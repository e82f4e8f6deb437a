"""Issue 35, rows 3 and 4: a run too short for its warm-up warns with the
peak learning rate its schedule reaches; `--sync_batch_norm` on a net
without batch norm is refused (cli/flags/advice.py, through train.py's
entry point in this process)."""

import os

from absl import logging
import pytest
from test_mistakes import run_in_process
from test_mistakes import the_error_line

import classifier
from cli.flags import advice

pytestmark = pytest.mark.usefixtures("parsed_flags")
SMALL_RUN = ["--dataset_name=synthetic", "--image_size=8", "--batch_size=8",
             "--model_name=lenet"]


def config(**fields) -> classifier.ClassifierConfig:
  return classifier.ClassifierConfig(
      model_name="lenet", num_classes=10,
      **{"learning_rate": 0.1, "decay_steps": 10, **fields})


@pytest.mark.parametrize("fields,max_steps,peak,step", [
    # Warm-up ramp: rate = 0.1 x (step + 1) / warmup_steps, steps 0 .. 9.
    # By hand: 0.1 x 10 / 100 = 0.01 at step 9.
    (dict(warmup_steps=100, learning_rate_decay_type="cosine"), 10, 0.01, 9),
    # The README's flowers command cut to 60 steps: 0.1 x 60 / 500 = 0.012.
    (dict(warmup_steps=500, learning_rate_decay_type="cosine"), 60, 0.012,
     59),
    # 0.1 x 20 / 50 = 0.04 at step 19, whatever decays after the warm-up.
    (dict(warmup_steps=50, learning_rate_decay_type="exponential"), 20,
     0.04, 19),
    # Warm-up done at step 9 (0.1 x 10 / 10): the requested 0.1.
    (dict(warmup_steps=10, learning_rate_decay_type="polynomial"), 30, 0.1,
     9),
    # No warm-up: every schedule starts at its peak, step 0.
    (dict(learning_rate_decay_type="cosine"), 5, 0.1, 0),
    (dict(learning_rate_decay_type="fixed"), 5, 0.1, 0)])
def test_the_peak_is_the_schedules(fields, max_steps, peak, step):
  reached, at = advice.peak_learning_rate(config(**fields), max_steps)
  assert reached == pytest.approx(peak, rel=1e-6)
  assert at == step
  warned = advice.unreached_peak_advice(config(**fields), max_steps)
  assert (warned is None) == (peak == 0.1)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunks_of_steps_find_the_same_peak(chunk):
  # Warm-up to 0.1 x 20 / 40 = 0.05 at step 19, the run's last.
  schedule = config(warmup_steps=40, learning_rate_decay_type="cosine")
  whole = advice.peak_learning_rate(schedule, 20)
  assert advice.peak_learning_rate(schedule, 20, chunk) == whole
  assert whole == pytest.approx((0.05, 19), rel=1e-6)


def test_a_run_shorter_than_its_warm_up_warns_with_the_peak(tmp_path, caplog):
  caplog.set_level(logging.WARNING, logger="absl")
  # 0.1 x (1 + 1) / 4 = 0.05 at step 1, the run's last.
  assert run_in_process("train", [
      *SMALL_RUN, f"--model_dir={tmp_path}/m", "--max_steps=2",
      "--warmup_steps=4", "--learning_rate=0.1"]) == 0
  warnings = [record.getMessage() for record in caplog.records
              if "peaks at" in record.getMessage()]
  assert warnings == [
      "--max_steps=2 ends before the warm-up (--warmup_steps=4) does: the "
      "learning rate peaks at 0.05 (step 1), not the requested "
      "--learning_rate=0.1. Raise --max_steps above 4, or lower "
      "--warmup_steps to at most 2."]


@pytest.mark.parametrize("model_name", ["lenet", "mlp"])
def test_sync_batch_norm_without_batch_norm_is_refused(model_name, tmp_path,
                                                       capsys, caplog):
  caplog.set_level(logging.INFO, logger="absl")
  model_dir = tmp_path / "m"
  assert run_in_process("train", [
      *SMALL_RUN, f"--model_name={model_name}", f"--model_dir={model_dir}",
      "--max_steps=2", "--sync_batch_norm"]) == 2
  line = the_error_line(capsys.readouterr().err, "train")
  assert line == (
      f"train.py: error: --sync_batch_norm was given, but --model_name="
      f"{model_name} has no batch-norm layer, so the flag would have no "
      "effect (it synchronizes the batch norm of nets such as resnet_v1_50 "
      "and inception_v3); drop --sync_batch_norm.")
  assert "synchronized batch norm" not in caplog.text
  assert not any(name.startswith("model.ckpt") for name in (
      os.listdir(model_dir) if model_dir.exists() else []))


def test_a_batch_norm_net_keeps_sync_batch_norm():
  advice.check_sync_batch_norm(True, "resnet_v2_50")  # no error.
  advice.check_sync_batch_norm(False, "lenet")  # the flag not given.
