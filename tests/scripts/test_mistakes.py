"""Every user mistake ends with one line on stderr: what was given, what was
expected, how to fix it; exit status 2 for bad flags, data or model dirs, 1
for failures at run time; no traceback (cli/entry_point.py).

The table `MISTAKES` has one row per mistake (an id, the script, its argv,
an optional setup that writes bad data or a model dir, the exit status and a
regex the error line must match). Every row runs in this process through
the scripts' entry point (`entry_point.call`: absl parses the argv into the
saved FLAGS, SystemExit's code is the status); `SUBPROCESS_IDS` also run as
real processes (slow) to prove the end-to-end contract. Rows that need a
trained model dir share `trained` (lenet on 8x8 synthetic images, 10
classes, momentum, 2 steps); `bare` is a copy without run_config.json, so
only the checkpoint says what it was written with.

Placeholders in argv: {tmp} (the row's own folder), {trained}, {bare}.
"""

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from typing import Callable, Optional

from absl import flags
from absl import logging as absl_logging
from absl.testing import flagsaver
import bad_inputs as bad
import pytest
import tensorflow as tf

from estimator_multigpu.runtime import checkpoints

from cli import entry_point
from datasets import record_checks
import eval as eval_script
import export
import train

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
SCRIPTS = {"train": train, "eval": eval_script, "export": export}
# absl's log lines, and TensorFlow's C++ ones (WARNING and above when quiet).
LOG_LINE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] |"
                      r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] )")
TRAIN_DEFAULTS = ["--max_steps=2", "--batch_size=8", "--model_dir={tmp}/model"]
SYNTHETIC = ["--dataset_name=synthetic", "--image_size=8", "--model_name=lenet"]
RECORDS = ["--dataset_name=tfrecord", "--dataset_dir={tmp}/data",
           "--image_size=8", "--batch_size=2"]

pytestmark = pytest.mark.usefixtures("parsed_flags")


# ------------------------------------------------------------ the table


@dataclasses.dataclass(frozen=True)
class Mistake:
  id: str
  script: str
  argv: tuple
  status: int
  pattern: str  # re.search on the one error line.
  setup: Optional[Callable[[str], None]] = None


def row(id_, script, argv, pattern, status=2, setup=None):
  return pytest.param(Mistake(id_, script, tuple(argv), status, pattern,
                              setup), id=id_)


