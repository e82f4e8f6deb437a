"""The one reader of the graph: a walker over op inputs, op types by meaning.

Every module that reads the graph's structure asks here (TensorFlow's own
`op_selector.get_backward_walk_ops` is the model: one walker with options):

- `walk` / `ancestors`: the ops some tensors or ops are computed from, along
  data edges and optionally control edges, stopping at a set of ops or
  tensors (or a predicate), optionally through an `IdentityN` output by
  output (`tf.custom_gradient`'s) and into the bodies of the functions an op
  calls (`tf.cond`'s `If`, `tf.while_loop`'s `While`; `function_bodies`);
- `before`: a tensor before the casts, reshapes (any op types) it comes
  through;
- `is_collective`: a cross-tower collective (TensorFlow's `Collective*`,
  NCCL's `Nccl*`);
- the op types the package reads, one set per meaning (below): which ops
  hold, read or write a variable, pass values through, sum, reduce, select
  rows, draw random numbers. A module never lists op types of its own.

What a tensor is relative to a tower's shard is `tensor_kinds`; how a
statistic of the shard combines over the towers is `shard_statistics`.
"""

from __future__ import annotations

from typing import Callable, Collection, Iterable, Iterator, Union

import tensorflow as tf

from estimator_multigpu import compat

# ---------------------------------------------------------------- variables
# Ops whose outputs are their inputs (a handle or a reference passes).
IDENTITIES = frozenset({"Identity", "IdentityN", "RefIdentity"})
# Ops that hold a variable (resource handles; ref variables).
VARIABLES = frozenset({"VarHandleOp", "VariableV2", "Variable"})
# Ops a device function places with the variables: the variables and the
# tables that keep state between steps (`replica_device_setter`'s list).
STATE_HOLDERS = VARIABLES | {
    "AutoReloadVariable", "MutableHashTable", "MutableHashTableV2",
    "MutableHashTableOfTensors", "MutableHashTableOfTensorsV2",
    "MutableDenseHashTable", "MutableDenseHashTableV2"}
# Ops a layer's weight comes from: a variable, or a resource variable's read.
WEIGHT_SOURCES = VARIABLES | {"ReadVariableOp"}
# The op a variable's value is read by: a resource variable's read, or the
# Identity of a ref variable (what an initial value reading one holds).
VARIABLE_READS = frozenset({"ReadVariableOp", "Identity"})
# Stateful ops that take a variable only to read it (or ask about it).
READ_ONLY_VARIABLE_OPS = frozenset({
    "ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape",
    "VarIsInitializedOp", "_ReadVariablesOp", "IsVariableInitialized",
    "DestroyResourceOp"})
# Ops that take a variable and do not write it: reads, identities.
VARIABLE_USES_NOT_WRITING = READ_ONLY_VARIABLE_OPS | IDENTITIES
# Writes of a whole variable (`assign`, `assign_add`, `assign_sub`).
ASSIGNS = frozenset({"AssignVariableOp", "AssignAddVariableOp",
                     "AssignSubVariableOp", "Assign", "AssignAdd",
                     "AssignSub"})
# Writes whose new value is the old one plus (or minus) the written value.
ADDITIVE_WRITES = frozenset({
    "AssignAddVariableOp", "AssignSubVariableOp", "AssignAdd", "AssignSub",
    "ResourceScatterAdd", "ResourceScatterSub", "ScatterAdd", "ScatterSub",
    "ScatterNdAdd", "ScatterNdSub", "ResourceScatterNdAdd",
    "ResourceScatterNdSub"})

# --------------------------------------------------- values passed through
# Ops whose output holds their first input's values (another shape or type).
SAME_VALUES = frozenset({"Identity", "Cast", "Reshape", "Squeeze",
                         "ExpandDims"})
# The same, and a placeholder's default (what a readout's stub holds).
SAME_VALUES_OR_DEFAULT = SAME_VALUES | {"PlaceholderWithDefault"}
# The same, or their negation.
SAME_VALUES_UP_TO_SIGN = SAME_VALUES_OR_DEFAULT | {"Neg"}
# Ops that take a fed value (an export's serving input receiver).
PLACEHOLDERS = frozenset({"Placeholder", "PlaceholderV2"})
# Ops that take the next batch of an input pipeline.
INPUT_DEQUEUES = frozenset({
    "IteratorGetNext", "IteratorGetNextSync", "QueueDequeueV2",
    "QueueDequeueManyV2", "QueueDequeueUpToV2"})
# Ops about a tensor's shape, not its values.
SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastArgs",
                       "BroadcastGradientArgs"})
