"""Partition inputs and outputs in a non-default dim order, adapted inside the ``ov.Model``.

The ExecuTorch runtime binds every partition input and output as a tensor of
its *logical* sizes over its data pointer, whatever its dim order. So for an
input in dim order ``d`` the model reinterprets the bound memory: reshape the
Parameter to the physical sizes (``sizes`` permuted by ``d``) and transpose
back to logical order. For an output it does the reverse: transpose to
physical order, then reshape to the logical sizes the runtime binds. The
memory ExecuTorch reads and writes is then laid out exactly as its dim order
says, for any permutation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import openvino as ov
import openvino.opset13 as opset

from openvino_backend.diagnostics import DimOrderError, Finding, NodeRef

DimOrder = tuple[int, ...]


def inverse(order: DimOrder) -> DimOrder:
    result = [0] * len(order)
    for position, dim in enumerate(order):
        result[dim] = position
    return tuple(result)


def _static_shape(what: str, shape: ov.PartialShape, partition: int | None, nodes: tuple[NodeRef, ...]) -> list[int]:
    if not shape.is_static:
        raise DimOrderError(
            summary=f"{what} has a non-default dim order and a dynamic shape {shape}",
            findings=(Finding(f"{what} is used here", nodes),) if nodes else (),
            why="the layout is adapted by reshaping to the physical sizes, which must be known at export",
            fix="export with static shapes, or make the tensor contiguous before the delegated ops",
            partition=partition,
        )
    return [int(d) for d in shape.to_shape()]


def int_constant(values: Sequence[int]) -> ov.Node:
    """An i64 OpenVINO constant (shapes, axes, permutations)."""
    return opset.constant(np.array(values, dtype=np.int64))


def adapt_edge_layouts(
    model: ov.Model,
    input_orders: Sequence[DimOrder | None],
    output_orders: Sequence[DimOrder | None],
    *,
    partition: int | None = None,
    input_nodes: Sequence[tuple[NodeRef, ...]] = (),
    output_nodes: Sequence[tuple[NodeRef, ...]] = (),
) -> bool:
    """Rewrite ``model`` in place; ``None`` marks a tensor in the default order. True if changed.

    ``input_nodes`` / ``output_nodes`` (the FX nodes reading each input and
    making each output) only serve to point an error at the user's code.
    """
    changed = False
    for index, (parameter, order) in enumerate(zip(model.get_parameters(), input_orders, strict=True)):
        if order is None:
            continue
        nodes = input_nodes[index] if index < len(input_nodes) else ()
        logical = _static_shape(f"input {index}", parameter.get_partial_shape(), partition, nodes)
        readers = list(parameter.output(0).get_target_inputs())
        physical = opset.reshape(parameter, int_constant([logical[d] for d in order]), special_zero=False)
        view = opset.transpose(physical, int_constant(inverse(order)))
        for reader in readers:
            reader.replace_source_output(view.output(0))
        changed = True
    for index, (result, order) in enumerate(zip(model.get_results(), output_orders, strict=True)):
        if order is None:
            continue
        source = result.input_value(0)
        nodes = output_nodes[index] if index < len(output_nodes) else ()
        logical = _static_shape(f"output {index}", source.get_partial_shape(), partition, nodes)
        physical = opset.transpose(source, int_constant(order))
        reshaped = opset.reshape(physical, int_constant(logical), special_zero=False)
        result.input(0).replace_source_output(reshaped.output(0))
        changed = True
    if changed:
        model.validate_nodes_and_infer_types()
    return changed
