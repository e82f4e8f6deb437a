"""The scripts' settings: small frozen dataclasses, one per group of flags.

`main` builds them from the flags once (`cli.flags.definitions.read`) and
passes them down, so every helper of train.py, eval.py and export.py takes
plain arguments and can be called without absl. Each field has the name of
its flag and its default (cli/flags/definitions.py takes the defaults from
here; the `multi_gpu` options' from `Options`, cli/multi_gpu_options.py); list
flags become tuples. `given` holds the names typed on the command line:
those override the model_dir's record (run_config.json).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, FrozenSet, Optional, Tuple

import classifier
from cli import multi_gpu_options

_CLASSIFIER = classifier.ClassifierConfig()
Names = FrozenSet[str]


def defaults(cls: type) -> dict:
  """name -> default of a settings dataclass's fields (its flags')."""
  return {field.name: field.default for field in dataclasses.fields(cls)}


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """Which net: `None` sizes mean the dataset's classes, the net's size."""
  model_name: str = "lenet"
  num_classes: Optional[int] = None
  image_size: Optional[int] = None
  given: Names = frozenset()


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """What the input reads: dataset, split, labels offset, augmentation.

  `dataset_split_name` and `preprocessing_name` None: the script's default
  (or a resume's recorded one); `labels_offset` None: recorded, else 0.
  """
  dataset_name: str = "digits"
  dataset_dir: Optional[str] = None
  batch_size: int = 64
  dataset_split_name: Optional[str] = None
  labels_offset: Optional[int] = None
  preprocessing_name: Optional[str] = None
  given: Names = frozenset()


@dataclasses.dataclass(frozen=True)
class TowerSettings:
  """Where the towers run: at most one of the first three; all None: every
  GPU, else 2 virtual CPUs. `gpus` pins the process to those GPUs."""
  num_gpus: Optional[int] = None
  devices: Optional[Tuple[str, ...]] = None
  virtual_cpus: Optional[int] = None
  gpus: Optional[Tuple[str, ...]] = None


# train.py's options of `emg.multi_gpu`: a field per row of its table.
MultiGpuSettings = multi_gpu_options.MultiGpuSettings


@dataclasses.dataclass(frozen=True)
class OptimizationSettings:
  """The optimizer, the loss and the learning-rate schedule (train.py).

  `decay_steps` None: `max_steps` minus `warmup_steps` (at least 1), unless
  `num_epochs_per_decay` sets the period in epochs.
  """
  max_steps: int = 1500
  optimizer: str = "momentum"
  learning_rate: float = 0.05
  momentum: float = 0.9
  weight_decay: float = 1e-4
  label_smoothing: float = 0.0
  learning_rate_decay_type: str = "cosine"
  decay_steps: Optional[int] = None
  num_epochs_per_decay: Optional[float] = None
  learning_rate_decay_factor: float = _CLASSIFIER.decay_rate
  staircase: bool = False
  end_learning_rate: float = 0.0
  warmup_steps: int = 50


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
  """tf-slim's per-optimizer settings (`classifier.OPTIMIZER_SETTINGS`)."""
  adam_beta1: float = _CLASSIFIER.adam_beta1
  adam_beta2: float = _CLASSIFIER.adam_beta2
  opt_epsilon: Optional[float] = _CLASSIFIER.opt_epsilon
  rmsprop_decay: float = _CLASSIFIER.rmsprop_decay
  rmsprop_momentum: float = _CLASSIFIER.rmsprop_momentum
  adadelta_rho: float = _CLASSIFIER.adadelta_rho
  adagrad_initial_accumulator_value: float = (
      _CLASSIFIER.adagrad_initial_accumulator_value)
  ftrl_learning_rate_power: float = _CLASSIFIER.ftrl_learning_rate_power
  ftrl_initial_accumulator_value: float = (
      _CLASSIFIER.ftrl_initial_accumulator_value)
  ftrl_l1: float = _CLASSIFIER.ftrl_l1
  ftrl_l2: float = _CLASSIFIER.ftrl_l2


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """Where train.py writes, how often, and how it logs and stops."""
  model_dir: str = "runs/digits"
  random_seed: int = 1
  save_checkpoints_steps: Optional[int] = 500
  save_checkpoints_secs: Optional[int] = None
  save_summary_steps: int = 100
  min_free_disk_mb: int = 50
  stop_grace_secs: int = 30
  log_every_n_steps: Optional[int] = None
  scaling_report: bool = True
  check_towers: bool = False
  given: Names = frozenset()


@dataclasses.dataclass(frozen=True)
class ClusterSettings:
  """train.py on a cluster (no hosts and no TF_CONFIG: a local run)."""
  ps_hosts: Optional[Tuple[str, ...]] = None
  worker_hosts: Optional[Tuple[str, ...]] = None
  job_name: Optional[str] = None
  task_index: int = 0
  sync_replicas: bool = False
  ps_wait_secs: int = 120
  ps_linger_secs: int = 60
  eval_timeout_secs: int = 600
  peer_timeout_secs: int = 120


@dataclasses.dataclass(frozen=True)
class FineTuningSettings:
  """tf-slim's fine-tuning (cli/fine_tuning.py); `trainable_scopes` None:
  a resume's recorded scopes, () trains every variable."""
  checkpoint_path: Optional[str] = None
  checkpoint_exclude_scopes: Optional[Tuple[str, ...]] = None
  trainable_scopes: Optional[Tuple[str, ...]] = None
  ignore_missing_vars: bool = False


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """Everything train.py's flags say, by group."""
  SCRIPT: ClassVar[str] = "train.py"  # whose flags (cli/flags/use_table.py).
  model: ModelSettings = ModelSettings()
  data: DataSettings = DataSettings()
  towers: TowerSettings = TowerSettings()
  multi_gpu: MultiGpuSettings = MultiGpuSettings()
  optimization: OptimizationSettings = OptimizationSettings()
  optimizer: OptimizerSettings = OptimizerSettings()
  run: RunSettings = RunSettings()
  cluster: ClusterSettings = ClusterSettings()
  fine_tuning: FineTuningSettings = FineTuningSettings()


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
  """Which checkpoints eval.py evaluates, and how.

  `max_steps` counts only when given: else the recorded last step.
  """
  model_dir: str = "runs/digits"
  checkpoint_path: Optional[str] = None
  max_steps: int = 1500
  once: bool = False
  timeout_secs: int = 600
  max_num_batches: Optional[int] = None
  use_ema_weights: bool = True
  eval_events_dir: Optional[str] = None  # the model-dir room (issue 35).
  given: Names = frozenset()


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """Everything eval.py's flags say, by group."""
  SCRIPT: ClassVar[str] = "eval.py"  # whose flags (cli/flags/use_table.py).
  model: ModelSettings = ModelSettings()
  data: DataSettings = DataSettings()
  towers: TowerSettings = TowerSettings()
  evaluation: EvaluationSettings = EvaluationSettings()


@dataclasses.dataclass(frozen=True)
class ExportSettings:
  """What export.py writes (`export_dir`) from which checkpoint."""
  SCRIPT: ClassVar[str] = "export.py"  # whose flags (cli/flags/use_table.py).
  model_dir: str = "runs/digits"
  export_dir: Optional[str] = None
  checkpoint_path: Optional[str] = None
  use_ema_weights: bool = True
  model: ModelSettings = ModelSettings()
  data: DataSettings = DataSettings()