MISTAKES = [
    # Flags, refused while absl parses them (cli/flags/validators.py).
    row("batch_size_zero", "train", ["--batch_size=0"],
        r"--batch_size=0: expected a number >= 1"),
    row("batch_size_negative_eval", "eval", ["--batch_size=-4"],
        r"--batch_size=-4: expected a number >= 1"),
    row("image_size_zero", "train", ["--image_size=0"],
        r"--image_size=0: expected a number >= 1"),
    row("num_classes_zero_synthetic", "train",
        [*SYNTHETIC, "--num_classes=0"], r"--num_classes=0: expected a "
        r"number >= 2"),
    row("num_classes_one", "train", ["--num_classes=1"],
        r"--num_classes=1: expected a number >= 2"),
    row("num_classes_other_than_digits", "train", ["--num_classes=5"],
        r"flags dataset_name=digits, num_classes=5: --num_classes=5 but "
        r"--dataset_name=digits has 10 classes \(labels 0..9\); drop "
        r"--num_classes"),
    row("decay_steps_zero", "train", ["--decay_steps=0"],
        r"--decay_steps=0: expected a number >= 1"),
    row("model_name_unknown", "train", ["--model_name=resnet"],
        r"--model_name=resnet: expected one of .*lenet.*resnet_v1_50"),
    row("model_name_unknown_export", "export",
        ["--model_name=lenet5", "--export_dir={tmp}/e"],
        r"--model_name=lenet5: expected one of"),
    row("unknown_flag", "train", ["--bogus=1"],
        r"unknown flag: --bogus is no flag of train.py. Rename or drop it "
        r"\(python train.py --help"),
    row("misspelt_flag", "train", ["--batchsize=3"],
        r"--batchsize is no flag of train.py \(did you mean --batch_size\?\)"),
    row("flag_without_dashes", "train", ["model_name=mlp"],
        r"unexpected argument\(s\) 'model_name=mlp': .* e.g. "
        r"--model_name=mlp"),
    row("not_a_number", "train", ["--max_steps=ten"],
        r"--max_steps=ten: invalid literal"),
    row("unknown_optimizer", "train", ["--optimizer=lamb"],
        r"--optimizer=lamb: value should be one of <sgd\|momentum"),
    row("unknown_dataset", "train", ["--dataset_name=imagenet"],
        r"--dataset_name=imagenet: value should be one of <digits"),
    row("learning_rate_zero", "train", ["--learning_rate=0"],
        r"--learning_rate=0.0: expected a finite number > 0"),
    row("learning_rate_nan", "train", ["--learning_rate=nan"],
        r"--learning_rate=nan: expected a finite number > 0"),
    row("momentum_above_one", "train", ["--momentum=1.5"],
        r"--momentum=1.5: expected a number in \[0, 1\)"),
    row("decay_factor_zero", "train", ["--learning_rate_decay_factor=0"],
        r"--learning_rate_decay_factor=0.0: expected a factor in \(0, 1\]"),
    row("warmup_negative", "train", ["--warmup_steps=-1"],
        r"--warmup_steps=-1: expected a number >= 0"),
    row("weight_decay_negative", "train", ["--weight_decay=-0.1"],
        r"--weight_decay=-0.1: expected a number >= 0"),
    row("label_smoothing_one", "train", ["--label_smoothing=1"],
        r"--label_smoothing=1.0: expected a number in \[0, 1\)"),
    row("ema_decay_one", "train", ["--moving_average_decay=1"],
        r"--moving_average_decay=1.0: expected a number in \(0, 1\)"),
    row("clip_norm_zero", "train", ["--clip_gradients_by_norm=0"],
        r"--clip_gradients_by_norm=0.0: expected a finite number > 0"),
    row("accumulate_steps_zero", "train", ["--accumulate_steps=0"],
        r"--accumulate_steps=0: expected a number >= 1"),
    row("max_steps_zero", "train", ["--max_steps=0"],
        r"--max_steps=0: expected a number >= 1"),
    row("virtual_cpus_zero", "train", ["--virtual_cpus=0"],
        r"--virtual_cpus=0: expected a number >= 1"),
    row("log_every_zero", "train", ["--log_every_n_steps=0"],
        r"--log_every_n_steps=0: expected a number >= 1"),
    row("eval_timeout_negative", "eval", ["--timeout_secs=-1"],
        r"--timeout_secs=-1: expected a number >= 0"),
    row("tfrecord_without_dataset_dir", "train", ["--dataset_name=tfrecord"],
        r"--dataset_name=tfrecord but no --dataset_dir: expected the folder"),
    # Flags that contradict each other or the machine (checked in main).
    row("num_gpus_on_cpu_machine", "train", ["--num_gpus=3"],
        r"--num_gpus=3 but this machine shows 0 GPU\(s\).*--virtual_cpus"),
    row("towers_chosen_twice", "train", ["--devices=/cpu:0",
                                         "--virtual_cpus=2"],
        r"--devices and --virtual_cpus both choose the towers"),
    row("device_misspelt", "train", ["--devices=/tpu:0"],
        r"'/tpu:0' is not a device .* expected '/gpu:<k>' or '/cpu:<k>'"),
    row("never_saves", "train", ["--save_checkpoints_steps=0"],
        r"--save_checkpoints_steps=0 would never write a checkpoint"),
    row("two_save_schedules", "train", ["--save_checkpoints_secs=60",
                                        "--save_checkpoints_steps=10"],
        r"both set when to save; give only one"),
    row("sync_replicas_without_cluster", "train", ["--sync_replicas"],
        r"--sync_replicas synchronizes the workers of a cluster"),
    row("job_name_without_hosts", "train", ["--job_name=worker"],
        r"--ps_hosts is empty; a cluster needs at least one ps"),
    row("export_without_export_dir", "export", ["--model_dir={trained}"],
        r"--export_dir is required"),
    row("split_unknown", "eval", ["--model_dir={tmp}/model",
                                  "--dataset_split_name=test", "--once"],
        r"Unknown split 'test' for dataset 'digits'", setup=bad.empty_model_dir),
    # Data.
    row("dataset_dir_missing", "train", [*RECORDS, "--num_classes=3"],
        r"data_dir '.*/data' is not a directory"),
    row("no_shards_of_the_split", "train", [*RECORDS, "--num_classes=3"],
        r"No TFRecord files for split 'train' in data_dir '.*/data'",
        setup=bad.no_shards),
    row("garbled_labels_file", "train", RECORDS,
        r"labels.txt:1: expected \"<id>:<name>\", got 'zero'",
        setup=bad.garbled_labels_file),
    row("zero_byte_record_file", "train", RECORDS,
        r"Record file .*/data/train-00000-of-00001.tfrecord is empty "
        r"\(0 bytes\)", setup=bad.zero_byte_shard),
    row("truncated_record_file", "train", RECORDS,
        r"Record file .*/data/train-00000-of-00001.tfrecord is damaged from "
        r"record 2 on \(truncated record", setup=bad.truncated_shard),
    row("corrupt_record_file", "train", RECORDS,
        r"Record file .*/data/train-00000-of-00001.tfrecord is damaged from "
        r"record 0 on \(corrupted record", setup=bad.corrupt_shard),
    row("undecodable_image", "train", RECORDS,
        r"the image of record 1 in .*/data/train-00000-of-00001.tfrecord "
        r"cannot be decoded", setup=bad.undecodable_image),
    row("damaged_image", "train", RECORDS,
        r"the image of record 1 in .*/data/train-00000-of-00001.tfrecord "
        r"cannot be decoded \(Invalid PNG", setup=bad.damaged_image),
    row("label_out_of_range", "train", RECORDS,
        r"label 7 of record 1 in .*/data/train-00000-of-00001.tfrecord is "
        r"outside \[0, 3\).*give --num_classes", setup=bad.label_out_of_range),
    row("records_of_one_class", "train", RECORDS,
        r"--dataset_dir=.*/data holds one class, 'c0' \(.*/data/labels.txt\)"
        r": a classifier needs two or more", setup=bad.one_class),
    row("negative_label", "train", RECORDS,
        r"label -1 of record 0 in .*/data/train-00000-of-00001.tfrecord is "
        r"outside \[0, 3\)", setup=bad.negative_label),
    # Model dirs.
    row("model_dir_not_writable", "train",
        ["--model_dir=/proc/estimator_multigpu_test"],
        r"--model_dir=/proc/estimator_multigpu_test cannot be written"),
    row("garbled_run_config", "train", [],
        r"model/run_config.json cannot be read .* fix or delete it",
        setup=bad.garbled_run_config),
    row("other_net_than_recorded", "train", ["--model_dir={trained}",
                                             "--model_name=mlp"],
        r"--model_name=mlp but --model_dir=.* holds checkpoints of "
        r"model_name=lenet"),
    row("other_optimizer_than_checkpoint", "train",
        ["--model_dir={trained}", "--optimizer=adam", "--max_steps=4"],
        r"model.ckpt-2 \(step 2\), written with --optimizer=momentum; this "
        r"run uses --optimizer=adam"),
    row("ema_added_to_a_run_without", "train",
        ["--model_dir={trained}", "--moving_average_decay=0.99",
         "--max_steps=4"],
        r"model.ckpt-2 \(step 2\), which has no moving averages .*drop "
        r"--moving_average_decay"),
    row("other_net_than_checkpoint", "train",
        ["--model_dir={bare}", *SYNTHETIC, "--model_name=mlp"],
        r"written with --model_name=lenet; this run builds --model_name=mlp"),
    row("other_classes_than_checkpoint", "train",
        ["--model_dir={bare}", *SYNTHETIC, "--num_classes=5"],
        r"written with --num_classes=10 \(LeNet/fc4/biases is \[10\]\); this "
        r"run builds --num_classes=5"),
    row("eval_other_net_than_checkpoint", "eval",
        ["--model_dir={bare}", *SYNTHETIC, "--model_name=mlp", "--once"],
        r"written with --model_name=lenet; this run builds --model_name=mlp"),
    row("export_other_classes_than_checkpoint", "export",
        ["--model_dir={bare}", *SYNTHETIC, "--num_classes=5",
         "--export_dir={tmp}/e"],
        r"written with --num_classes=10 .*this run builds --num_classes=5"),
    row("eval_without_checkpoint", "eval", ["--model_dir={tmp}/model",
                                            "--once"],
        r"--model_dir=.*/model holds no checkpoint; run train.py",
        setup=bad.empty_model_dir),
    row("export_checkpoint_path_missing", "export",
        ["--model_dir={trained}", "--checkpoint_path={tmp}/model.ckpt-9",
         "--export_dir={tmp}/e"],
        r"--checkpoint_path=.*/model.ckpt-9 is not a checkpoint: "
        r".*/model.ckpt-9.index does not exist"),
    row("export_without_checkpoint", "export",
        ["--model_dir={tmp}/model", "--export_dir={tmp}/e"],
        r"--model_dir=.*/model holds no checkpoint", setup=bad.empty_model_dir),
    # Issue 26: nothing ignored (cli/flags/use_table.py), nothing too large.
    row("dataset_dir_without_tfrecord", "train", ["--dataset_dir=/tmp/flowers"],
        r"--dataset_dir=/tmp/flowers is used only with --dataset_name="
        r"tfrecord, and this run reads --dataset_name=digits, so it would be "
        r"ignored; add --dataset_name=tfrecord, or drop --dataset_dir\.$"),
    row("eval_timeout_with_once", "eval", ["--model_dir={trained}", "--once",
                                           "--timeout_secs=5"],
        r"--timeout_secs=5 is used only by continuous evaluation .*drop "
        r"--timeout_secs"),
    row("export_batch_size", "export", ["--model_dir={trained}",
                                        "--export_dir={tmp}/e",
                                        "--batch_size=8"],
        r"--batch_size=8 is used only by train.py and eval.py, and export.py "
        r"reads no data"),
    row("export_towers", "export", ["--model_dir={trained}",
                                    "--export_dir={tmp}/e", "--virtual_cpus=4"],
        r"--virtual_cpus=4 is used only by train.py and eval.py"),
    row("eval_moving_average_decay", "eval", ["--model_dir={trained}",
                                              "--once",
                                              "--moving_average_decay=0.9"],
        r"--moving_average_decay=0.9 is used only by train.py .*"
        r"--nouse_ema_weights"),
    row("cluster_flag_on_a_local_run", "train", ["--ps_wait_secs=10"],
        r"--ps_wait_secs=10 is used only on a cluster .* this is a local run"),
    row("task_index_without_job_name", "train", ["--task_index=1"],
        r"--task_index=1 is used only with --job_name"),
    row("batch_larger_than_the_split", "train", ["--batch_size=1000000"],
        r"--batch_size=1000000 is larger than the 1437 examples of split "
        r"'train' of digits.*give --batch_size=1437 or less"),
    row("net_larger_than_the_images", "train", ["--model_name=alexnet_v2"],
        r"--model_name=alexnet_v2 does not fit 8x8 images of digits "
        r"\(Negative dimension size .*\); its default size is 224: give "
        r"--image_size=224"),
    row("net_shrinks_the_images_to_nothing", "train",
        ["--model_name=resnet_v1_50", "--dataset_name=synthetic",
         "--image_size=8"],
        r"--model_name=resnet_v1_50 does not fit 8x8 images of synthetic "
        r"\(it downsamples them by 32: `resnet_v1_50/\S+` strides by 2 "
        r"over a 1x1 map\); it takes 32x32 and larger \(default size 224\):"
        r" give --image_size=32 or more"),
    row("checkpoint_of_another_net", "train",
        ["--model_name=cifarnet", "--checkpoint_path={trained}",
         "--dataset_name=synthetic"],
        r"--checkpoint_path=\S+model.ckpt-2 is another net's: it holds none "
        r"of the 10 variables of the net --model_name builds"),
    row("model_dir_written_by_a_live_run", "train", ["--model_dir={tmp}/model"],
        r"--model_dir=.*/model is being written by another training, PID "
        r"\d+ on host .*give another --model_dir", setup=bad.live_lock),
    # At run time (status 1).
    row("loss_diverges", "train",
        ["--model_name=mlp", "--optimizer=sgd", "--learning_rate=1e12",
         "--warmup_steps=0", "--learning_rate_decay_type=fixed",
         "--max_steps=100", "--save_checkpoints_steps=1000"],
        r"^train.py: error: NonFiniteLossError: The loss is .* at step \d+",
        status=1),
]
SUBPROCESS_IDS = ("batch_size_zero", "corrupt_record_file",
                  "export_other_classes_than_checkpoint", "loss_diverges",
                  "dataset_dir_without_tfrecord", "net_larger_than_the_images")


