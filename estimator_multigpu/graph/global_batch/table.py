"""The table of op types whose batch semantics are known.

`classify(view)` returns one `kinds.Kind` per output when the op can stay
on the tower's shard as it is, or a verdict (`kinds.VERDICTS`): `LOCALLY`
(its statistics and sizes replaced by their global values, it stays per
shard), `COMBINED` (a reduction over the batch axis, combined over the
towers) or `GLOBALLY` (recreated on the global batch). Ops of any type whose
inputs are all `UNIFORM` stay `UNIFORM`; a type the table does not know
runs on the global batch. Rules read op types, attributes, constant inputs
and static shapes of the non-batch axes only, never a shard's size: every
tower decides alike. The families are this module (elementwise ops,
reductions, contractions, per-example ops of images and classes) and
`shape_rules` (shapes, slices, joins, gathers).
"""

from __future__ import annotations

from typing import Union

from estimator_multigpu.graph.global_batch import kinds as K
from estimator_multigpu.graph.global_batch import shape_rules
from estimator_multigpu.graph.global_batch.op_view import OpView

Verdict = Union[list, str]

UNARY = frozenset("""Abs Acos Acosh Asin Asinh Atan Atanh BesselI0e BesselI1e
Cast Ceil CheckNumerics Cos Cosh Digamma Elu EnsureShape Erf Erfc Erfinv Exp
Expm1 Floor Gelu Identity Inv Invert IsFinite IsInf IsNan LeakyRelu Lgamma
Log Log1p LogicalNot Ndtri Neg OnesLike PreventGradient Reciprocal Relu
Relu6 Rint Round Rsqrt Selu Sigmoid Sign Sin Sinh Snapshot Softplus Softsign
Sqrt Square StopGradient Tan Tanh ZerosLike ClipByValue AsString
StringToNumber StringToHashBucketFast StringToHashBucketStrong
StringToHashBucket StringLength StringLower StringUpper StaticRegexReplace
RegexReplace Bucketize Substr""".split())
BINARY = frozenset("""Add AddV2 AddN ApproximateEqual Atan2 BiasAdd BiasAddV1
BitwiseAnd BitwiseOr BitwiseXor Div DivNoNan Equal FloorDiv FloorMod Greater
GreaterEqual Igamma Igammac LeftShift Less LessEqual LogicalAnd LogicalOr
Maximum Minimum Mod Mul MulNoNan NextAfter NotEqual Polygamma Pow RealDiv
RightShift Select SelectV2 SquaredDifference Sub TruncateDiv TruncateMod
Xdivy Xlog1py Xlogy Zeta StringJoin""".split())
# Linear in a statistic: the towers' combination commutes with them.
_PASS = frozenset("Identity Cast StopGradient Snapshot CheckNumerics "
                  "PreventGradient EnsureShape Neg".split())
_ADDS = frozenset("Add AddV2 Sub AddN".split())
_SCALES = frozenset("Mul MulNoNan".split())
_DIVIDES = frozenset("RealDiv Div DivNoNan".split())
_PER_IMAGE = frozenset("""Conv2D Conv3D DepthwiseConv2dNative MaxPool MaxPoolV2
MaxPool3D AvgPool AvgPool3D LRN ResizeBilinear ResizeNearestNeighbor
ResizeBicubic ResizeArea Dilation2D FusedBatchNorm FusedBatchNormV2
FusedBatchNormV3 _FusedConv2D _MklFusedConv2D MaxPoolWithArgmax
ExtractImagePatches SpaceToDepth DepthToSpace""".split())
_RANDOM = frozenset("""RandomUniform RandomStandardNormal TruncatedNormal
RandomUniformInt StatelessRandomUniformV2 StatelessRandomNormalV2
StatelessTruncatedNormalV2 StatelessRandomUniformIntV2 StatelessRandomUniform
StatelessRandomNormal StatelessTruncatedNormal""".split())
_REDUCTIONS = {"Sum": K.SUM, "Mean": K.MEAN, "Max": K.COMBINED,
               "Min": K.COMBINED, "Prod": K.COMBINED, "All": K.COMBINED,
               "Any": K.COMBINED}
_ALONG_LAST = frozenset("Softmax LogSoftmax TopKV2".split())
_ALONG_AXIS = frozenset("ArgMax ArgMin Cumsum Cumprod CumulativeLogsumexp "
                        "ReverseV2".split())