# `tf.cond`'s ops (control flow v2).
CONDS = frozenset({"If", "StatelessIf"})

# ------------------------------------------------------ sums and products
# Sums of their inputs (an Identity: of its one input).
SUMS_OF_INPUTS = frozenset({"Add", "AddV2", "AddN", "Identity"})
# Sums and differences of their inputs.
SIGNED_SUMS = frozenset({"Add", "AddV2", "Sub", "AddN"})
# Ops whose output is a sum over examples when each input is one (x for
# Cumsum): sums, differences, a negation, a cumulative sum.
LINEAR_IN_SUMS = SIGNED_SUMS | {"Neg", "Cumsum"}
DIVISIONS = frozenset({"RealDiv", "DivNoNan", "Div"})
# A product or a quotient: its first input scaled.
SCALES = DIVISIONS | {"Mul"}
# Sums over examples grouped by a per-example index (Keras AUC's buckets).
SEGMENT_SUMS = frozenset({"UnsortedSegmentSum", "SegmentSum"})
# Per-group sums over the examples: segment sums and histograms.
SUMS_BY_GROUP = SEGMENT_SUMS | {"Bincount", "DenseBincount"}

# ------------------------------------------------------------- reductions
# Reductions over the axes given as their second input.
REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "All", "Any",
                        "ArgMax", "ArgMin", "EuclideanNorm"})
# What a metric's own update adds: sums and counts of what it is fed.
SUMS_AND_COUNTS = frozenset({"Sum", "Size"})
# Ops over the last axis (the batch's, for a vector of scores): a softmax,
# top_k (tf.sort and tf.argsort are built on it).
LAST_AXIS_OPS = frozenset({"Softmax", "LogSoftmax", "TopKV2", "TopK"})
# Cumulative ops along the axis given as their second input.
CUMULATIVE = frozenset({"Cumsum", "Cumprod", "CumulativeLogsumexp"})

# ---------------------------------------------------------- rows selected
# Ops that keep some of the rows of a tensor, whatever their inputs.
ROW_SELECTORS = frozenset({"Where", "Unique", "UniqueV2", "DynamicPartition",
                           "ListDiff", "SetDiff1d"})
# Gathers (rows, when along axis 0).
GATHERS = frozenset({"GatherV2", "Gather", "GatherNd", "ResourceGather"})

# ------------------------------------------- gradients, random draws
# Elementwise ops a transform of a gradient is made of: the gradient keeps
# its variable's shape through them.
ELEMENTWISE = frozenset({
    "Identity", "Mul", "RealDiv", "Div", "DivNoNan", "MulNoNan", "Minimum",
    "Maximum", "ClipByValue", "Select", "SelectV2", "Cast", "Neg",
    "Reciprocal", "Sqrt", "Rsqrt", "Tanh", "Sign", "Abs", "Square"})
# Clipping by value (backpropagation itself does not make these ops).
CLIPS_BY_VALUE = frozenset({"Minimum", "Maximum", "ClipByValue"})
# The beginnings of the types of ops that draw random numbers (stateful and
# stateless: `StatelessRandom` starts `StatelessRandomUniformV2`'s).
RANDOM_PREFIXES = (
    "RandomStandardNormal", "RandomUniform", "RandomUniformInt",
    "TruncatedNormal", "ParameterizedTruncatedNormal", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "Multinomial", "StatelessRandom",
    "StatelessTruncatedNormal", "StatelessParameterizedTruncatedNormal",
    "StatefulStandardNormal", "StatefulUniform", "StatefulTruncatedNormal")
# ---------------------------------------------------------------- kernels
# oneDNN kernels that fail, abort or compute a wrong shape on a 0-example
# batch (checked on TF 2.15.1: AvgPool, FusedBatchNorm, LRN, MatMul,
# BatchMatMul, Conv2DBackpropInput handle it).
EMPTY_BATCH_UNSAFE = frozenset({
    "Conv2D", "Conv3D", "DepthwiseConv2dNative", "MaxPool", "MaxPoolV2",
    "MaxPool3D", "MaxPoolWithArgmax"})

# The beginnings of the types of cross-tower collectives.
_COLLECTIVE_PREFIXES = ("Collective", "Nccl")


def is_collective(op: tf.Operation) -> bool:
  """A cross-tower collective: TensorFlow's (`CollectiveReduceV2`,
  `CollectiveGatherV2`, `CollectiveBcastSend`, ...) or NCCL's
  (`NcclAllReduce`, ...). It waits for every member of its group, and what
  it reduces, gathers or broadcasts is the same in every tower."""
  return op.type.startswith(_COLLECTIVE_PREFIXES)


