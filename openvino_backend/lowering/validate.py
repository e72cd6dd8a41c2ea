"""Checks on what OpenVINO actually produced.

The partitioner keeps known copies away from partition outputs, but its list
is kept by hand. These checks look at the converted ``ov.Model`` (and at the
compiled model's runtime graph, since plugin transformations can remove ops
too) so that anything the list misses fails at export instead of returning
stale memory at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

import openvino as ov
import torch
from openvino.frontend.pytorch.utils import pt_to_ov_type_map

from openvino_backend.diagnostics import EdgeTensorError, Finding, NodeRef, OutputTypeError, PassthroughOutputError
from openvino_backend.graph import (
    dtype_of,
    first_problem,
    op_name,
    output_nodes,
    tensors_read,
    user_input_nodes,
    user_output_nodes,
)
from openvino_backend.runtime import openvino_version, unbindable, unbindable_output


@dataclass(frozen=True)
class Passthrough:
    """Result ``output`` is fed directly by Parameter ``parameter``."""

    output: int
    parameter: int
    parameter_name: str


def find_passthroughs(model: ov.Model) -> list[Passthrough]:
    """Every Result whose input is a Parameter; one pass over the Results."""
    found = []
    for index, result in enumerate(model.get_results()):
        source = result.input_value(0).get_node()
        if source.get_type_name() == "Parameter":
            found.append(Passthrough(index, model.get_parameter_index(source), source.get_friendly_name()))
    return found


def validate_model(
    model: ov.Model,
    graph_module: torch.fx.GraphModule | None = None,
    *,
    partition: int | None = None,
    stage: str = "converted",
) -> None:
    """Raise ``PassthroughOutputError`` naming every output fed by an input.

    ``graph_module`` is the partition's FX graph the model came from: with it,
    the error names the FX nodes and the user's source lines. ``stage`` says
    which graph was checked ("converted" ov.Model or the "compiled" runtime one).
    """
    passthroughs = find_passthroughs(model)
    if passthroughs:
        raise passthrough_error(passthroughs, graph_module, partition=partition, stage=stage)


@dataclass(frozen=True)
class TypeMismatch:
    """Result ``output`` has element type ``actual``; ExecuTorch's tensor is ``expected``."""

    output: int
    actual: str
    expected: torch.dtype


def find_type_mismatches(model: ov.Model, dtypes: list[torch.dtype | None]) -> list[TypeMismatch]:
    """Results whose element type is not the dtype PyTorch gives that output.

    Such a Result fails to bind at run time (error 0x1), and the difference
    means OpenVINO computed it in another type (``cumsum`` of bools in i8,
    overflowing past 127), so converting the Result would hide wrong values.
    """
    found = []
    for index, (result, dtype) in enumerate(zip(model.get_results(), dtypes, strict=True)):
        if dtype is None:
            continue
        actual = result.input_value(0).get_element_type()
        if actual != pt_to_ov_type_map[str(dtype)]:
            found.append(TypeMismatch(index, actual.to_string(), dtype))
    return found


def validate_output_types(model: ov.Model, graph_module: torch.fx.GraphModule, *, partition: int | None = None) -> None:
    """Raise ``OutputTypeError`` for every output OpenVINO types differently from PyTorch."""
    nodes = output_nodes(graph_module)
    mismatches = find_type_mismatches(model, [dtype_of(n) for n in nodes])
    if not mismatches:
        return
    ops = sorted({op_name(nodes[m.output]) for m in mismatches})
    raise OutputTypeError(
        summary=f"{len(mismatches)} output(s) would have another element type than in PyTorch",
        findings=tuple(
            Finding(
                f"output {m.output}: OpenVINO computes {m.actual}, PyTorch {str(m.expected).removeprefix('torch.')}",
                (NodeRef.from_node(nodes[m.output]),),
            )
            for m in mismatches
        ),
        why=(
            f"OpenVINO {openvino_version()} infers another type for {', '.join(ops)}; the runtime cannot\n"
            "bind such an output, and the values may differ (overflow in a narrower type)"
        ),
        fix=(
            "the partitioner's conversion check should keep this op out; please report it. Until then:\n"
            f"OpenvinoPartitioner(compile_spec, op_types_to_skip={{{', '.join(repr(o) for o in ops)}}})"
        ),
        partition=partition,
        output_indices=tuple(m.output for m in mismatches),
    )


def validate_compiled(
    compiled: ov.CompiledModel, graph_module: torch.fx.GraphModule | None = None, *, partition: int | None = None
) -> None:
    """The same check on the plugin's runtime graph (Output fed by Input)."""
    validate_model(compiled.get_runtime_model(), graph_module, partition=partition, stage="compiled")


