"""Which FX nodes OpenVINO can take, one decision per node.

The table of supported ops is OpenVINO's own (the one its ``torch.compile``
backend uses; ``ops.openvino_supported_ops``), so this backend never claims an
op OpenVINO cannot convert and never lags behind one it can. Every "no" is a
``Rejection`` naming the rule that made it. Partition-edge rules live in
``edge_rules.py``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch
from torch.fx.passes.operator_support import OperatorSupportBase

from openvino_backend.graph import op_name
from openvino_backend.ops import facts, is_bound_pad, openvino_supported_ops
from openvino_backend.partition.view import Rejection
from openvino_backend.transform.dynamic import restores_size


class OpenvinoOperatorSupport(OperatorSupportBase):
    """Answers "may this node go to OpenVINO?", recording every "no" and its reason.

    ``excluded`` holds nodes the partition-edge rules have already kept out,
    with their reasons; they are refused here so the partitioner can propose
    partitions again without them. ``rejected`` collects every refusal of
    this instance, for the partitioner to report once it has settled.
    ``candidates``, when given, limits a proposal round to those nodes.
    """

    def __init__(
        self,
        op_types_to_skip: Collection[str] = (),
        op_names_to_skip: Collection[str] = (),
        excluded: Mapping[torch.fx.Node, Rejection] | None = None,
        candidates: Collection[torch.fx.Node] | None = None,
    ) -> None:
        self.rejected: dict[torch.fx.Node, Rejection] = {}
        self._op_types_to_skip = frozenset(op_types_to_skip)
        self._op_names_to_skip = frozenset(op_names_to_skip)
        self._excluded = excluded or {}
        self._candidates = candidates

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if self._candidates is not None and node not in self._candidates:
            return False  # not proposed this round (kept in, or out, as the last round decided)
        rejection = self.rejection(node)
        if rejection is None:
            return True
        self.rejected[node] = rejection
        return False

    def rejection(self, node: torch.fx.Node) -> Rejection | None:
        """Why ``node`` may not be delegated (and by which rule), or None when it may."""
        if node in self._excluded:
            return self._excluded[node]
        reason = self._why_not(node)
        return None if reason is None else Rejection(node, *reason)

    def _why_not(self, node: torch.fx.Node) -> tuple[str, str] | None:
        op = op_name(node)
        if is_bound_pad(node):
            return None
        if restores_size(node):
            why = "cuts a padded OpenVINO output back to its run-time size; runs on the CPU, whose kernel resizes"
            return "dynamic_output_slice", why
        if op in self._op_types_to_skip or node.name in self._op_names_to_skip:
            return "skipped_by_user", "skipped by the partitioner's op_types_to_skip / op_names_to_skip"
        if op == "getitem":
            return None
        if isinstance(node.meta.get("val"), (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            # A delegate returns tensors; ExecuTorch evaluates size arithmetic on the CPU at run time.
            return "size_on_cpu", "computes a size (a scalar, not a tensor), which ExecuTorch evaluates on the CPU"
        if op not in openvino_supported_ops():
            return "openvino_op_support", f"OpenVINO's PyTorch frontend has no conversion for {op}"
        differs = facts(op).computes_differently
        if differs is not None and (why := differs(node)) is not None:
            return "computes_differently", why
        return None
