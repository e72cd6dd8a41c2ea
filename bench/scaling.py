"""How partitioning and validation time grow with graph size (should be linear)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import openvino as ov
import openvino.opset13 as opset
import torch
from executorch.exir.dialects._ops import ops as exir_ops
from torch.export.graph_signature import ExportGraphSignature

from openvino_backend.lowering.validate import find_passthroughs
from openvino_backend.partition.edge_rules import DEFAULT_RULES
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.partition.view import PartitionView


def fx_chain(nodes: int) -> SimpleNamespace:
    """An edge-dialect chain x -> sin -> clone -> sin ..., every 50th value also returned.

    Built directly as FX (exporting 100k nodes would measure torch.export);
    wrapped in just the parts of an ExportedProgram the partitioner reads.
    """
    graph = torch.fx.Graph()
    example = torch.empty(4, 4)
    value = graph.placeholder("x")
    value.meta["val"] = example
    outputs = []
    for index in range(nodes):
        op = exir_ops.edge.aten.sin.default if index % 2 == 0 else exir_ops.edge.aten.clone.default
        value = graph.call_function(op, (value,))
        value.meta["val"] = example
        if index % 50 == 49:
            outputs.append(value)
    graph.output(tuple([*outputs, value]))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    signature = ExportGraphSignature(input_specs=[], output_specs=[])
    return SimpleNamespace(graph_module=module, graph=graph, graph_signature=signature, state_dict={}, constants={})


def time_rules(nodes: int, repeats: int = 3) -> float:
    """Seconds for every boundary rule on one partition holding the whole chain."""
    program = fx_chain(nodes)
    view = PartitionView(frozenset(n for n in program.graph.nodes if n.op == "call_function"), program)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for rule in DEFAULT_RULES:
            list(rule(view))
        best = min(best, time.perf_counter() - start)
    return best


def time_proposal(nodes: int) -> float:
    """Seconds for ``OpenvinoPartitioner.propose``: torch's proposal plus our rules.

    torch's CapabilityBasedPartitioner is quadratic on long chains (its
    downstream-partition scan), so this is measured on the smaller sizes only.
    """
    program = fx_chain(nodes)
    start = time.perf_counter()
    OpenvinoPartitioner(check_numerics=False).propose(program)  # the proposal alone; checks are timed per model
    return time.perf_counter() - start


def ov_chain(nodes: int) -> ov.Model:
    """A chain of Sin ops; every 50th is a Result, and one Result is fed by the Parameter."""
    x = opset.parameter([4, 4], np.float32, name="x")
    value, results = x, [x.output(0)]
    for index in range(nodes):
        value = opset.sin(value)
        if index % 50 == 49:
            results.append(value.output(0))
    return ov.Model([*results, value.output(0)], [x])


def time_validation(nodes: int, repeats: int = 5) -> float:
    model = ov_chain(nodes)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        assert len(find_passthroughs(model)) == 1
        best = min(best, time.perf_counter() - start)
    return best