def the_error_line(stderr: str, script: str) -> str:
  """The one line that is not a log line; fails on anything else."""
  assert "Traceback" not in stderr, stderr[-3000:]
  lines = [line for line in stderr.splitlines()
           if line.strip() and not LOG_LINE.match(line)]
  assert len(lines) == 1, stderr[-3000:]
  assert lines[0].startswith(f"{script}.py: error: "), lines
  return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """{trained}: lenet, synthetic 8x8, 10 classes, momentum, step 2."""
  model_dir = str(tmp_path_factory.mktemp("trained") / "model")
  status = run_in_process("train", [
      f"--model_dir={model_dir}", *SYNTHETIC, "--num_classes=10",
      "--max_steps=2", "--batch_size=8", "--save_checkpoints_steps=2"])
  assert status == 0
  bare = str(tmp_path_factory.mktemp("bare") / "model")
  shutil.copytree(model_dir, bare)
  os.remove(os.path.join(bare, "run_config.json"))
  return {"trained": model_dir, "bare": bare}


def run_in_process(script: str, argv) -> int:
  """The script's entry point on `argv` in this process; its exit status."""
  module = SCRIPTS[script]
  record_checks.forget()
  absl_logger = absl_logging.get_absl_logger()
  level = absl_logger.level  # the script sets it; later tests read INFO.
  try:
    with flagsaver.flagsaver():
      FLAGS.unparse_flags()
      with pytest.raises(SystemExit) as exit_info:
        entry_point.call(module.main, module.__doc__, [f"{script}.py", *argv])
  finally:
    absl_logger.setLevel(level)
  return exit_info.value.code or 0


