"""Dynamic-shape outputs: padded to their upper bound in OpenVINO, cut to size on the CPU.

The stock ExecuTorch runtime binds a delegate's inputs at their actual sizes
but its outputs at the sizes ExecuTorch planned (the upper bound of each
dynamic dim), and never resizes an output. A partition whose output has a
dynamic size would hand back an upper-bound tensor with stale rows.

So before decomposition (``OpenvinoPartitioner.transform_for_pre_decomposition``)
every dynamic user output ``y`` of shape ``(s0, 10)`` (``s0 <= 8``) becomes::

    p = openvino_backend.pad_to_bound(y, [8, 10])     # static shape: a valid delegate output
    y' = p[0:sym_size(x, 0)]                          # on the CPU, resized at run time

``pad_to_bound`` is always delegated: lowering/convert.py turns it into an OpenVINO
``Pad`` to the bound (its Result is then static), and ExecuTorch's
``slice_copy`` kernel, which does resize its output, gives the real shape
back from the input's run-time size. Pad and slice copy one output each;
everything before them runs in OpenVINO with dynamic dims.
"""

from __future__ import annotations

import copy
import logging
import operator
from collections.abc import Callable

import sympy
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind, TensorArgument
from torch.utils._sympy.functions import FloorDiv
from torch.utils._sympy.value_ranges import bound_sympy

from openvino_backend.graph import op_name
from openvino_backend.ops import is_bound_pad

logger = logging.getLogger(__name__)

SLICE_OPS = frozenset({"aten.slice_copy.Tensor", "aten.slice.Tensor"})


@torch.library.custom_op("openvino_backend::pad_to_bound", mutates_args=())
def pad_to_bound(x: torch.Tensor, size: list[int]) -> torch.Tensor:
    """``x`` zero-padded at the end of every dim to ``size`` (what OpenVINO computes for it)."""
    out = x.new_zeros(size)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out


@pad_to_bound.register_fake
def _(x: torch.Tensor, size: list[int]) -> torch.Tensor:
    return x.new_empty(size)


def restores_size(node: torch.fx.Node) -> bool:
    """True for the CPU slice that cuts a padded OpenVINO output back to its run-time size."""
    return (
        node.op == "call_function"
        and op_name(node) in SLICE_OPS
        and isinstance(node.args[0], torch.fx.Node)
        and (is_bound_pad(node.args[0]) or restores_size(node.args[0]))
    )


def pad_dynamic_outputs(program: ExportedProgram, bindable: Callable[[torch.Tensor], bool]) -> ExportedProgram:
    """A copy of ``program`` whose dynamic user outputs go through ``pad_to_bound`` + slice.

    Returns ``program`` itself when no output needs it. An output is left as
    it is (and kept on the CPU by the partitioner's edge rule) when a dim has
    no upper bound, when its size cannot be rebuilt from the inputs' sizes,
    or when ``bindable`` says the runtime could not bind it anyway.
    """
    plans = {}
    by_name = {node.name: node for node in program.graph.nodes}
    for spec in program.graph_signature.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT or not isinstance(spec.arg, TensorArgument):
            continue
        node = by_name.get(spec.arg.name)
        val = node.meta.get("val") if node is not None else None
        if (
            node is None
            or node.op == "placeholder"  # an input returned as it is: nothing to compute
            or not isinstance(val, torch.Tensor)
            or all(isinstance(d, int) for d in val.shape)
            or not val.is_contiguous()  # the pad would change its memory format
            or not bindable(val)
        ):
            continue
        bound = _upper_bound(program, val)
        if bound is None:
            logger.info("output %s has an unbounded dynamic dim %s; it stays on the CPU", spec.arg.name, val.shape)
            continue
        plans[spec.arg.name] = bound
    if not plans:
        return program

    graph_module = copy.deepcopy(program.graph_module)
    graph = graph_module.graph
    by_name = {node.name: node for node in graph.nodes}
    sizes = _input_sizes(program, graph)
    output = graph.output_node()
    renamed: dict[str, str] = {}
    with graph.inserting_before(output):
        for name, bound in plans.items():
            node = by_name[name]
            shape = node.meta["val"].shape
            ends = [None if isinstance(d, int) else _build(d.node.expr, sizes, graph) for d in shape]
            if any(end is False for end in ends):
                logger.info("output %s: a size is not an expression of the inputs' sizes; it stays on the CPU", name)
                continue
            result = _call(graph, torch.ops.openvino_backend.pad_to_bound.default, (node, bound))
            result.meta.update({k: node.meta[k] for k in ("stack_trace", "nn_module_stack") if k in node.meta})
            for dim, end in enumerate(ends):
                if end is not None:
                    result = _call(graph, torch.ops.aten.slice.Tensor, (result, dim, 0, end))
            output.replace_input_with(node, result)
            renamed[name] = result.name
    if not renamed:
        return program
    signature = copy.deepcopy(program.graph_signature)
    for spec in signature.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT and isinstance(spec.arg, TensorArgument) and spec.arg.name in renamed:
            spec.arg = TensorArgument(name=renamed[spec.arg.name])
    logger.info("padding %d dynamic output(s) to their upper bound inside OpenVINO", len(renamed))
    # Every new node carries its fake value (``_call``); dead size nodes of a skipped output go.
    graph.eliminate_dead_code()
    graph_module.recompile()
    return program._update(graph_module, signature)


def _upper_bound(program: ExportedProgram, val: torch.Tensor) -> list[int] | None:
    ranges = program.range_constraints
    bound = []
    for dim in val.shape:
        if isinstance(dim, int):
            bound.append(dim)
            continue
        upper = bound_sympy(dim.node.expr, ranges).upper
        if not upper.is_finite:
            return None
        bound.append(int(upper))
    return bound


def _input_sizes(program: ExportedProgram, graph: torch.fx.Graph) -> dict[sympy.Symbol, tuple[torch.fx.Node, int]]:
    """For each symbol, a user input and the dim whose size it is."""
    user_inputs = set(program.graph_signature.user_inputs)
    found: dict[sympy.Symbol, tuple[torch.fx.Node, int]] = {}
    for node in graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if node.name not in user_inputs or not isinstance(val, torch.Tensor):
            continue
        for dim, size in enumerate(val.shape):
            if not isinstance(size, int) and isinstance(size.node.expr, sympy.Symbol):
                found.setdefault(size.node.expr, (node, dim))
    return found


_ARITHMETIC = {sympy.Add: operator.add, sympy.Mul: operator.mul}


def _build(expr: sympy.Expr, sizes: dict, graph: torch.fx.Graph) -> torch.fx.Node | int | bool:
    """FX nodes computing ``expr`` from the inputs' sizes at run time; False if it cannot."""
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        if expr not in sizes:
            return False
        source, dim = sizes[expr]
        return _call(graph, torch.ops.aten.sym_size.int, (source, dim))
    if isinstance(expr, FloorDiv):
        parts = [_build(arg, sizes, graph) for arg in expr.args]
        return False if any(p is False for p in parts) else _call(graph, operator.floordiv, tuple(parts))
    combine = _ARITHMETIC.get(type(expr))
    if combine is None:
        return False
    parts = [_build(arg, sizes, graph) for arg in expr.args]
    if any(p is False for p in parts):
        return False
    result = parts[0]
    for part in parts[1:]:
        result = _call(graph, combine, (result, part))
    return result


def _call(graph: torch.fx.Graph, target: Callable, args: tuple) -> torch.fx.Node:
    """A new node and its ``meta["val"]``, computed on the arguments' fake values."""
    node = graph.call_function(target, args)
    node.meta["val"] = target(*(a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args))
    return node
