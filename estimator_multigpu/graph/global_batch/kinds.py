"""What a tower's tensor is relative to its shard: the kinds the op table uses.

- `UNIFORM`: the same in every tower (variables, constants, what a
  collective returns, what an op computed on the global batch keeps);
- `rows(k)`: per-example, the shard's examples along axis k (one or more
  rows per example, in order);
- `LOCAL`: rows whose count depends on the shard's values (a `tf.where` of
  the shard, SparseTensor components): kept per shard, as written;
- `shape_of(k)`: a shape vector whose entry k is the shard's row count;
- `SUM`: a statistic the towers combine by Σᵢ xᵢ (a sum over the batch
  axis, a count, the shard's size); `LOCAL_COUNT`, a `SUM` that counts
  `LOCAL` rows (`tf.size` of SparseTensor values): what it shapes or
  enumerates (`tf.range` of it) is `LOCAL` too;
- `MEAN`: a statistic the towers combine by Σᵢ (nᵢ/n)·xᵢ (a mean over the
  batch axis) — under `loss_reduction="mean"`, the tower's loss.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Kind:
  """One kind (see the module doc); `axis` for rows and shapes."""
  name: str
  axis: int = 0
  ragged: bool = False  # a shape, or a count (`sum`), of LOCAL rows.

  @property
  def is_rows(self) -> bool:
    return self.name == "rows"

  @property
  def is_statistic(self) -> bool:
    return self.name in ("sum", "mean")

  @property
  def is_shape(self) -> bool:
    return self.name == "shape"

  @property
  def is_uniform(self) -> bool:
    return self.name == "uniform"

  @property
  def is_local(self) -> bool:
    return self.name == "local"

  @property
  def plain(self) -> "Kind":
    """The kind as a statistic: a count of LOCAL rows is a `SUM`."""
    return SUM if self.is_statistic and self.ragged else self

  def __repr__(self) -> str:
    if self.name in ("rows", "shape"):
      return f"{self.name}@{self.axis}" + ("~" if self.ragged else "")
    return self.name + ("~" if self.ragged else "")


UNIFORM = Kind("uniform")
LOCAL = Kind("local")
SUM = Kind("sum")
MEAN = Kind("mean")
LOCAL_COUNT = Kind("sum", ragged=True)


def count_of(shape: Kind) -> Kind:
  """The batch entry of a shape vector: the shard's size, a `SUM` (a count
  of LOCAL rows where the shape is theirs)."""
  return LOCAL_COUNT if shape.ragged else SUM


def rows(axis: int) -> Kind:
  return Kind("rows", axis)


def shape_of(axis: int, ragged: bool = False) -> Kind:
  return Kind("shape", axis, ragged)


# A rule's verdict when an op cannot stay per shard as it is.
LOCALLY = "local"      # statistics and sizes to their global values.
COMBINED = "combine"   # a reduction over the batch: the towers' combined.
GLOBALLY = "global"    # the op on the global batch.
VERDICTS = (LOCALLY, COMBINED, GLOBALLY)