def prepared_argv(mistake: Mistake, tmp: str, dirs: dict) -> list:
  if mistake.setup is not None:
    mistake.setup(tmp)
  argv = (TRAIN_DEFAULTS if mistake.script == "train" else []) + list(
      mistake.argv)
  return [arg.format(tmp=tmp, **dirs) for arg in argv]


def latest_in(argv) -> str:
  """The latest checkpoint of the argv's --model_dir ('' for none)."""
  dirs = [arg.split("=", 1)[1] for arg in argv
          if arg.startswith("--model_dir=")]
  return (dirs and os.path.isdir(dirs[-1]) and
          tf.train.latest_checkpoint(dirs[-1])) or ""


@pytest.mark.parametrize("mistake", MISTAKES)
def test_mistake_in_process(mistake, trained, tmp_path, capsys):
  argv = prepared_argv(mistake, str(tmp_path), trained)
  before = latest_in(argv)
  capsys.readouterr()
  status = run_in_process(mistake.script, argv)
  line = the_error_line(capsys.readouterr().err, mistake.script)
  assert status == mistake.status, line
  assert re.search(mistake.pattern, line), line
  if status == 2:  # no step trained: nothing saved past the initial
    # checkpoint (Estimator writes model.ckpt-0 before a bad record fails
    # the first step).
    after = latest_in(argv)
    assert after == before or (not before and after.endswith("ckpt-0"))


