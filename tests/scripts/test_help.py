"""`--help` of each script: all of its flags, grouped, no TF/absl internals."""

import os
import re
import subprocess
import sys

from absl import flags
import pytest

from cli.flags import definitions as cli_flags
from cli.flags import grouped_help
import eval as eval_script
import export
import train

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INTERNALS = ("--logtostderr", "--only_check_args", "--pdb_post_mortem",
             "--run_with_profiling", "--log_dir", "--use_cprofile_for_profiling")


def flag_names(help_text):
  return set(re.findall(r"^  --(?:\[no\])?(\w+)", help_text, re.M))


def groups(help_text):
  return re.findall(r"^(\w[\w -]*):$", help_text, re.M)


def script_flags(script):
  """The flags of the groups the script defines (cli/flags/definitions.py)."""
  return set(cli_flags.names(*script.FLAG_GROUPS))


@pytest.mark.parametrize("script,expected_groups", [
    (train, ["Start here", "Model", "Data", "Towers", "Optimization",
             "Checkpoints", "Fine-tuning", "Cluster", "Logging"]),
    (eval_script, ["Start here", "Model", "Data", "Towers", "Optimization",
                   "Evaluation", "Logging"]),  # its checkpoint flags start.
    (export, ["Start here", "Model", "Data", "Towers", "Optimization",
              "Evaluation", "Export", "Logging"]),
])
def test_help_lists_every_flag_of_the_script_in_groups(script,
                                                       expected_groups):
  own = script_flags(script)
  text = grouped_help.help_text(script.__doc__, names=own)
  assert flag_names(text) == own | {"verbosity"}
  assert groups(text) == expected_groups
  assert "model_name" in own and "batch_size" in own and "virtual_cpus" in own
  assert not any(internal in text for internal in INTERNALS)
  assert text.startswith(script.__doc__.strip().splitlines()[0])
  assert text.rstrip().endswith("--helpfull.")


NEWCOMER = ["model_dir", "dataset_name", "dataset_dir", "model_name",
            "batch_size", "max_steps", "learning_rate", "num_gpus",
            "virtual_cpus", "checkpoint_path"]  # issue 44, in this order.


def test_help_opens_with_the_ten_flags_a_newcomer_needs():
  text = grouped_help.help_text(train.__doc__, names=script_flags(train))
  lines = text.splitlines()
  assert lines[:3] == [train.__doc__.strip().splitlines()[0], "",
                       "Start here:"]
  first = [name for name in re.findall(r"^  --(?:\[no\])?(\w+)", text, re.M)]
  assert first[:10] == NEWCOMER
  assert len(set(first)) == len(first)  # each flag once.
  # then the docstring's rest, then today's groups.
  assert text.index("--checkpoint_path") < text.index(
      "With no flags it trains LeNet") < text.index("Model:") < text.index(
          "--num_classes") < text.index("Data:") < text.index(
              "--dataset_split_name") < text.index("Towers:")
  assert "--[no]sync_replicas" in text and "(default: 'lenet')" in text
  assert "--model_dir" in "\n".join(lines[:8])


def test_a_flag_without_a_group_is_shown_under_other():
  assert grouped_help.grouped(["num_classes", "brand_new"]) == [
      ("Model", ["num_classes"]), ("Other", ["brand_new"])]
  assert grouped_help.grouped(["model_name", "num_classes"]) == [
      ("Start here", ["model_name"]), ("Model", ["num_classes"])]


@pytest.mark.parametrize("argv,wanted", [
    (["train.py", "--help"], True), (["train.py", "-h"], True),
    (["train.py", "--helpshort"], True), (["train.py", "--helpfull"], False),
    (["train.py", "--max_steps=3"], False),
    (["launch", "--", "--help"], False)])
def test_wants_help(argv, wanted):
  assert grouped_help.wants_help(argv) == wanted


@pytest.mark.slow
def test_help_of_each_script_in_a_subprocess():
  for script, must_have in (("train.py", "--learning_rate"),
                            ("eval.py", "--once"),
                            ("export.py", "--export_dir")):
    result = subprocess.run([sys.executable, script, "--help"],
                            capture_output=True, text=True, timeout=120,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    names = flag_names(result.stdout)
    assert {"model_name", "dataset_name", "dataset_dir", "batch_size",
            "model_dir", "num_gpus", "virtual_cpus", "max_steps",
            "image_size", "verbosity"} <= names, script
    assert must_have in result.stdout
    assert not any(internal in result.stdout for internal in INTERNALS)
    assert result.stderr == ""
