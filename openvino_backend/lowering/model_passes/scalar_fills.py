"""A tensor filled with one value, read beside the tensor it copies the shape of, as that value.

``torch.full_like(x, v)`` (``zeros_like``, ``ones_like``; what ``where(mask, 0, x)``
writes for its constant) reaches OpenVINO as ``Broadcast(v, ShapeOf(x))``, often
followed by a ``ConvertLike`` to ``x``'s type. Read by an elementwise op whose
other operand is ``x`` itself, the broadcast changes nothing the op's own
(``NUMPY``) broadcasting would not do: the result has ``x``'s shape either way,
and each element reads ``v``. So the op reads ``v`` as a scalar, and the
broadcast, the shape read and the conversion go. In transformers' attention
(``where`` zeroing the rows no key was left to) that is four ops per layer,
run on every call because their shape is dynamic.
"""

from __future__ import annotations

import math

import numpy as np
import openvino as ov
import openvino.opset13 as opset

# Ops that change an operand's type only (ConvertPromoteTypes: its first output is its first input's).
_CONVERSIONS = ("Convert", "ConvertLike", "ConvertPromoteTypes")
# Elementwise ops that broadcast their inputs by the NUMPY rule (given that attribute).
_ELEMENTWISE = frozenset(
    {
        "Select",
        "Add",
        "Subtract",
        "Multiply",
        "Divide",
        "Maximum",
        "Minimum",
        "Equal",
        "NotEqual",
        "Less",
        "LessEqual",
        "Greater",
        "GreaterEqual",
        "LogicalAnd",
        "LogicalOr",
    }
)


def fills_as_scalars(model: ov.Model) -> int:
    """Feed, in place, each one-value fill read beside the tensor whose shape it takes with that
    value; how many inputs were rewritten."""
    rewritten = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() not in _ELEMENTWISE:
            continue
        if str(node.get_attributes().get("auto_broadcast", "")).lower() != "numpy":
            continue
        inputs = [node.input_value(i) for i in range(node.get_input_size())]
        for index, source in enumerate(inputs):
            fill = _fill(source)
            if fill is None:
                continue
            value, shaped_like = fill
            if not any(_unconverted(other) == shaped_like for i, other in enumerate(inputs) if i != index):
                continue
            # A reshape of the constant (folded when compiled) keeps its type exactly (bf16 has no numpy).
            scalar = opset.reshape(value, opset.constant(np.array([], dtype=np.int64)), special_zero=False)
            wanted = node.get_input_element_type(index)
            if scalar.get_output_element_type(0) != wanted:
                scalar = opset.convert(scalar, wanted)
            node.input(index).replace_source_output(scalar.output(0))
            rewritten += 1
    if rewritten:
        model.validate_nodes_and_infer_types()
    return rewritten


def _unconverted(output: ov.Output) -> ov.Output:
    """``output`` before the type conversions the frontend wraps operands in (same shape)."""
    while output.get_node().get_type_name() in _CONVERSIONS:
        output = output.get_node().input_value(0)
    return output


def _fill(output: ov.Output) -> tuple[ov.Output, ov.Output] | None:
    """``(v, x)`` when ``output`` is ``Broadcast(v, ShapeOf(x))`` (then converted, perhaps) with
    ``v`` a constant of one element, ``x`` taken before its conversions; else None."""
    node = _unconverted(output).get_node()
    if node.get_type_name() != "Broadcast" or node.get_input_size() != 2:
        return None
    if str(node.get_attributes().get("mode", "")).lower() not in ("numpy", "bidirectional"):
        return None
    value, shape = node.input_value(0).get_node(), node.input_value(1).get_node()
    if value.get_type_name() != "Constant" or shape.get_type_name() != "ShapeOf":
        return None
    if math.prod(value.get_output_shape(0)) != 1:
        return None
    return value.output(0), _unconverted(shape.input_value(0))
