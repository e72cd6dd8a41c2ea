"""What stays on the CPU must be runnable by ExecuTorch's kernels, or export fails now.

A node the partitioner leaves outside every partition runs on the kernels
the ExecuTorch runtime links. Three ways that fails at run time rather than
at export, each checked here against the kernels this installation's runtime
registers (the same library the tests and ``verify`` run on):

* an op kept whole for OpenVINO (``ops_to_not_decompose``) that no partition
  took: ExecuTorch's IR check refuses it, or it has no kernel;
* an op with no CPU kernel at all (``avg_pool3d`` in ExecuTorch 1.5.1, and
  the quantize / dequantize ops: the pip runtime links no quantized kernels);
* an op whose input and output are in different dim orders: the portable
  kernels check ``tensors_have_same_dim_order`` and fail (error 0x12).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Collection, Mapping
from functools import cache

import torch
from executorch.exir.operator.convert import to_out_variant

from openvino_backend.diagnostics import CpuKernelError, Finding, NodeRef
from openvino_backend.graph import is_getitem, non_default_dim_order, op_name
from openvino_backend.partition.view import Rejection

logger = logging.getLogger(__name__)

# Namespaces whose ops ExecuTorch runs through registered out-variant kernels. (An aten op with
# no out variant is handled another way: a view, a size op.)
_KERNEL_NAMESPACES = frozenset({"aten", "quantized_decomposed"})

# Ops whose job is to change the dim order (with or without ExecuTorch's dim-order ops): their
# kernels take any pair.
_LAYOUT_OPS = frozenset(
    {
        "dim_order_ops._clone_dim_order.default",
        "dim_order_ops._to_dim_order_copy.default",
        "aten.clone.default",
        "aten._to_copy.default",
    }
)


@cache
def registered_kernels() -> frozenset[str] | None:
    """``aten::add.out`` and the like, as the installed ExecuTorch runtime registers them."""
    try:
        from executorch.extension.pybindings.portable_lib import _get_operator_names
    except ImportError:  # no runtime in this environment: nothing to check against
        return None
    return frozenset(_get_operator_names())


_FIXES = {
    "kept whole": "skip the op so that it is decomposed for the CPU:\n"
    "OpenvinoPartitioner(compile_spec, op_types_to_skip={{{ops}}})",
    "no kernel": "compute it with ops ExecuTorch has CPU kernels for, or let OpenVINO take it (see its reason)",
    "dim orders": "give the op's tensors one memory format in the model (.contiguous(), or the same\n"
    "memory_format for all)",
}


def cpu_problem(node: torch.fx.Node, kept_whole: Collection[str]) -> tuple[str, str] | None:
    """Why ExecuTorch's CPU kernels cannot run ``node`` and which kind of fix applies, or None."""
    op = op_name(node)
    if op in kept_whole:
        return (
            f"{op} was kept whole for OpenVINO (not decomposed), and no ExecuTorch kernel takes it whole",
            "kept whole",
        )
    kernels = registered_kernels()
    overload = getattr(node.target, "_op", node.target)
    if kernels is not None and isinstance(overload, torch._ops.OpOverload) and overload.namespace in _KERNEL_NAMESPACES:
        try:
            out_variant, _ = to_out_variant(overload)
            missing = out_variant.name() if out_variant.name() not in kernels else None
        except Exception:  # no out variant registered (quantized ops without their kernel library)
            missing = None if overload.namespace == "aten" else overload.name()
        if missing is not None:
            return f"ExecuTorch's runtime has no CPU kernel for {missing}", "no kernel"
    val = node.meta.get("val")
    if op not in _LAYOUT_OPS and isinstance(val, torch.Tensor):
        # Tensors of the output's rank must share its dim order (broadcast operands of lower rank aside).
        same_rank = [arg for arg in node.all_input_nodes if _rank(arg) == val.dim()]
        if any(_order(arg) != _order(node) for arg in same_rank):
            why = "its tensors are in different dim orders, and ExecuTorch's CPU kernels require one (error 0x12)"
            return why, "dim orders"
    return None


def ensure_cpu_runnable(
    graph_module: torch.fx.GraphModule,
    delegated: Collection[torch.fx.Node],
    rejected: Mapping[torch.fx.Node, Rejection],
    kept_whole: Collection[str],
) -> None:
    """Raise ``CpuKernelError`` for every node left on the CPU that ExecuTorch's kernels cannot run."""
    findings = []
    kinds: dict[str, list[str]] = {}
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node in delegated or is_getitem(node) or node.target in _PYTHON_OPS:
            continue
        problem = cpu_problem(node, kept_whole)
        if problem is not None:
            why, kind = problem
            rejection = rejected.get(node)
            why_not = f"{rejection.reason} [{rejection.rule}]" if rejection is not None else "not delegated"
            findings.append(Finding(f"{why}; OpenVINO does not take it: {why_not}", (NodeRef.from_node(node),)))
            kinds.setdefault(kind, []).append(op_name(node))
    if not findings:
        return
    fixes = [_FIXES[kind].format(ops=", ".join(repr(o) for o in sorted(set(ops)))) for kind, ops in kinds.items()]
    raise CpuKernelError(
        summary=f"{len(findings)} op(s) left on the CPU that ExecuTorch's kernels cannot run",
        findings=tuple(findings),
        why="the program would fail at run time (or in ExecuTorch's IR check) instead of at export",
        fix="\n".join(fixes),
    )


def _rank(node: torch.fx.Node) -> int | None:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else None


def _order(node: torch.fx.Node) -> tuple[int, ...] | None:
    return non_default_dim_order(node.meta.get("val"))


_PYTHON_OPS = frozenset(
    {operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg}
)
