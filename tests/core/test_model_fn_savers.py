"""A Saver or Scaffold the model_fn builds saves what one device's would.

The model_fn builds its Saver at its end (Object Detection's
`Saver(sharded=True)`, a `var_list` as a list or a dict); with several towers
the optimizer's slots (and the package's own state, such as EMA shadows)
are created after it returns. Each case trains 2 steps, resumes for 2 more
(a new Estimator on the same model dir) and compares every variable, and the
names the checkpoint holds, with one device doing the same.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_multigpu as emg

tf1 = tf.compat.v1

RNG = np.random.RandomState(42)
X = RNG.randn(7, 3).astype(np.float32)  # 7 examples: uneven on 2 and 3 towers.
Y = RNG.randn(7, 2).astype(np.float32)


def _saver(spelling):
  """The model_fn's own Saver (or Scaffold), built after `minimize`."""
  if spelling == "list":
    return tf1.train.Scaffold(saver=tf1.train.Saver(
        var_list=tf1.global_variables(), max_to_keep=2))
  if spelling == "dict":
    return tf1.train.Scaffold(saver=tf1.train.Saver(
        var_list={v.op.name: v for v in tf1.global_variables()}))
  if spelling == "sharded":  # Object Detection: the collection and scaffold.
    saver = tf1.train.Saver(sharded=True, save_relative_paths=True)
    tf1.add_to_collection(tf1.GraphKeys.SAVERS, saver)
    return tf1.train.Scaffold(saver=saver)
  if spelling == "collection":  # no scaffold: Estimator finds it there.
    tf1.add_to_collection(tf1.GraphKeys.SAVERS,
                          tf1.train.Saver(max_to_keep=3))
    return None
  assert spelling == "init_op"  # a Scaffold with its own init_op, no Saver.
  return tf1.train.Scaffold(init_op=tf1.global_variables_initializer())


def make_model_fn(spelling, wrapped, ema=False):
  """`ema` (one device): the moving average `ema_decay=0.5` keeps, by hand."""
  def model_fn(features, labels, mode):
    pred = tf1.layers.dense(features, 2, name="feat",
                            kernel_initializer=tf1.constant_initializer(0.3))
    loss = tf1.losses.mean_squared_error(labels, pred)
    opt = tf1.train.MomentumOptimizer(0.1, 0.9)
    opt = emg.TowerOptimizer(opt) if wrapped else opt
    train_op = opt.minimize(loss, tf1.train.get_or_create_global_step())
    if ema:
      average = tf1.train.ExponentialMovingAverage(
          0.5, num_updates=tf1.train.get_or_create_global_step())
      with tf.control_dependencies([train_op]):
        train_op = average.apply(tf1.trainable_variables())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      scaffold=_saver(spelling))
  return model_fn


def train_twice(model_fn, model_dir, session_config, max_to_keep_2=False):
  """Trains 2 steps, then 2 more in a new Estimator (a resume); the
  checkpoints kept are those of steps 0, 2 and 4, or the last 2."""
  config = tf.estimator.RunConfig(model_dir=model_dir,
                                  session_config=session_config,
                                  save_summary_steps=1000)
  for _ in range(2):
    est = tf.estimator.Estimator(model_fn, config=config)
    est.train(lambda: tf.data.Dataset.from_tensors((X, Y)).repeat(), steps=2)
  kept = tf.train.get_checkpoint_state(model_dir).all_model_checkpoint_paths
  assert len(kept) == (2 if max_to_keep_2 else 3)  # steps 0, 2, 4.
  reader = tf.train.load_checkpoint(est.latest_checkpoint())
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}


_ONE_DEVICE = {}


def one_device(spelling, tmp_path_factory, session_config, ema):
  key = (spelling, ema)
  if key not in _ONE_DEVICE:
    fn = make_model_fn(spelling, wrapped=False, ema=ema)
    _ONE_DEVICE[key] = train_twice(fn, str(tmp_path_factory.mktemp("one")),
                                   session_config, spelling == "list")
  return _ONE_DEVICE[key]


def assert_same_checkpoint(got, want):
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], atol=1e-5,
                               err_msg=name)


@pytest.mark.parametrize("spelling,towers,variable_update", [
    ("list", 2, "shared"), ("dict", 3, "replicated"), ("sharded", 3, "shared"),
    ("sharded", 2, "replicated"), ("collection", 3, "replicated"),
    ("init_op", 2, "shared")])