GLOBAL_TYPES = frozenset("CollectiveReduceV2 CollectiveGatherV2 "
                         "CollectiveBcastSendV2 CollectiveBcastRecvV2 "
                         "CollectiveReduce CollectiveGather".split())


def classify(view: OpView) -> Verdict:
  """Output kinds, or a verdict (see the module doc)."""
  if view.all_of("uniform") or view.type in GLOBAL_TYPES:
    return [K.UNIFORM] * view.num_outputs
  if view.type in ("IdentityN",):
    return list(view.kinds)
  if any(k.is_local for k in view.kinds):
    return shape_rules.local(view)
  if view.type.startswith(shape_rules.LIST_PREFIXES):
    return shape_rules.tensor_list(view)
  rule = _RULES.get(view.type) or shape_rules.RULES.get(view.type)
  if rule is None:
    return K.GLOBALLY
  return rule(view)


def elementwise(view: OpView) -> Verdict:
  """Per-example operands on one output axis stay per shard; with a
  statistic, the statistic's global value; statistics alone stay
  statistics through linear ops."""
  if view.of("rows"):
    axis = _common_axis(view)
    if axis is None:
      return K.GLOBALLY
    if view.of("sum") or view.of("mean") or view.of("shape"):
      return K.LOCALLY
    return [K.rows(axis)] * view.num_outputs
  if view.of("shape"):
    shapes = view.of("shape")
    if view.type in ("Identity", "Cast", "StopGradient") and shapes == [0]:
      return [view.kinds[0]]
    if view.type in ("Equal", "NotEqual") and len(
        {view.kinds[i] for i in shapes}) == 1 and len(shapes) == 2:
      return [K.UNIFORM]  # two shapes of the shard's rows, compared.
    return K.LOCALLY
  return _statistics(view)


def _common_axis(view: OpView):
  """The one output axis every per-example operand's batch lands on (after
  broadcasting), with no other operand spanning it; else None."""
  out_rank = view.out_rank()
  if out_rank is None:
    return None
  axes = set()
  for i, kind in enumerate(view.kinds):
    rank = view.rank(i)
    if rank is None:
      return None
    if kind.is_rows:
      axes.add(kind.axis + out_rank - rank)
  if len(axes) != 1:
    return None
  axis = axes.pop()
  for i, kind in enumerate(view.kinds):
    if kind.is_rows:
      continue
    position = axis - (out_rank - view.rank(i))
    if position >= 0 and view.inputs[i].shape[position] != 1:
      return None
  return axis


def _statistics(view: OpView) -> Verdict:
  """Statistics (and uniform values): linear ops keep the kind."""
  stats = {view.kinds[i] for i in view.of("sum") + view.of("mean")}
  if len(stats) > 1:  # a count of LOCAL rows with another sum: a sum.
    stats = {k.plain for k in stats}
  if len(stats) != 1:
    return K.LOCALLY
  stat = stats.pop()
  count = len(view.of(stat.name))
  uniform = len(view.kinds) - count
  if view.type in _PASS and not _rounds(view):
    return [stat]
  if view.type in _ADDS and (not uniform or stat == K.MEAN):
    return [stat]
  if view.type in _SCALES and count == 1:
    return [stat]
  if view.type in _DIVIDES and view.kinds[0] == stat and count == 1 and (
      view.inputs[0].dtype.is_floating):
    return [stat]
  return K.LOCALLY


def _rounds(view: OpView) -> bool:
  """A cast that rounds (to an integer or a bool from a float) does not
  commute with the towers' combination: Σᵢ int(xᵢ) is not int(Σᵢ xᵢ)."""
  if view.type != "Cast":
    return False
  dst = view.op.outputs[0].dtype
  return not dst.is_floating and (view.inputs[0].dtype.is_floating or
                                  dst == "bool")


def reduction(view: OpView) -> Verdict:
  """Over other axes: per example; over the batch axis: a statistic, or
  the towers' combination."""
  kind, rank = view.kinds[0], view.rank(0)
  axes = view.axes(1, rank)
  if axes is None or any(k.is_shape for k in view.kinds[1:]):
    return K.GLOBALLY
  if kind.is_statistic:
    return [kind] if view.type in ("Sum", "Mean") else K.LOCALLY
  if kind.is_shape:
    return [K.count_of(kind)] if view.type == "Prod" else K.LOCALLY
  if kind.axis not in axes:
    keep = view.attr("keep_dims", False)
    return [K.rows(kind.axis - (0 if keep else
                                sum(a < kind.axis for a in axes)))]
  return [_REDUCTIONS[view.type]] if view.type in ("Sum", "Mean") else (
      _REDUCTIONS.get(view.type, K.GLOBALLY))


