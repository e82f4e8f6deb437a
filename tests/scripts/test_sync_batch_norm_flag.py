"""train.py --sync_batch_norm reaches `multi_gpu` (imported, no subprocess)."""

from absl import flags
import pytest

import estimator_multigpu as emg

from cli import run_estimator
from cli import towers as towers_lib
from cli.flags import definitions as cli_flags
from cli.flags import optimization
import train

FLAGS = flags.FLAGS


pytestmark = pytest.mark.usefixtures("parsed_flags")


@pytest.fixture
def multi_gpu_calls(monkeypatch):
  """Records the keyword options every `emg.multi_gpu` call gets."""
  calls = []
  real = emg.multi_gpu

  def spy(model_fn, **options):
    calls.append(options)
    return real(model_fn, **options)

  monkeypatch.setattr(emg, "multi_gpu", spy)
  return calls


@pytest.mark.parametrize("value", [True, False])
def test_flag_reaches_the_decorator(value, multi_gpu_calls, tmp_path):
  FLAGS.model_name, FLAGS.model_dir = "resnet_v1_50", str(tmp_path)
  FLAGS.sync_batch_norm = value
  towers = towers_lib.resolve_towers(None, None, 2)
  settings = cli_flags.read(train.Settings)
  run_estimator.make_estimator(settings, None, towers,
                               optimization.classifier_config(settings, 10),
                               schedule=(100, None))
  assert [call["sync_batch_norm"] for call in multi_gpu_calls] == [value]


def test_flag_defaults_to_off():
  assert FLAGS["sync_batch_norm"].default is False
