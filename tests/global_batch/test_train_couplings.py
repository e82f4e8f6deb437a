"""Raw-op couplings of the batch in TRAIN: one device's variables on 2 and 3
towers, uneven batches and a batch smaller than the towers (contract 24)."""

import pytest

import estimator_multigpu as emg

from tests import harness
from tests.global_batch import cases

STEPS = 2
LOOPS = ("foldl_statistic", "map_fn_statistic")


@pytest.mark.parametrize("name", sorted(cases.TRAIN_LOSSES))
@pytest.mark.parametrize("towers,batch", [(2, 7), (3, 7), (3, 2)])
def test_one_device_variables(name, towers, batch, session_config):
  loss_of = cases.TRAIN_LOSSES[name]
  if name in LOOPS:
    pytest.xfail("tf.map_fn / tf.foldl bodies are kept per shard (a While "
                 "op is not rewritten yet): not one device's")
  if batch < 3 and name in ("sort_top_k",):
    pytest.skip("top_k of 2 needs 2 examples")
  features, labels = cases.data(batch)
  want, want_loss = harness.train(cases.train_model_fn(loss_of), features,
                                  labels, STEPS, session_config)
  got, got_loss = harness.train(
      cases.train_model_fn(loss_of, emg.TowerOptimizer), features, labels,
      STEPS, session_config, num_towers=towers, global_batch=True)
  assert abs(got_loss - want_loss) < 1e-5, (got_loss, want_loss)
  # Normalizing 2 examples by their spread divides by a small std: float32
  # rounding of the global mean (Σᵢ nᵢ/n · meanᵢ vs one sum) grows to ~2e-5
  # on CPUs without AVX-512 (the values are ~1-5): 1e-4 there, 1e-5 else.
  ill_conditioned = batch < 3 and name in ("advantage_moments",
                                           "centered_by_hand")
  harness.assert_same_variables(got, want,
                                atol=1e-4 if ill_conditioned else 1e-5)
