"""Questions about FX nodes and programs that every stage asks."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind


def op_name(node: torch.fx.Node) -> str:
    """``aten.clone.default`` for a call, ``placeholder`` / ``output`` otherwise."""
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):  # before to_edge: ``aten::abs`` + overload
            return f"{target._schema.name.replace('::', '.')}.{target._overloadname}"
        return target if isinstance(target, str) else getattr(target, "__name__", str(target))
    return node.op


def dtype_of(node: object) -> torch.dtype | None:
    """The dtype of the tensor ``node`` computes, or None (not a node, not a tensor)."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def is_getitem(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and op_name(node) == "getitem"


def non_default_dim_order(val: object) -> tuple[int, ...] | None:
    """The dim order of ``val`` when its memory is not laid out contiguously.

    A tensor whose layout equals the contiguous one (channels-last with
    H = W = 1, say) is fine whatever its dim order says: the runtime reads the
    same bytes either way.
    """
    if not isinstance(val, torch.Tensor) or val.is_contiguous():
        return None
    return tuple(val.dim_order(ambiguity_check=False))


def tensors_read(source: torch.fx.Node, readers: Iterable[torch.fx.Node]) -> list[object]:
    """The values of ``source`` that ``readers`` take: the value itself, or the tuple elements they pick.

    Multi-output ops (``_native_batch_norm_legit_no_training``, ``max_pool2d_with_indices``,
    ...) hold a tuple in ``meta["val"]``; their tensors cross a partition edge
    through ``getitem`` nodes, which ExecuTorch's fuser pulls into the delegate
    beside their producer. A rule about edge tensors must look at those tensors.
    """
    val = source.meta.get("val")
    if not isinstance(val, (tuple, list)):
        return [val]
    picked: list[object] = []
    for reader in readers:
        if is_getitem(reader) and isinstance(reader.args[1], int):
            picked.append(val[reader.args[1]])
        else:
            picked.extend(val)
    return picked


def first_problem(values: Iterable[object], problem: Callable[[object], str | None]) -> str | None:
    return next((why for why in map(problem, values) if why is not None), None)


def user_input_nodes(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The placeholders the runtime binds, in order (lifted weights and constants are not among them)."""
    user_inputs = set(program.graph_signature.user_inputs)
    return [node for node in program.graph.find_nodes(op="placeholder") if node.name in user_inputs]


def output_nodes(graph_module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    outputs = graph_module.graph.output_node().args[0]
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def user_output_nodes(program: ExportedProgram) -> list[torch.fx.Node]:
    """The outputs the runtime binds, in order: not the new values of buffers the program owns."""
    specs = program.graph_signature.output_specs
    return [
        node
        for node, spec in zip(output_nodes(program.graph_module), specs, strict=True)
        if spec.kind != OutputKind.BUFFER_MUTATION
    ]


def owned_constants(program: ExportedProgram, nodes: Collection[torch.fx.Node]) -> dict[torch.fx.Node, torch.Tensor]:
    """Constant inputs read only by ``nodes``, with their values.

    ``tag_constant_data`` makes them part of the delegate: they never cross
    the edge at run time, and preprocess sees them as constants.
    """
    sig = program.graph_signature
    targets = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    mutated = set(sig.buffers_to_mutate.values())
    values = {**program.state_dict, **program.constants}
    return {
        node: values[targets[node.name]]
        for node in program.graph.find_nodes(op="placeholder")
        if node.name in targets
        and targets[node.name] not in mutated
        and targets[node.name] in values
        and node.users
        and all(user in nodes for user in node.users)
    }


def as_attribute(graph_module: torch.fx.GraphModule, placeholder: torch.fx.Node, value: torch.Tensor) -> None:
    """Replace ``placeholder`` by an attribute holding ``value``: a constant baked into the graph."""
    graph = graph_module.graph
    name = f"_constant_{placeholder.name}"
    graph_module.register_buffer(name, value.detach())
    with graph.inserting_before(placeholder):
        attribute = graph.get_attr(name)
    attribute.meta = dict(placeholder.meta)
    placeholder.replace_all_uses_with(attribute)
    graph.erase_node(placeholder)
