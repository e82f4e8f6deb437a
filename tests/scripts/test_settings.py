"""The scripts' helpers called with settings built by hand, no absl flags;
and the flags' defaults are the settings' defaults."""

import numpy as np
import pytest

import estimator_multigpu as emg

from cli import cluster_task
from cli import run_estimator
from cli import run_plan
from cli import run_setup
from cli import settings
from cli import towers as towers_lib
from cli.flags import definitions as cli_flags
from cli.flags import optimization
import eval as eval_script
import export
import train

DIGITS = run_setup.ModelSetup("mlp", 10, 8, "digits", None,  # 8x8, 0..9.
                              dataset_split_name="train",
                              preprocessing_name="resize")


@pytest.mark.usefixtures("parsed_flags")
@pytest.mark.parametrize("script", [train, eval_script, export])
def test_flags_left_at_their_defaults_give_the_default_settings(script):
  assert cli_flags.read(script.Settings) == script.Settings()


def first_batch(input_fn):
  images, labels = next(iter(input_fn()))
  return images.numpy(), labels.numpy()


def test_train_input_fn_reads_the_settings_batch_and_seed():
  given = settings.TrainSettings(data=settings.DataSettings(batch_size=5),
                                 run=settings.RunSettings(random_seed=3))
  images, labels = first_batch(run_plan.train_input_fn(given, DIGITS))
  # 5 digits of 8x8 pixels, one channel, pixels 0..16 scaled by 1/16.
  assert images.shape == (5, 8, 8, 1) and labels.shape == (5,)
  assert images.min() >= 0.0 and images.max() <= 1.0
  assert set(labels) <= set(range(10))
  again, _ = first_batch(run_plan.train_input_fn(given, DIGITS))
  other, _ = first_batch(run_plan.train_input_fn(given, DIGITS, trainer=1))
  np.testing.assert_array_equal(images, again)  # seed 3 both times.
  assert not np.array_equal(images, other)  # trainer 1 shuffles with 4.


@pytest.fixture
def multi_gpu_calls(monkeypatch):
  calls = []
  real = emg.multi_gpu

  def spy(model_fn, **options):
    calls.append(options)
    return real(model_fn, **options)

  monkeypatch.setattr(emg, "multi_gpu", spy)
  return calls


def test_make_estimator_takes_everything_from_the_settings(tmp_path,
                                                           multi_gpu_calls):
  given = settings.TrainSettings(
      model=settings.ModelSettings(model_name="mlp"),
      multi_gpu=settings.MultiGpuSettings(
          moving_average_decay=0.99, clip_gradients_by_norm=2.0,
          variable_update="replicated", accumulate_steps=3),
      run=settings.RunSettings(model_dir=str(tmp_path), random_seed=5,
                               save_summary_steps=7))
  towers = towers_lib.resolve_towers(None, None, 2)
  estimator = run_estimator.make_estimator(
      given, None, towers, optimization.classifier_config(given, 10),
      (11, None))
  assert (estimator.model_dir, estimator.config.tf_random_seed,
          estimator.config.save_summary_steps,
          estimator.config.save_checkpoints_steps) == (str(tmp_path), 5, 7,
                                                       11)
  assert estimator.params["classifier"].model_name == "mlp"
  assert [{key: call[key] for key in ("ema_decay", "clip_gradients_by_norm",
                                      "variable_update", "accumulate_steps")}
          for call in multi_gpu_calls] == [
              {"ema_decay": 0.99, "clip_gradients_by_norm": 2.0,
               "variable_update": "replicated", "accumulate_steps": 3}]


def test_classifier_config_schedule_from_the_settings():
  given = settings.TrainSettings(optimization=settings.OptimizationSettings(
      max_steps=100, warmup_steps=20, learning_rate=0.2))
  config = optimization.classifier_config(given, 7)
  # decay_steps defaults to max_steps - warmup_steps = 100 - 20.
  assert (config.decay_steps, config.learning_rate, config.num_classes,
          config.model_name) == (80, 0.2, 7, "lenet")
  epochs = settings.TrainSettings(
      data=settings.DataSettings(batch_size=64),
      multi_gpu=settings.MultiGpuSettings(accumulate_steps=2),
      optimization=settings.OptimizationSettings(
          learning_rate_decay_type="exponential", num_epochs_per_decay=2))
  # 1,437 training digits, 64 x 2 examples per step: int(1437 / 128 * 2).
  assert optimization.classifier_config(epochs, 10).decay_steps == 22


def test_cluster_task_from_cluster_settings():
  given = settings.ClusterSettings(ps_hosts=("p:1",),
                                   worker_hosts=("w0:1", "w1:1"),
                                   job_name="worker", task_index=1,
                                   sync_replicas=True)
  task = cluster_task.cluster_task(given, None)
  assert task.device == "/job:worker/task:0"  # worker 0 is the chief.
  assert cluster_task.trainer_number(task) == 1
  assert cluster_task.replicas_to_aggregate(task, True) == 2
  assert cluster_task.cluster_task(settings.ClusterSettings(), None) is None
  with pytest.raises(ValueError, match="--sync_replicas synchronizes"):
    cluster_task.cluster_task(settings.ClusterSettings(sync_replicas=True),
                              None)