def passthrough_error(
    passthroughs: list[Passthrough],
    graph_module: torch.fx.GraphModule | None,
    *,
    partition: int | None,
    stage: str,
) -> PassthroughOutputError:
    findings = tuple(_finding(p, graph_module) for p in passthroughs)
    ops = sorted({n.op for f in findings for n in f.nodes if n.op not in ("placeholder", "output")})
    op_text = ", ".join(ops) or "the ops in between"
    first = passthroughs[0]
    if len(passthroughs) == 1:
        summary = f"would return input `{_input_name(first, graph_module)}` unchanged as output {first.output}"
    else:
        summary = f"{len(passthroughs)} outputs would return partition inputs unchanged"
    version = openvino_version()
    if stage == "compiled":
        how = f"OpenVINO {version}'s CPU plugin removed {op_text} while compiling"
    else:
        how = f"OpenVINO {version} converts {op_text} to nothing"
    return PassthroughOutputError(
        summary=summary,
        findings=findings,
        why=(
            f"{how}, so a Result is fed straight by a Parameter;\n"
            "the runtime binds inputs before outputs, and in that order the CPU plugin does not\n"
            "write such an output (the program would return stale memory)"
        ),
        fix=(
            "the partitioner should keep this op out of the partition; please report it\n"
            f"(op: {op_text}, OpenVINO {version}). Until then, keep it out yourself:\n"
            f"OpenvinoPartitioner(compile_spec, op_types_to_skip={{{', '.join(repr(o) for o in ops)}}})"
        ),
        partition=partition,
        output_indices=tuple(p.output for p in passthroughs),
    )


def _input_name(passthrough: Passthrough, graph_module: torch.fx.GraphModule | None) -> str:
    if graph_module is None:
        return passthrough.parameter_name
    placeholders = list(graph_module.graph.find_nodes(op="placeholder"))
    return placeholders[passthrough.parameter].name


def _finding(passthrough: Passthrough, graph_module: torch.fx.GraphModule | None) -> Finding:
    name = _input_name(passthrough, graph_module)
    message = f"output {passthrough.output} is input `{name}` unchanged"
    if graph_module is None:
        return Finding(message)
    node = output_nodes(graph_module)[passthrough.output]
    return Finding(message, tuple(NodeRef.from_node(n) for n in _path_to_input(node)))


def _path_to_input(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The chain of ops from a partition input to ``node``, in program order."""
    path = []
    while node.op == "call_function":
        path.append(node)
        sources = node.all_input_nodes
        if not sources:
            break
        node = sources[0]
    return path[::-1]


def validate_edge_tensors(
    partition_graph: torch.export.ExportedProgram | torch.fx.GraphModule, *, partition: int | None = None
) -> None:
    """Raise ``EdgeTensorError`` for every partition input or output the runtime cannot bind correctly.

    The partitioner's ``keep_unbindable_tensors_out`` rule keeps such tensors
    off the edge; this check does not trust it. The stock runtime binds
    outputs at the sizes ExecuTorch planned (the upper bound of a dynamic dim)
    and never resizes them, cannot bind a 0-d or empty tensor, and maps only some
    dtypes: any of these would fail at run time, or return the wrong shape.
    Given a program, its user inputs are the partition inputs (lifted weights are not bound).
    """
    if isinstance(partition_graph, torch.export.ExportedProgram):
        inputs, outputs = user_input_nodes(partition_graph), user_output_nodes(partition_graph)
    else:
        inputs, outputs = partition_graph.graph.find_nodes(op="placeholder"), output_nodes(partition_graph)
    findings = []
    for index, node in enumerate(inputs):
        readers = list(node.users)
        if (why := first_problem(tensors_read(node, readers), unbindable)) is not None:
            findings.append(Finding(f"input {index} `{node.name}` crosses the edge {why}", _refs(readers)))
    for index, node in enumerate(outputs):
        if not isinstance(node, torch.fx.Node):
            continue
        # Read by the graph's output node: every tensor it holds leaves.
        if (why := first_problem(tensors_read(node, node.users), unbindable_output)) is not None:
            findings.append(Finding(f"output {index} leaves the partition {why}", _refs([node])))
    if not findings:
        return
    ops = sorted({n.op for f in findings for n in f.nodes})
    raise EdgeTensorError(
        summary=f"{len(findings)} tensor(s) at the partition edge that the OpenVINO runtime cannot bind correctly",
        findings=tuple(findings),
        why=(
            "the ExecuTorch OpenVINO runtime binds partition outputs at their planned (upper-bound) sizes\n"
            "and never resizes them, refuses 0-d and empty tensors (error 0x1) and binds only some dtypes; the\n"
            "program would fail at run time or return a tensor of the wrong shape"
        ),
        fix=(
            "the partitioner's edge rules should keep these nodes out; please report it. Until then:\n"
            f"OpenvinoPartitioner(compile_spec, op_types_to_skip={{{', '.join(repr(o) for o in ops)}}})"
        ),
        partition=partition,
    )


def _refs(nodes: list[torch.fx.Node]) -> tuple[NodeRef, ...]:
    return tuple(NodeRef.from_node(n) for n in nodes if n.op == "call_function")
