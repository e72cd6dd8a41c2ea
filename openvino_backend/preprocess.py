"""``OpenvinoBackend``: one partition in, an exported OpenVINO blob out.

The pipeline, one named step each::

    passes -> check edge dim orders -> convert -> validate -> compile
           -> validate compiled -> export

The class name must be exactly ``OpenvinoBackend``: the stock ExecuTorch
runtime finds its C++ half by that name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import lru_cache
from typing import final

import openvino as ov
import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.passes.memory_format_ops_pass import DimOrderOpsRevertPass
from torch.export import ExportedProgram

from openvino_backend.boundary import non_default_dim_order
from openvino_backend.convert import conversion_error, convert
from openvino_backend.diagnostics import DimOrderError, Finding, NodeRef
from openvino_backend.guard import ensure_sole_backend
from openvino_backend.passes import DecomposeFloorDividePass
from openvino_backend.validate import validate_compiled, validate_model

logger = logging.getLogger(__name__)

# Compile-spec key the partitioner adds so errors can name the partition. The
# runtime reads only "device" and ignores other keys.
PARTITION_KEY = "openvino_backend.partition"
DEVICE_KEY = "device"


@dataclass(frozen=True)
class CompileOptions:
    device: str = "CPU"
    partition: int | None = None
    properties: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_specs(cls, specs: list[CompileSpec]) -> CompileOptions:
        values = {spec.key: bytes(spec.value).decode().rstrip("\0") for spec in specs}
        partition = values.pop(PARTITION_KEY, None)
        return cls(
            device=values.pop(DEVICE_KEY, "CPU"),
            partition=int(partition) if partition is not None else None,
            properties=values,
        )


@final
class OpenvinoBackend(BackendDetails):
    @classmethod
    def preprocess(cls, edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        ensure_sole_backend(cls)
        options = CompileOptions.from_specs(compile_specs)
        check_edge_dim_orders(edge_program, partition=options.partition)
        graph_module = run_passes(edge_program).module()
        model = convert(graph_module, partition=options.partition)
        validate_model(model, graph_module, partition=options.partition)
        compiled = compile_model(model, options, graph_module)
        validate_compiled(compiled, graph_module, partition=options.partition)
        return PreprocessResult(processed_bytes=compiled.export_model().getvalue())


def run_passes(program: ExportedProgram) -> ExportedProgram:
    """Rewrite dim-order ops to aten and fix floor division, for the frontend."""
    for make_pass in (DimOrderOpsRevertPass, DecomposeFloorDividePass):
        result = make_pass()(program.graph_module)
        if result is not None and result.graph_module is not None:
            program._graph_module = result.graph_module
    return program


def check_edge_dim_orders(program: ExportedProgram, *, partition: int | None = None) -> None:
    """Raise ``DimOrderError`` for partition inputs/outputs in a non-default dim order."""
    user_inputs = set(program.graph_signature.user_inputs)
    findings = []
    for node in program.graph.find_nodes(op="placeholder"):
        order = non_default_dim_order(node.meta.get("val"))
        if node.name in user_inputs and order is not None:
            readers = tuple(NodeRef.from_node(user) for user in node.users)
            findings.append(Finding(f"input `{node.name}` arrives in dim order {order}", readers))
    outputs = program.graph.output_node().args[0]
    for index, node in enumerate(outputs if isinstance(outputs, (list, tuple)) else [outputs]):
        if isinstance(node, torch.fx.Node):
            order = non_default_dim_order(node.meta.get("val"))
            if order is not None:
                findings.append(Finding(f"output {index} leaves in dim order {order}", (NodeRef.from_node(node),)))
    if findings:
        raise DimOrderError(
            summary="a tensor crosses the partition edge in a non-default dim order",
            findings=tuple(findings),
            why=(
                "the ExecuTorch OpenVINO runtime binds partition inputs and outputs by their logical\n"
                "sizes over their data pointer, so a channels-last (or otherwise permuted) tensor\n"
                "would be read or written in the wrong layout"
            ),
            fix=(
                "OpenvinoPartitioner keeps such nodes out of partitions by default; if you passed\n"
                "boundary_rules, include keep_non_default_dim_order_out. Otherwise make the tensor\n"
                "contiguous before it reaches the delegated ops (e.g. .contiguous())."
            ),
            partition=partition,
        )


def compile_model(model: ov.Model, options: CompileOptions, graph_module: torch.fx.GraphModule) -> ov.CompiledModel:
    try:
        return _core().compile_model(model, options.device, options.properties)
    except RuntimeError as error:
        raise conversion_error(
            f"OpenVINO could not compile for {options.device}", graph_module, options.partition, error
        ) from error


@lru_cache(maxsize=1)
def _core() -> ov.Core:
    # One Core per process: creating it loads plugins, which dominates small exports.
    return ov.Core()