def per_image(view: OpView) -> Verdict:
  """Convolutions, pooling, normalization of the examples one by one."""
  if view.kinds[0] != K.rows(0) or not all(
      k.is_uniform for k in view.kinds[1:]):
    return K.GLOBALLY
  if view.type.startswith("FusedBatchNorm"):
    # Training batch norm's statistics are the shard's (the documented
    # local statistics; `sync_batch_norm=True` builds global ones).
    stat = K.MEAN if view.attr("is_training", False) else K.UNIFORM
    return [K.rows(0)] + [stat] * (view.num_outputs - 1)
  return [K.rows(0)] * view.num_outputs


def conv_backprop_input(view: OpView) -> Verdict:
  """A transposed convolution: shaped by the shard, of its examples."""
  if (view.kinds[0] == K.shape_of(0) and view.kinds[1].is_uniform and
      view.kinds[2] == K.rows(0)):
    return [K.rows(0)]
  return K.GLOBALLY


def along_axis(view: OpView) -> Verdict:
  """Softmax, top_k (along the last axis), argmax, cumsum, reverse (along
  an argument): per example unless along the batch axis."""
  kind, rank = view.kinds[0], view.rank(0)
  if not kind.is_rows or rank is None or not all(
      k.is_uniform for k in view.kinds[1:]):
    return K.GLOBALLY
  if view.type in _ALONG_LAST:
    along = [rank - 1]
  else:
    along = view.axes(1, rank)
    if along is None:
      return K.GLOBALLY
  if kind.axis in along:
    return K.GLOBALLY
  if view.type in ("ArgMax", "ArgMin"):
    return [K.rows(kind.axis - (along[0] < kind.axis))]
  return [kind] * view.num_outputs


def cross_entropy(view: OpView) -> Verdict:
  """Both cross-entropies: logits and labels of the same examples."""
  if all(k == K.rows(0) for k in view.kinds):
    return [K.rows(0)] * view.num_outputs
  return K.GLOBALLY


def matmul(view: OpView) -> Verdict:
  """A's rows or B's columns may be examples; examples on a contracted
  axis, or on both sides, cross them."""
  a, b = view.kinds[:2]
  if view.of("sum") or view.of("mean"):
    stat = a if a.is_statistic else b
    return ([stat] if (a.is_uniform or b.is_uniform) else K.LOCALLY)
  free_a = 1 if view.attr("transpose_a", False) else 0
  free_b = 0 if view.attr("transpose_b", False) else 1
  if a.is_rows and b.is_uniform and a.axis == free_a:
    return [K.rows(0)]
  if b.is_rows and a.is_uniform and b.axis == free_b:
    return [K.rows(1)]
  return K.GLOBALLY


def batch_matmul(view: OpView) -> Verdict:
  """Examples on a leading (batch) axis of both, or of one operand."""
  out_rank = view.out_rank()
  axes = set()
  for i, kind in enumerate(view.kinds):
    rank = view.rank(i)
    if not kind.is_rows:
      if not kind.is_uniform:
        return K.GLOBALLY
      continue
    if rank is None or out_rank is None or kind.axis >= rank - 2:
      return K.GLOBALLY
    axes.add(kind.axis + out_rank - rank)
  if len(axes) != 1:
    return K.GLOBALLY
  axis = axes.pop()
  for i, kind in enumerate(view.kinds):
    position = axis - (out_rank - (view.rank(i) or 0))
    if kind.is_uniform and position >= 0 and view.inputs[i].shape[
        position] != 1:
      return K.GLOBALLY
  return [K.rows(axis)]


