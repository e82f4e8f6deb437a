"""The one reader of the graph (`graph/dataflow.py`, #45).

The walker on small hand-built graphs (data and control edges, a stop set,
an `IdentityN` output by output, the bodies of a `tf.cond` and a
`tf.while_loop`), `is_collective` on TensorFlow's and NCCL's collectives
(built, never run), and that no other module of the package lists op types:
each set of op types is named once, by meaning, in `dataflow.py`.
"""

import ast
import pathlib

import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

import estimator_multigpu
from estimator_multigpu.graph import dataflow

tf1 = tf.compat.v1
PACKAGE = pathlib.Path(estimator_multigpu.__file__).parent


@pytest.fixture(name="graph")
def graph_fixture():
  with tf.Graph().as_default() as graph:
    yield graph


def _names(ops) -> set:
  return {op.name for op in ops}


def test_data_edges_only_by_default_control_edges_on_request(graph):
  # c = a + 1, built after b (a control input): b is reached only with
  # control=True.
  del graph
  a = tf.constant(1.0, name="a")
  b = tf.constant(2.0, name="b")
  with tf.control_dependencies([b.op]):
    c = tf.add(a, 1.0, name="c")
  assert _names(dataflow.ancestors([c])) == {"a", "c", "c/y"}
  assert _names(dataflow.ancestors([c], control=True)) == {
      "a", "b", "c", "c/y"}
  assert _names(dataflow.ancestors([c.op])) == {"a", "c", "c/y"}


def test_stop_ops_are_reached_not_walked_past_stop_tensors_not_crossed(
    graph):
  del graph
  x = tf1.placeholder(tf.float32, name="x")
  y = tf.square(x, name="y")
  z = tf.negative(y, name="z")
  assert _names(dataflow.ancestors([z])) == {"x", "y", "z"}
  assert _names(dataflow.ancestors([z], stop={y.op})) == {"y", "z"}
  assert _names(dataflow.ancestors([z], stop={y})) == {"z"}
  assert _names(dataflow.ancestors(
      [z], stop=lambda op: op.type == "Square")) == {"y", "z"}


def test_identity_n_output_by_output(graph):
  # tf.custom_gradient's IdentityN: output 0 is input 0 only.
  del graph
  a = tf.constant(1.0, name="a")
  b = tf.constant(2.0, name="b")
  first, _ = tf.identity_n([a, b], name="pair")
  assert _names(dataflow.ancestors([first])) == {"a", "b", "pair"}
  assert _names(dataflow.ancestors([first], per_output=True)) == {
      "a", "pair"}
  assert _names(dataflow.ancestors([first.op], per_output=True)) == {
      "a", "b", "pair"}


def test_walk_yields_each_op_once_and_stops_when_asked(graph):
  del graph
  a = tf.constant(1.0, name="a")
  b = tf.add(a, a, name="b")
  walked = list(dataflow.walk([b, b.op]))
  assert sorted(op.name for op in walked) == ["a", "b"]
  assert next(dataflow.walk([b])).name == "b"  # the root first.


def test_before_follows_the_named_op_types_back(graph):
  del graph
  x = tf1.placeholder(tf.float32, [2, 3], name="x")
  y = tf.cast(tf.reshape(tf.square(x), [6]), tf.float64)
  assert dataflow.before(y, dataflow.SAME_VALUES).op.type == "Square"
  assert dataflow.before(y, {"Cast"}).op.type == "Reshape"
  assert dataflow.before(x, dataflow.SAME_VALUES) is x


def test_cond_branches_only_with_bodies(graph):
  del graph
  x = tf1.placeholder(tf.float32, [], name="x")
  pred = tf1.placeholder(tf.bool, [], name="pred")
  out = tf.cond(pred, lambda: tf.multiply(x, 3.0, name="tripled"),
                lambda: tf.identity(x, name="same"))
  cond = [op for op in dataflow.ancestors([out])
          if op.type in dataflow.CONDS]
  assert cond, "tf.cond built no If op (control flow v1?)"
  outside = _names(dataflow.ancestors([out]))
  inside = _names(dataflow.ancestors([out], bodies=True))
  assert {"x", "pred"} <= outside and "tripled" not in outside
  assert {"tripled", "same"} <= inside
  assert outside <= inside


