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

from openvino_backend.diagnostics import Finding, NodeRef, PassthroughOutputError
from openvino_backend.precision import openvino_version


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
    outputs = torch.fx.node.map_aggregate(graph_module.graph.output_node().args[0], lambda n: n)
    flat = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return Finding(message, tuple(NodeRef.from_node(n) for n in _path_to_input(flat[passthrough.output])))


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
