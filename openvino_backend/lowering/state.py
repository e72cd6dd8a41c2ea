"""Buffers a partition mutates, kept inside OpenVINO as state from one call to the next.

A program that updates a buffer (an LLM's KV cache) reads the buffer and
returns its new value, which ExecuTorch copies back after the call. When the
partitioner hands such a buffer to the delegate (``partition/mutable_buffers.py``),
the buffer never crosses the delegate's edge again: preprocess converts the
partition with the buffer as one more Parameter and its new value as one more
Result, then turns the pair into an OpenVINO variable (``ReadValue`` starting
from the buffer's value at export, ``Assign`` of the new value). The stock
runtime keeps one infer request per loaded method, so the variable lives as
long as the method: exactly the lifetime of the buffer it replaces.

The state Parameters and Results are placed after the user's, so the
runtime's inputs and outputs keep their positions when they are removed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import openvino as ov
import openvino.opset13 as opset
import torch
from openvino.frontend.pytorch.utils import pt_to_ov_type_map
from openvino.op import assign, util
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from openvino_backend.graph import as_attribute, output_nodes

# dtypes a variable's initial value can be built from (through numpy).
STATE_DTYPES = frozenset(
    {torch.float32, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}
)


@dataclass(frozen=True)
class StateBuffer:
    """A buffer the partition reads and writes: its placeholder, its name, its initial value."""

    placeholder: str
    target: str
    new_value: str  # the node computing the buffer's value after the call
    initial: torch.Tensor


def state_buffers(program: ExportedProgram) -> list[StateBuffer]:
    """The buffers ``program`` (one delegated partition) mutates, in the order it reads them."""
    signature = program.graph_signature
    new_values = {
        spec.target: spec.arg.name for spec in signature.output_specs if spec.kind == OutputKind.BUFFER_MUTATION
    }
    values = {**program.state_dict, **program.constants}
    return [
        StateBuffer(spec.arg.name, spec.target, new_values[spec.target], values[spec.target])
        for spec in signature.input_specs
        if spec.kind == InputKind.BUFFER and spec.target in new_values
    ]


def graph_for_conversion(program: ExportedProgram, states: list[StateBuffer]) -> torch.fx.GraphModule:
    """``program``'s graph with its constants as attributes, the user's inputs and outputs first,
    then each mutated buffer as an input and its new value as an output.

    What ``program.module()`` gives, except for mutated buffers, which it would turn into
    an in-place copy the frontend cannot express.
    """
    graph_module = copy.deepcopy(program.graph_module)
    graph = graph_module.graph
    state_inputs = {state.placeholder for state in states}
    values = {**program.state_dict, **program.constants}
    placeholders = graph.find_nodes(op="placeholder")
    for node, spec in zip(placeholders, program.graph_signature.input_specs, strict=True):
        if spec.kind == InputKind.USER_INPUT or node.name in state_inputs:
            continue
        as_attribute(graph_module, node, values[spec.target])
    last_user_input = [n for n in graph.find_nodes(op="placeholder") if n.name not in state_inputs]
    anchor = last_user_input[-1] if last_user_input else None
    for state in states:  # after the user's inputs, in order
        node = next(n for n in graph.find_nodes(op="placeholder") if n.name == state.placeholder)
        if anchor is not None:
            anchor.append(node)
        anchor = node
    outputs = output_nodes(graph_module)
    specs = program.graph_signature.output_specs
    user = [node for node, spec in zip(outputs, specs, strict=True) if spec.kind != OutputKind.BUFFER_MUTATION]
    by_name = {node.name: node for node in outputs if isinstance(node, torch.fx.Node)}
    graph.output_node().args = ((*user, *(by_name[state.new_value] for state in states)),)
    graph_module.recompile()
    return graph_module


def make_stateful(model: ov.Model, states: list[StateBuffer], name: str = "openvino_backend") -> None:
    """Turn the last ``len(states)`` Parameters and Results of ``model`` into variables, in place."""
    if not states:
        return
    parameters = list(model.get_parameters())[-len(states) :]
    results = list(model.get_results())[-len(states) :]
    sinks, variables = [], []
    for state, parameter, result in zip(states, parameters, results, strict=True):
        info = util.VariableInfo()
        info.variable_id = f"{name}.{state.target}"
        info.data_type = pt_to_ov_type_map[str(state.initial.dtype)]
        info.data_shape = parameter.get_partial_shape()
        variable = util.Variable(info)
        # The buffer's own memory (an LLM's caches are hundreds of MB): the program keeps it.
        initial = opset.constant(state.initial.detach().contiguous().numpy(), shared_memory=True)
        current = opset.read_value(initial, variable)
        for reader in list(parameter.output(0).get_target_inputs()):
            reader.replace_source_output(current.output(0))
        sink = assign(initial, variable)  # takes a node, not one output of it: rewired next
        sink.input(0).replace_source_output(result.input_value(0))
        sinks.append(sink)
        variables.append(variable)
    for result in results:
        model.remove_result(result)
    for parameter in parameters:
        model.remove_parameter(parameter)
    model.add_variables(variables)
    model.add_sinks(sinks)
    model.validate_nodes_and_infer_types()


def drop_unread_state(model: ov.Model) -> int:
    """Remove, in place, each variable no op of ``model`` reads any more, with its ``Assign``; how many.

    A buffer read only for its shape or type (transformers' static cache copies the position into
    a 0-d ``cumulative_length`` at every call) leaves its ``ReadValue`` without readers once those
    are constants. Its value is never read, so not writing it changes nothing; written without a
    ``ReadValue``, it would make a blob OpenVINO cannot import again (the variable is declared by
    its ``ReadValue`` in the serialized model).
    """
    read = {op.get_variable_id() for op in model.get_ordered_ops() if op.get_type_name() == "ReadValue"}
    unread = [
        sink for sink in model.get_sinks() if sink.get_type_name() == "Assign" and sink.get_variable_id() not in read
    ]
    for sink in unread:
        model.remove_sink(sink)
        model.remove_variable(model.get_variable_by_id(sink.get_variable_id()))
    if unread:
        model.validate_nodes_and_infer_types()
    return len(unread)