def test_model_fn_saver_resumes_like_one_device(
    spelling, towers, variable_update, tmp_path, tmp_path_factory,
    session_config):
  want = one_device(spelling, tmp_path_factory, session_config, ema=False)
  assert "feat/kernel/Momentum" in want
  fn = emg.multi_gpu(make_model_fn(spelling, wrapped=True),
                     devices=[f"/cpu:{i}" for i in range(towers)],
                     variable_update=variable_update)
  assert_same_checkpoint(train_twice(fn, str(tmp_path), session_config,
                                     max_to_keep_2=spelling == "list"), want)


@pytest.mark.parametrize("towers", [2])
def test_model_fn_saver_keeps_the_ema_shadows(towers, tmp_path,
                                              tmp_path_factory,
                                              session_config):
  want = one_device("dict", tmp_path_factory, session_config, ema=True)
  assert "feat/kernel/ExponentialMovingAverage" in want
  fn = emg.multi_gpu(make_model_fn("dict", wrapped=True),
                     devices=[f"/cpu:{i}" for i in range(towers)],
                     ema_decay=0.5)
  assert_same_checkpoint(train_twice(fn, str(tmp_path), session_config), want)


def test_model_fn_saver_saves_what_the_default_one_does(tmp_path,
                                                        session_config):
  """With the package's own state (accumulation, EMA), the model_fn's Saver
  writes the checkpoint the package's default Saver writes: the same
  variables, the same values after a resume."""
  options = dict(devices=["/cpu:0", "/cpu:1"], accumulate_steps=2,
                 ema_decay=0.5, variable_update="replicated")
  fns = {"own": make_model_fn("sharded", wrapped=True),
         "default": _without_scaffold(make_model_fn("list", wrapped=True))}
  runs = {name: train_twice(emg.multi_gpu(fn, **options),
                            str(tmp_path / name), session_config)
          for name, fn in fns.items()}
  assert "feat/kernel/ExponentialMovingAverage" in runs["default"]
  assert_same_checkpoint(runs["own"], runs["default"])


def _without_scaffold(model_fn):
  """The model_fn, returning an empty Scaffold (Estimator's own Saver)."""
  def stripped(features, labels, mode):
    return model_fn(features, labels, mode)._replace(
        scaffold=tf1.train.Scaffold())
  return stripped


def _own_saver_model_fn(spelling):
  """A model_fn whose Saver (built after `minimize`) saves `feat/kernel`
  only: as itself ("partial") or under another name ("renamed")."""
  def model_fn(features, labels, mode):
    pred = tf1.layers.dense(features, 2, name="feat",
                            kernel_initializer=tf1.constant_initializer(0.3))
    loss = tf1.losses.mean_squared_error(labels, pred)
    train_op = emg.TowerOptimizer(tf1.train.MomentumOptimizer(
        0.1, 0.9)).minimize(loss, tf1.train.get_or_create_global_step())
    kernel, = [v for v in tf1.global_variables() if v.op.name == "feat/kernel"]
    var_list = [kernel] if spelling == "partial" else {"pretrained/w": kernel}
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train_op,
        scaffold=tf1.train.Scaffold(saver=tf1.train.Saver(var_list)))
  return model_fn


@pytest.mark.parametrize("towers", [2, 3])
@pytest.mark.parametrize("spelling", ["partial", "renamed"])
def test_a_partial_or_renamed_saver_keeps_its_var_list(spelling, towers,
                                                       tmp_path,
                                                       session_config):
  """The Saver writes what it was given, under its names, plus only the
  slots and averages of those variables (named after them): not the bias,
  not global_step, not the bias's slot or average."""
  fn = emg.multi_gpu(_own_saver_model_fn(spelling),
                     devices=[f"/cpu:{i}" for i in range(towers)],
                     ema_decay=0.5)
  with tf.Graph().as_default():
    tf1.train.get_or_create_global_step()
    spec = fn(tf.constant(X), tf.constant(Y), tf.estimator.ModeKeys.TRAIN,
              {}, tf.estimator.RunConfig(session_config=session_config))
    saver = spec.scaffold.saver
    by_name = {v.op.name: v for v in tf1.global_variables()}
    with tf1.Session(config=session_config) as session:
      session.run(tf1.global_variables_initializer())
      session.run(spec.train_op)
      path = saver.save(session, str(tmp_path / "own"))
      values = session.run(by_name)
  saved = dict(tf.train.list_variables(path))
  prefix = "feat/kernel" if spelling == "partial" else "pretrained/w"
  suffixes = ["", "/Momentum", "/ExponentialMovingAverage"]
  assert sorted(saved) == sorted(prefix + s for s in suffixes)
  for suffix in suffixes:
    np.testing.assert_allclose(tf.train.load_variable(path, prefix + suffix),
                               values["feat/kernel" + suffix], atol=1e-6)
  assert np.abs(values["feat/kernel/Momentum"]).max() > 1e-3  # it trained.
