"""Aliases of tensors in a non-default dim order, written as the copies they become.

``x.detach()`` (or ``aten.alias``) of a channels-last ``x`` reaches the edge
dialect as ``alias_copy``, whose result is laid out contiguously: a copy that
changes the dim order. ExecuTorch's CPU kernel for ``alias_copy`` requires one
dim order (error 0x12 at run time), and OpenVINO's frontend converts it to
nothing, so neither side could run it as it stands. ``clone`` keeps the
input's layout, as eager's alias does, and becomes ``_clone_dim_order``, which
both sides run. In eager the result is a view with ``x``'s strides; the copy
has the same values and layout. An alias of a program input is left as it is:
OpenVINO takes it as a transpose at the partition's edge.
"""

from __future__ import annotations

import logging

import torch
from torch.export import ExportedProgram

from openvino_backend.transform import copied

logger = logging.getLogger(__name__)

_ALIASES = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


def layout_keeping_aliases_as_clones(program: ExportedProgram) -> ExportedProgram:
    """A copy of ``program`` whose aliases of tensors in a non-default dim order are ``clone``s
    (``program`` itself when it has none)."""
    if not any(_rewritable(node) for node in program.graph.nodes):
        return program
    program = copied(program)
    rewritten = []
    for node in [n for n in program.graph.nodes if _rewritable(n)]:
        node.target = torch.ops.aten.clone.default
        node.args, node.kwargs = node.args[:1], {}
        rewritten.append(node.name)
    program.graph_module.recompile()
    logger.debug("aliases of tensors in a non-default dim order, as clones: %s", ", ".join(rewritten))
    return program


def _rewritable(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target not in _ALIASES:
        return False
    source = node.args[0] if node.args else None
    # An alias of a program input stays: as a partition's input and output in two dim orders it is
    # a real transpose in OpenVINO (lowering/edge_layout.py), delegated whole.
    if not isinstance(source, torch.fx.Node) or source.op == "placeholder":
        return False
    val = source.meta.get("val")
    return isinstance(val, torch.Tensor) and not val.is_contiguous() and val.dim_order() != tuple(range(val.dim()))