def einsum(view: OpView) -> Verdict:
  """The examples' letter kept in the output, the same in every operand."""
  equation = view.attr("equation", b"")
  equation = equation.decode() if isinstance(equation, bytes) else equation
  if "..." in equation or "->" not in equation:
    return K.GLOBALLY
  operands, output = equation.replace(" ", "").split("->")
  letters = set()
  for term, kind in zip(operands.split(","), view.kinds):
    if kind.is_rows:
      letters.add(term[kind.axis] if kind.axis < len(term) else None)
    elif not kind.is_uniform:
      return K.GLOBALLY
  if len(letters) != 1 or None in letters:
    return K.GLOBALLY
  letter = letters.pop()
  if letter not in output:
    return K.GLOBALLY
  for term, kind in zip(operands.split(","), view.kinds):
    if kind.is_uniform and letter in term:
      return K.GLOBALLY
  return [K.rows(output.index(letter))]


def random(view: OpView) -> Verdict:
  """Random draws shaped like the shard's rows are per example."""
  shape = view.kinds[0]
  if shape.is_shape and all(k.is_uniform for k in view.kinds[1:]):
    return [K.LOCAL if shape.ragged else K.rows(shape.axis)]
  return K.GLOBALLY


def segment_sum(view: OpView) -> Verdict:
  """Sums of rows by a per-example id: the towers' sum."""
  data, ids = view.kinds[:2]
  if (data.is_rows and data == ids and data.axis == 0 and
      view.kinds[2].is_uniform):
    return [K.SUM]
  return K.GLOBALLY


def lookup(view: OpView) -> Verdict:
  """A table's lookup of per-example keys (a vocabulary, a hash table):
  each key's value, the keys' batch axis kept (values of a shape of their
  own follow the keys' axes)."""
  keys = view.kinds[1]
  if keys.is_rows and view.kinds[0].is_uniform and all(
      k.is_uniform for k in view.kinds[2:]):
    return [keys]
  return K.GLOBALLY


def sparse_cross(view: OpView) -> Verdict:
  """`tf.sparse.cross` (`crossed_column`) of dense per-example features
  (and SparseTensors of the shard): each example's crosses, a SparseTensor
  whose rows are counted by their values (`LOCAL`, its width the shard's)."""
  if all(k.is_uniform or k == K.rows(0) or (k.is_shape and k.axis == 0)
         for k in view.kinds) and view.of("rows"):
    dense = [i for i, k in enumerate(view.kinds) if k.is_rows]
    if all(view.rank(i) == 2 for i in dense):
      return [K.LOCAL] * view.num_outputs
  return K.GLOBALLY


def string_split(view: OpView) -> Verdict:
  """`tf.strings.split` of each example's string: a SparseTensor (or a
  ragged tensor's pieces) of the shard, `LOCAL`."""
  if view.kinds[0] == K.rows(0) and view.rank(0) == 1 and all(
      k.is_uniform for k in view.kinds[1:]):
    return [K.LOCAL] * view.num_outputs
  return K.GLOBALLY


def range_op(view: OpView) -> Verdict:
  """`tf.range` of a count of LOCAL rows (`tf.range(tf.size(ids))` of a
  SparseTensor's values, as `embedding_lookup` over partitions writes it):
  one entry per LOCAL row, `LOCAL`. A range of the shard's size stays on
  the global batch (its values are the examples' positions in the batch:
  in-batch targets)."""
  start, limit, delta = view.kinds
  if start.is_uniform and delta.is_uniform and limit == K.LOCAL_COUNT:
    return [K.LOCAL]
  return K.GLOBALLY


def _rules() -> dict:
  rules = {t: elementwise for t in UNARY | BINARY}
  rules.update({t: reduction for t in _REDUCTIONS})
  rules.update({t: per_image for t in _PER_IMAGE})
  rules.update({t: along_axis for t in _ALONG_LAST | _ALONG_AXIS})
  rules.update({t: random for t in _RANDOM})
  rules.update(
      SoftmaxCrossEntropyWithLogits=cross_entropy,
      SparseSoftmaxCrossEntropyWithLogits=cross_entropy,
      MatMul=matmul, BatchMatMul=batch_matmul, BatchMatMulV2=batch_matmul,
      BatchMatMulV3=batch_matmul, Einsum=einsum,
      Conv2DBackpropInput=conv_backprop_input,
      UnsortedSegmentSum=segment_sum, ReduceJoin=reduction,
      LookupTableFind=lookup, LookupTableFindV2=lookup, Range=range_op,
      SparseCross=sparse_cross, SparseCrossHashed=sparse_cross,
      SparseCrossV2=sparse_cross, StringSplit=string_split,
      StringSplitV2=string_split)
  return rules


_RULES = _rules()
