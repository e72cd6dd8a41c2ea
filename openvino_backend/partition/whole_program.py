"""Defences that look at the whole program once partitions have settled.

Each raises a typed ``OpenvinoExportError`` for a program that would fail
after export (on the CPU, in ExecuTorch's fusing, at load), instead of letting
it through.
"""

from __future__ import annotations

import copy

import torch
from executorch.exir.lowered_backend_module import create_submodule_from_nodes
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import Partition

from openvino_backend.diagnostics import DeviceError, EdgeTensorError, Finding, FusionOrderError, NodeRef
from openvino_backend.ops import is_bound_pad
from openvino_backend.partition.view import Rejection
from openvino_backend.runtime import missing_devices, openvino_core, openvino_version


def ensure_device(device: str) -> None:
    """Refuse a device OpenVINO cannot find now, rather than when the first partition compiles."""
    missing = missing_devices(device)
    if not missing:
        return
    available = ", ".join(openvino_core().available_devices) or "none"
    raise DeviceError(
        summary=f"OpenVINO finds no {', '.join(missing)} device on this machine (compile spec device={device!r})",
        why=f"available devices: {available} (OpenVINO {openvino_version()})",
        fix=f'OpenvinoPartitioner([CompileSpec("device", b"{openvino_core().available_devices[0]}")])'
        if openvino_core().available_devices
        else "install the OpenVINO plugin for the device, or lower on a machine that has it",
    )


def ensure_pads_delegated(
    program: ExportedProgram, delegated: set[torch.fx.Node], rejected: dict[torch.fx.Node, Rejection]
) -> None:
    """``pad_to_bound`` has no CPU kernel: a program that leaves one on the CPU would not load."""
    stranded = [n for n in program.graph.nodes if is_bound_pad(n) and n not in delegated]
    if stranded:
        raise EdgeTensorError(
            summary=f"{len(stranded)} dynamic output(s) could not be padded to their upper bound in OpenVINO",
            findings=tuple(
                Finding(rejected[n].reason if n in rejected else "not delegated", (NodeRef.from_node(n.args[0]),))
                for n in stranded
            ),
            why="the pad that lets OpenVINO return a dynamic output has no CPU kernel",
            fix="export without this backend's dynamic-output padding:\n"
            "OpenvinoPartitioner(compile_spec, pad_dynamic_outputs=False)  (dynamic outputs then run on the CPU)",
        )


def ensure_fusable(graph_module: torch.fx.GraphModule, partitions: list[Partition]) -> None:
    """Fuse the partitions as ExecuTorch will, on a copy, when the graph holds run-time checks.

    ExecuTorch re-sorts the graph after fusing each partition, and its sort
    can move a node with no users (``_assert_async`` from ``one_hot``'s
    decomposition, say) past the output node: an invalid program that torch's
    verifier rejects with a bare ``AssertionError``. Only graphs with such
    nodes are at risk, so only they pay for the trial.
    """
    checks = [n for n in graph_module.graph.nodes if n.op == "call_function" and not n.users]
    if not checks or not partitions:
        return
    trial = copy.deepcopy(graph_module)
    by_name = {node.name: node for node in trial.graph.nodes}
    for index, partition in enumerate(partitions):
        nodes = [by_name[node.name] for node in graph_module.graph.nodes if node in partition.nodes]
        create_submodule_from_nodes(trial, nodes, f"trial_{index}")
    last = list(trial.graph.nodes)[-1]
    if last.op == "output":
        return
    raise FusionOrderError(
        summary="ExecuTorch's partition fusing would place run-time checks after the program's output",
        findings=(
            Finding("checks with no users, made by a decomposition:", tuple(NodeRef.from_node(n) for n in checks)),
        ),
        why=(
            "after fusing a partition ExecuTorch re-sorts the graph, and its sort puts nodes that nothing\n"
            "reads after the output when their inputs are computed late; torch's verifier then refuses the program"
        ),
        fix=(
            "compute the op without its run-time check (ExecuTorch drops these checks at to_executorch anyway);\n"
            "for one_hot: (index.unsqueeze(-1) == torch.arange(num_classes)).to(dtype)"
        ),
    )