def test_while_loop_body_only_with_bodies(graph):
  del graph
  start = tf.constant(0, name="start")
  out = tf.while_loop(lambda i: i < 5,
                      lambda i: tf.add(i, 1, name="step"), [start])[0]
  assert any(op.type in ("While", "StatelessWhile")
             for op in dataflow.ancestors([out]))
  assert "step" not in _names(dataflow.ancestors([out]))
  assert "step" in _names(dataflow.ancestors([out], bodies=True))
  assert "start" in _names(dataflow.ancestors([out]))


def test_is_collective_knows_tensorflow_and_nccl_collectives(graph):
  del graph
  x = tf.constant([1.0, 2.0])
  reduced = tf.raw_ops.CollectiveReduceV2(
      input=x, group_size=2, group_key=1, instance_key=1, ordering_token=[],
      merge_op="Add", final_op="Id")
  gathered = tf.raw_ops.CollectiveGatherV2(
      input=x, group_size=2, group_key=1, instance_key=2, ordering_token=[])
  nccl = tf.raw_ops.NcclAllReduce(input=x, reduction="sum", num_devices=2,
                                  shared_name="all_reduce")
  assert reduced.op.type == "CollectiveReduceV2"
  assert nccl.op.type == "NcclAllReduce"
  for tensor in (reduced, gathered, nccl):
    assert dataflow.is_collective(tensor.op), tensor.op.type
  assert not dataflow.is_collective(tf.add(x, x).op)


def _is_op_type(value) -> bool:
  return isinstance(value, str) and op_def_registry.get(value) is not None


# Collections of op types kept outside dataflow.py, with the reason.
ALLOWED = {
    # A value per op type (the fixed draw of each random op), not a set.
    ("check.py", "_FIXED_RANDOM"),
    # Maps reductions to the statistic kinds defined beside it.
    ("graph/shard_statistics.py", "_KIND_OF_REDUCTION"),
    # The checkpoint restores a Scaffold's init_fn runs (issue 52).
    ("graph/state_updates.py", "_RESTORES"),
}


def _op_type_collections(tree) -> list:
  """(name assigned or None, line) of each literal set, frozenset, list,
  tuple or dict holding two or more op types."""
  assigned = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Assign):
      name, value = getattr(node.targets[0], "id", None), node.value
      assigned[id(value)] = name
      if isinstance(value, ast.Call) and value.args:  # frozenset([...])
        assigned[id(value.args[0])] = name
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Dict):
      strings = node.keys
    elif isinstance(node, (ast.Set, ast.List, ast.Tuple)):
      strings = node.elts
    else:
      continue
    types = [s.value for s in strings
             if isinstance(s, ast.Constant) and _is_op_type(s.value)]
    if len(types) >= 2:
      found.append((assigned.get(id(node)), node.lineno))
  return found


def test_op_type_sets_are_defined_only_in_dataflow():
  misplaced = []
  for path in sorted(PACKAGE.rglob("*.py")):
    module = path.relative_to(PACKAGE).as_posix()
    if module == "graph/dataflow.py" or module.startswith(
        "graph/global_batch/"):
      continue  # the op table of batch semantics (contract item 24).
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for name, line in _op_type_collections(tree):
      if (module, name) not in ALLOWED:
        misplaced.append(f"{module}:{line} {name}")
  assert not misplaced, (
      "Sets of op types belong in graph/dataflow.py, named by meaning: "
      + ", ".join(misplaced))


def test_dataflow_sets_hold_op_types():
  # Every name of a set is an op type TensorFlow registers (a typo would
  # silently never match), but for kinds this TensorFlow does not build.
  unregistered = {"SetDiff1d", "AutoReloadVariable"}
  for name, value in vars(dataflow).items():
    if name.isupper() and isinstance(value, frozenset):
      missing = {t for t in value if not _is_op_type(t)} - unregistered
      assert not missing, (name, missing)