# The graph collection of the ops `check_towers` builds in place of a random
# draw (a fixed value): still draws to whatever looks for them.
FIXED_DRAWS_COLLECTION = "estimator_multigpu_draws_held_fixed"


def draws_random(op: tf.Operation) -> bool:
  """An op drawing random numbers (`RANDOM_PREFIXES`), or one `check_towers`
  holds fixed (`FIXED_DRAWS_COLLECTION`)."""
  return (op.type.startswith(RANDOM_PREFIXES) or
          op in op.graph.get_collection(FIXED_DRAWS_COLLECTION))


def before(tensor: tf.Tensor, op_types: Collection) -> tf.Tensor:
  """`tensor` before the ops of `op_types` it comes out of, each followed
  back through its first input (`SAME_VALUES`: casts, reshapes)."""
  while tensor.op.type in op_types and tensor.op.inputs:
    tensor = tensor.op.inputs[0]
  return tensor


Stop = Union[Callable[[tf.Operation], bool], Collection]


def ancestors(roots: Iterable, *, control: bool = False,
              stop: Stop = frozenset(), per_output: bool = False,
              bodies: bool = False) -> set:
  """The set of ops `walk` yields (see there)."""
  return set(walk(roots, control=control, stop=stop, per_output=per_output,
                  bodies=bodies))


def walk(roots: Iterable, *, control: bool = False, stop: Stop = frozenset(),
         per_output: bool = False, bodies: bool = False
         ) -> Iterator[tf.Operation]:
  """Yields the ops `roots` are computed from, each once, depth first.

  Args:
    roots: ops (with all their inputs) or tensors (their ops); the roots'
      ops are yielded too.
    control: also along control edges (an op's control inputs).
    stop: ops yielded but not walked past, tensors not walked through; or
      a predicate on ops (True: yielded, not walked past).
    per_output: through an `IdentityN` (`tf.custom_gradient`'s) only along
      the input of the output reached (each output is its input).
    bodies: also into the graphs of the functions an op calls (`If`'s
      branches, `While`'s condition and body, a `PartitionedCall`'s
      function), from their outputs and control outputs.
  """
  stop_op, stop_tensor = _stops(stop)
  stack = [_item(root, per_output) for root in roots]
  seen, seen_ops = set(), set()
  while stack:
    op, index = stack.pop()
    if (op, index) in seen:
      continue
    seen.add((op, index))
    if op not in seen_ops:
      seen_ops.add(op)
      yield op
    if not stop_op(op):
      stack.extend(_parents(op, index, control, per_output, stop_tensor))
      if bodies:
        stack.extend(_body_outputs(op, per_output))


def _stops(stop: Stop) -> tuple:
  """(predicate on ops, predicate on tensors) of a `stop` argument."""
  if callable(stop):
    return stop, lambda tensor: False
  ops = {item for item in stop if isinstance(item, tf.Operation)}
  refs = {item.ref() for item in stop if isinstance(item, tf.Tensor)}
  return ops.__contains__, lambda tensor: tensor.ref() in refs


def _item(root, per_output: bool) -> tuple:
  """(op, output index) to walk from: the index only where it matters (an
  `IdentityN` walked output by output)."""
  if isinstance(root, tf.Operation):
    return root, None
  by_output = per_output and root.op.type == "IdentityN"
  return root.op, root.value_index if by_output else None


def _parents(op: tf.Operation, index, control: bool, per_output: bool,
             stop_tensor: Callable) -> list:
  """(op, index) of what `op`'s output `index` (None: any) reads."""
  inputs = [op.inputs[index]] if index is not None else list(op.inputs)
  parents = [_item(t, per_output) for t in inputs if not stop_tensor(t)]
  if control and index is None:
    parents += [(c, None) for c in op.control_inputs]
  return parents


def _body_outputs(op: tf.Operation, per_output: bool) -> list:
  """(op, index) of the outputs and control outputs of the functions `op`
  calls."""
  items = []
  for body in function_bodies(op):
    items += [_item(t, per_output) for t in body.outputs]
    items += [(c, None) for c in body.control_outputs]
  return items


def function_bodies(op: tf.Operation) -> list:
  """The graphs of the functions `op` calls (`If`'s branches, `While`'s
  condition and body, a `PartitionedCall`'s function), if any."""
  names = []
  for value in op.node_def.attr.values():
    if value.HasField("func"):
      names.append(value.func.name)
    names += [f.name for f in value.list.func]
  bodies = []
  for name in names:
    function = compat.private(op.graph, "_get_function")(name)
    if function is not None and getattr(function, "graph", None) is not None:
      bodies.append(function.graph)
  return bodies
