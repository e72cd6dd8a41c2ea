"""Computing a value a block of rows at a time: which steps allow it, and what a block reads.

A step maps rows to rows when a block of its result's rows (its leading dim) is computed from a
block of rows of what it reads: element by element ops, casts and copies, stacks and concatenations
along another dim (the same block), and reshapes whose source has a whole number of rows per row of
the result (row-major: result rows ``[a, b)`` are source rows ``[a * k, b * k)``; ``row_ratio``).
A compressed weight's unpacking, cast, zero point and scale are such steps; ``samples.py`` computes
a large weight through them a block at a time.
"""

from __future__ import annotations

import numpy as np
import torch

from openvino_backend.graph import op_name
from openvino_backend.ops import facts

# A value computed again by rows is computed this many bytes of it at a time: a block whose steps stay
# in the CPU's caches (a 3 B decoder's MLP weight dequantized in 4 MiB blocks: twice as fast as whole).
ROWS_BYTES = 1 << 22
RESHAPES = {"aten.view_copy.default", "aten.reshape.default", "aten.view.default"}
STACKS = {"aten.stack.default", "aten.cat.default"}


def static_shape(node: torch.fx.Node) -> tuple[int, ...]:
    """``node``'s shape from its ``meta["val"]`` when it is a tensor of known sizes, else ``()``."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(isinstance(d, int) for d in val.shape):
        return ()
    return tuple(val.shape)


def nbytes(node: torch.fx.Node) -> int:
    """The bytes of ``node``'s value by its ``meta["val"]`` (0 when its sizes are not known)."""
    shape = static_shape(node)
    return int(np.prod(shape)) * node.meta["val"].dtype.itemsize if shape else 0


def maps_rows(node: torch.fx.Node) -> bool:
    """True when ``node``'s block of rows is computed from the same block of rows of what it reads."""
    name = op_name(node)
    if torch.Tag.pointwise in getattr(node.target, "tags", ()) or facts(node).copy is not None:
        return True
    if name in RESHAPES:  # row-major: each row of the result is a whole number of the source's rows
        return row_ratio(node) > 0
    if name in STACKS:  # along any dim but the leading one (a dim of the result, for both)
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        return isinstance(dim, int) and dim % len(static_shape(node)) != 0
    return False


def row_ratio(node: torch.fx.Node) -> int:
    """Rows of what ``node`` reads per row of its result: 1, except for a reshape (row-major) from
    ``k`` times its rows (NNCF's 4-bit weights are unpacked flat, then shaped by output channel);
    0 where a block of rows reads no block of rows of its source."""
    if op_name(node) not in RESHAPES:
        return 1
    source = static_shape(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else ()
    rows = static_shape(node)
    if not source or not rows or rows[0] < 1 or source[0] % rows[0]:
        return 0
    return source[0] // rows[0]


def row_part(value: object, shape: tuple[int, ...], name: str) -> str | None:
    """What a block of rows of a ``shape`` result reads of ``value``: ``"rows"``, its own block of
    rows; ``"all"``, all of it (a scalar, or a value broadcast over the rows); None, neither."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return "all"
    if name in RESHAPES or name in STACKS or value.dim() == len(shape):
        if value.shape[0] == shape[0]:
            return "rows"
        broadcast = name not in RESHAPES and name not in STACKS and value.shape[0] == 1
        return "all" if broadcast else None
    return "all" if value.dim() < len(shape) else None
