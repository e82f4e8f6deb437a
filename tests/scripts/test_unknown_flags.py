"""Issue 35, rows 1 and 5: tf-slim's flag names are refused with this
project's equivalent, every unknown flag of a run in one line, and the
renamed flags (`--eval_split`, `--decay_rate`) have no alias.

Runs go through the scripts' entry point in this process
(`test_mistakes.run_in_process`); one real process is marked slow.
"""

import os
import re
import subprocess
import sys

from absl import flags
import pytest
from test_mistakes import ROOT
from test_mistakes import run_in_process
from test_mistakes import the_error_line

from cli.flags import slim_names
from cli.flags import unknown

pytestmark = pytest.mark.usefixtures("parsed_flags")
SLIM_ONLY = sorted(set(slim_names.slim_flags()) - unknown.OWN_FLAGS)


def test_the_docs_table_is_the_data():
  with open(os.path.join(ROOT, "docs", "tf_slim.md")) as page:
    assert slim_names.markdown_table() in page.read()


def test_the_table_names_slims_flags_that_are_not_ours():
  # tf-slim's train_image_classifier.py / eval_image_classifier.py names.
  assert {"train_dir", "checkpoint_dir", "eval_dir", "num_clones",
          "clone_on_cpu", "max_number_of_steps", "train_image_size",
          "eval_image_size", "master", "task", "worker_replicas",
          "num_ps_tasks", "replicas_to_aggregate", "save_interval_secs",
          "save_summaries_secs", "num_readers", "num_preprocessing_threads",
          "quantize", "quantize_delay", "use_grayscale"} == set(SLIM_ONLY)


@pytest.mark.parametrize("name", SLIM_ONLY)
def test_a_slim_name_is_refused_with_our_equivalent(name, capsys):
  script = "eval" if name in ("checkpoint_dir", "eval_dir") else "train"
  assert run_in_process(script, [f"--{name}=1"]) == 2
  line = the_error_line(capsys.readouterr().err, script)
  expected = slim_names.slim_flags()[name]
  assert f"unknown flag: --{name} is tf-slim's, here {expected}." in line
  assert "did you mean" not in line.lower()


def test_the_issues_examples_name_our_flags(capsys):
  argv = ["--train_dir=/tmp/a", "--num_clones=2", "--max_number_of_steps=5",
          "--dataset_split_name=train"]
  assert run_in_process("train", argv) == 2
  line = the_error_line(capsys.readouterr().err, "train")
  assert line == (
      "train.py: error: unknown flags: --train_dir is tf-slim's, here "
      "--model_dir (both); --num_clones is tf-slim's, here --num_gpus or "
      "--devices, or --virtual_cpus=N for CPU towers; --max_number_of_steps "
      "is tf-slim's, here --max_steps. Rename or drop them (python train.py "
      "--help lists the flags).")


def test_every_unknown_flag_is_named_at_once(capsys):
  argv = ["--checkpoint_dir=/tmp/m", "--batch_sise", "9", "--once",
          "--eval_dir=/tmp/e", "--frobnicate", "--checkpoint_dir=/tmp/n"]
  assert run_in_process("eval", argv) == 2
  line = the_error_line(capsys.readouterr().err, "eval")
  named = re.findall(r"(?:^|; |: )--(\w+) is", line)
  assert named == ["checkpoint_dir", "batch_sise", "eval_dir", "frobnicate"]
  assert "--batch_sise is no flag of eval.py (did you mean --batch_size?)" in (
      line)
  assert "--frobnicate is no flag of eval.py. Rename or drop them" in line


@pytest.mark.parametrize("script,arg,now", [
    ("eval", "--eval_split=test", "dataset_split_name"),
    ("train", "--decay_rate=0.5", "learning_rate_decay_factor")])
def test_renamed_flags_have_no_alias(script, arg, now, capsys):
  assert run_in_process(script, [arg]) == 2
  line = the_error_line(capsys.readouterr().err, script)
  old = arg[2:].split("=")[0]
  assert f"--{old} is the former name of --{now}, renamed without an " in line


def test_the_scan_reads_the_command_line_as_absl_does():
  values = flags.FlagValues()
  flags.DEFINE_string("model_dir", None, "", flag_values=values)
  flags.DEFINE_bool("once", False, "", flag_values=values)
  args = ["--model_dir", "--not_a_flag_but_a_value", "--noonce", "-once",
          "--nomodel_dir", "--x=1", "word", "--y", "--", "--after"]
  # --model_dir takes the next argument as its value; --noonce is the
  # boolean's negation, --nomodel_dir is not (model_dir is a string).
  assert unknown.unknown_names(args, values) == ["nomodel_dir", "x", "y"]
  # --undefok names flags absl then accepts unknown (and their --no form).
  assert unknown.unknown_names(["--undefok", "x,y", "--x=1", "--noy", "--z"],
                               values) == ["z"]


def test_another_scripts_flag_says_so():
  values = flags.FlagValues()
  assert unknown.explain("export_dir", values, "train.py") == (
      "--export_dir is another script's flag, not train.py's")


def test_a_known_command_line_has_no_problem():
  assert unknown.problem(["train.py", "--model_dir=/tmp/m", "--max_steps",
                          "3", "--nocheck_towers"]) is None


@pytest.mark.slow
def test_a_real_process_names_them_all_in_one_line():
  result = subprocess.run(
      [sys.executable, "train.py", "--train_dir=/tmp/t", "--num_clones=2"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert lines == [
      "train.py: error: unknown flags: --train_dir is tf-slim's, here "
      "--model_dir (both); --num_clones is tf-slim's, here --num_gpus or "
      "--devices, or --virtual_cpus=N for CPU towers. Rename or drop them "
      "(python train.py --help lists the flags)."], result.stderr
