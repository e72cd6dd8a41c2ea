"""Subgraphs with no run-time input, computed once by PyTorch at export.

Index arithmetic, masks and position ids built from ``arange``/``full`` and
constants need no OpenVINO at all, and OpenVINO has been seen computing
such subgraphs wrongly (``arange(-1, 7).abs()`` loses the Abs of its negative
element in 2026.4.1). Folding them with PyTorch keeps their meaning exactly;
OpenVINO receives a constant.

Two limits keep the program from growing: a folded tensor larger than
``max_bytes`` stays a computation (a 2048x2048 mask is cheaper to build at
run time than to store), and nothing derived from a weight is folded
(weights reach OpenVINO as they are, with their dequantize for INT8 and
compressed weights; a folded copy of a transposed weight would store it
twice).
"""

from __future__ import annotations

import logging

import torch
from executorch.exir.passes.constant_prop_pass import (
    create_constant_nodes_and_return_specs,
    get_constant_placeholder_dict,
    get_data,
    is_const,
)
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from openvino_backend.ops import not_folded
from openvino_backend.transform import copied

logger = logging.getLogger(__name__)

MAX_FOLDED_BYTES = 1 << 18
# A stored constant up to this size is a literal of the model's code (a scalar, a small table), not a weight.
MAX_LITERAL_BYTES = 1 << 10


def fold_constant_subgraphs(program: ExportedProgram, max_bytes: int = MAX_FOLDED_BYTES) -> ExportedProgram:
    """A copy of ``program`` whose foldable constant subgraphs are replaced by their values
    (``program`` itself when there are none)."""
    try:
        found = _foldable(program, max_bytes)
    except Exception as error:  # folding saves work at run time; nothing depends on it
        logger.warning("constant folding skipped: PyTorch could not evaluate the constant subgraphs (%s)", error)
        return program
    if not found:
        return program
    program = copied(program)
    # The same nodes in the copy (names survive deepcopy), in the same order: computed once.
    by_name = {node.name: node for node in program.graph.nodes}
    folded = {by_name[node.name]: value for node, value in found.items()}
    logger.debug("folding constant nodes: %s", ", ".join(n.name for n in folded if n.op != "placeholder"))
    specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
    specs.update(create_constant_nodes_and_return_specs(folded, program))
    program.graph_signature.input_specs = [specs[node.name] for node in program.graph.find_nodes(op="placeholder")]
    program.graph.eliminate_dead_code()
    program.graph_module.recompile()
    return program


def _foldable(program: ExportedProgram, max_bytes: int) -> dict[torch.fx.Node, torch.Tensor]:
    """Constant placeholders and the computed nodes to fold, with values; empty if nothing to fold."""
    values = _propagated(program)
    outputs = set(program.graph.output_node().all_input_nodes)
    folded = {
        node: value
        for node, value in values.items()
        if node.op == "placeholder"
        or (isinstance(value, torch.Tensor) and node not in outputs and _nbytes(value) <= max_bytes)
    }
    return folded if any(node.op != "placeholder" for node in folded) else {}


def _propagated(program: ExportedProgram) -> dict[torch.fx.Node, object]:
    """The value of every constant placeholder and computed node that may be folded.

    Never folded, nor anything computed from them, so never computed here: weights (parameters,
    buffers, and constants larger than a literal: a compressed weight's dequantize must reach
    OpenVINO as it is), and tensors the program changes in place (a folded one would be a
    constant that the program mutates, which torch refuses). ExecuTorch's
    ``get_propagated_const_tensor_dict`` computes everything it can and holds it all: on an
    LLM, every weight dequantized, several times over, at once.
    """
    signature = program.graph_signature
    stored = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
    mutated = mutated_in_place(program.graph)
    values: dict[torch.fx.Node, object] = {
        node: value
        for node, value in get_constant_placeholder_dict(program).items()
        if node.name not in stored and node not in mutated and _nbytes(value) <= MAX_LITERAL_BYTES
    }
    skipped = not_folded()
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target in skipped or node.is_impure() or node in mutated:
            continue
        if not is_const((node.args, node.kwargs), program, values):
            continue
        args, kwargs = pytree.tree_map(lambda x: get_data(x, program, values), (node.args, node.kwargs))
        with torch.no_grad():
            value = node.target(*args, **kwargs)
        # ExecuTorch stores no zero strides (a broadcast, an expand): a folded tensor is dense.
        dense = isinstance(value, torch.Tensor) and 0 in value.stride()
        values[node] = value.contiguous() if dense else value  # a tuple is read through getitem
    return values


def mutated_in_place(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes whose tensors an op writes in place, directly or through a view of them."""
    mutated: set[torch.fx.Node] = set()
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        given = {**dict(zip((a.name for a in schema.arguments), node.args, strict=False)), **node.kwargs}
        for argument in schema.arguments:
            value = given.get(argument.name)
            if argument.alias_info is not None and argument.alias_info.is_write and isinstance(value, torch.fx.Node):
                mutated.update(_view_bases(value))
    return mutated


def _view_bases(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``node`` and every tensor it is a view of (a write through a view writes the base)."""
    chain = [node]
    while True:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        aliases = schema is not None and schema.returns and schema.returns[0].alias_info is not None
        if not aliases or not node.args or not isinstance(node.args[0], torch.fx.Node):
            return chain
        node = node.args[0]
        chain.append(node)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