@pytest.mark.slow
@pytest.mark.parametrize("mistake", [
    m for m in MISTAKES if m.values[0].id in SUBPROCESS_IDS])
def test_mistake_in_a_subprocess(mistake, trained, tmp_path):
  argv = prepared_argv(mistake, str(tmp_path), trained)
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, f"{mistake.script}.py"), *argv],
      capture_output=True, text=True, timeout=300, cwd=ROOT)
  line = the_error_line(result.stderr, mistake.script)
  assert result.returncode == mistake.status, line
  assert re.search(mistake.pattern, line), line


def test_the_table_covers_flags_data_and_model_dirs():
  ids = [m.values[0].id for m in MISTAKES]
  assert len(ids) == len(set(ids)) and len(ids) >= 40
  assert {m.values[0].script for m in MISTAKES} == set(SCRIPTS)


def test_leftovers_of_a_killed_save_go_complete_checkpoints_stay(
    trained, tmp_path, caplog):
  # Issue 17, deliverable 4 (estimator_multigpu.runtime.checkpoints; see also
  # tests/core/test_checkpoints.py): a SIGKILL during a save leaves
  # model.ckpt-N_temp/, removed with an INFO line when training starts.
  model_dir = str(tmp_path / "model")
  shutil.copytree(trained["trained"], model_dir)
  os.makedirs(f"{model_dir}/model.ckpt-3_temp/part")
  caplog.set_level("INFO", logger="absl")
  assert checkpoints.prepare_model_dir(model_dir).endswith("model.ckpt-2")
  assert not os.path.exists(f"{model_dir}/model.ckpt-3_temp")
  assert os.path.exists(f"{model_dir}/model.ckpt-2.index")
  assert f"Removed {model_dir}/model.ckpt-3_temp, left by an interrupted " \
         "checkpoint save." in caplog.text


def test_traceback_on_request(monkeypatch, capsys):
  monkeypatch.setenv(entry_point.TRACEBACK_ENV, "1")
  assert run_in_process("train", ["--model_dir=/proc/emg_test",
                                  "--max_steps=1"]) == 2
  stderr = capsys.readouterr().err
  assert "Traceback (most recent call last)" in stderr
  assert stderr.splitlines()[-1].startswith("train.py: error: --model_dir=")
  assert entry_point.wants_traceback(["train.py", "--verbosity=1"])
  monkeypatch.delenv(entry_point.TRACEBACK_ENV)
  assert not entry_point.wants_traceback(["train.py", "-v", "0"])
