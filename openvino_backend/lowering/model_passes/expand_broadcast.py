"""PyTorch's ``expand`` as the Broadcast OpenVINO's CPU plugin runs as one op.

The frontend converts ``expand(x, sizes)`` into ``Broadcast(x, Abs(sizes))`` in
``BIDIRECTIONAL`` mode: ``Abs`` turns a ``-1`` size ("keep this dim") into 1,
and the bidirectional rule then keeps the input's dim there. With a dynamic
target shape, OpenVINO's common transformations turn a bidirectional Broadcast
into ``Multiply(x, Broadcast(1, shape))``: a tensor of ones the size of the
result is written, converted to the compute precision and multiplied in. In a
decoder with grouped-query attention that is three passes over the expanded
key and the expanded value of every layer, on every call.

Where no size can be ``-1``, ``Abs`` changes nothing and PyTorch's rule for an
expand (each size equals the input's dim, or the input's dim is 1) is exactly
the ``NUMPY`` rule: the result is ``sizes``. Such a Broadcast becomes a
``NUMPY`` Broadcast of ``sizes``, which the CPU plugin runs as one Broadcast.
A size is known never to be ``-1`` when it is a non-negative constant or is read
from a tensor's shape. Constant sizes with ``-1`` entries (``torch.export``
writes a dynamic dim the expand keeps as ``-1``) take the input's dim there,
read from its shape. Anything else (an int passed into the partition, any
arithmetic) leaves the Broadcast as the frontend wrote it.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as opset

from openvino_backend.lowering.edge_layout import int_constant

# Ops whose output holds values of their first input only (reordered, retyped, reshaped).
_CARRIERS = ("Convert", "Squeeze", "Unsqueeze", "Reshape", "Gather", "StridedSlice", "Slice")


def expands_as_numpy_broadcasts(model: ov.Model) -> int:
    """Rewrite, in place, each expand's bidirectional Broadcast whose sizes are never ``-1`` as a
    ``NUMPY`` Broadcast; how many were rewritten."""
    rewritten = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "Broadcast" or node.get_type_info().version_id != "opset3":
            continue
        if str(node.get_attributes().get("mode", "")).lower() != "bidirectional":
            continue
        target = node.input_value(1).get_node()
        if target.get_type_name() != "Abs":
            continue
        sizes = _sizes_kept_explicit(node.input_value(0), target.input_value(0))
        if sizes is None:
            continue
        broadcast = opset.broadcast(node.input_value(0), sizes, broadcast_spec="NUMPY")
        broadcast.set_friendly_name(node.get_friendly_name())
        node.output(0).replace(broadcast.output(0))
        rewritten += 1
    if rewritten:
        model.validate_nodes_and_infer_types()
    return rewritten


def _sizes_kept_explicit(source: ov.Output, sizes: ov.Output) -> ov.Output | None:
    """``sizes`` with each ``-1`` replaced by ``source``'s dim there, or None if that cannot be
    shown: ``sizes`` itself when no element can be ``-1``."""
    if _never_negative(sizes):
        return sizes
    node = sizes.get_node()
    rank = source.get_partial_shape().rank
    if node.get_type_name() != "Constant" or rank.is_dynamic:
        return None
    values = np.atleast_1d(node.get_data()).astype(np.int64)
    added = len(values) - rank.get_length()  # leading dims the expand adds; -1 is not allowed there
    if values.ndim != 1 or added < 0 or np.any(values < -1) or np.any(values[:added] < 0):
        return None
    shape = opset.shape_of(source, "i64")
    pieces = [
        opset.gather(shape, int_constant([i - added]), opset.constant(np.int64(0))).output(0)
        if size == -1
        else int_constant([int(size)]).output(0)
        for i, size in enumerate(values)
    ]
    explicit = opset.concat(pieces, 0).output(0)
    return (
        explicit
        if sizes.get_element_type() == ov.Type.i64
        else opset.convert(explicit, sizes.get_element_type()).output(0)
    )


def _never_negative(value: ov.Output) -> bool:
    """Whether every element of ``value`` is >= 0 on every call: non-negative constants, and dims
    read from shapes, concatenated or carried through ops that only move them."""
    node = value.get_node()
    kind = node.get_type_name()
    if kind == "Constant":
        return bool(np.all(node.get_data() >= 0))
    if kind in ("ShapeOf",):
        return True
    if kind == "Concat":
        return all(_never_negative(source) for source in node.input_values())
    if kind in _CARRIERS:
        return _never_negative(node.input_value(0))
    return False
