"""Every log line once in a plain script (issue 54, row 1).

A script without absl's `app.run` that wraps a model_fn: absl's first log
call used to `logging.basicConfig()` the root logger, so every TensorFlow
Python warning (its own handler, and the root's) was printed twice. The
package installs one handler (absl's format; not absl's own handler, whose
first line would be "Logging before flag parsing goes to stderr") when it
is imported, whichever of its modules logs first and whether TensorFlow was
imported before it.
Real processes: the handlers are a process's start-up state. TensorFlow's
own C++ start-up lines are not checked: from TF 2.17 `import tensorflow`
alone writes them twice (two libraries, before `TF_CPP_MIN_LOG_LEVEL` is
read); the scripts hold them back (tests/scripts/test_quiet_scripts.py).
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
TRAIN = textwrap.dedent("""
    import numpy as np
    tf1 = tf.compat.v1

    @emg.multi_gpu(devices=["/cpu:0", "/cpu:1"])
    def model_fn(features, labels, mode):
      logits = tf1.layers.dense(features, 3)
      loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
      opt = emg.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.1))
      return tf.estimator.EstimatorSpec(
          mode, loss=loss,
          train_op=opt.minimize(loss, tf1.train.get_global_step()))

    def input_fn():
      x = np.linspace(0, 1, 32, dtype=np.float32).reshape(8, 4)
      y = np.arange(8, dtype=np.int32) % 3
      return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(4)

    config = tf.estimator.RunConfig(
        model_dir=MODEL_DIR, session_config=emg.make_session_config(num_cpus=2))
    tf.estimator.Estimator(model_fn, config=config).train(input_fn,
                                                          max_steps=2)
    absl_logging.warning("the script's own warning")
    """)
IMPORTS = {
    "tensorflow_first": "import tensorflow as tf\nimport estimator_multigpu "
                        "as emg\n",
    "package_first": "import estimator_multigpu as emg\nimport tensorflow as "
                     "tf\n",
}
# A package module that logs before the decorator does.
FIRST_LOG = ("from estimator_multigpu.graph import warn_once\n"
             "warn_once.warn('topic', 'a package warning first')\n")


def run(code: str, tmp_path) -> list:
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="1")
  code = ("from absl import logging as absl_logging\n"
          f"MODEL_DIR = {str(tmp_path / 'model')!r}\n" + code)
  result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stderr.splitlines()


CPP = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages before absl)")


def once(lines: list, text: str) -> None:
  found = [line for line in lines if text in line]
  assert len(found) == 1, (text, found)


@pytest.mark.parametrize("order, first", [
    ("tensorflow_first", ""), ("package_first", FIRST_LOG)])
def test_a_plain_script_prints_each_line_once(order, first, tmp_path):
  lines = run(IMPORTS[order] + first + TRAIN, tmp_path)
  logged = [line for line in lines if line.strip() and not CPP.match(line)
            and not line.startswith(("Instructions for updating",
                                     "Use tf.keras instead", "  "))]
  repeated = sorted({line for line in logged if logged.count(line) > 1})
  assert not repeated, "\n".join(lines)
  assert any("is deprecated" in line for line in lines)  # TF's warnings.
  once(lines, "the script's own warning")
  assert not [line for line in lines if "before flag parsing" in line]
  if first:
    once(lines, "a package warning first")
