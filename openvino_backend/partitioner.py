"""``OpenvinoPartitioner``: choose what OpenVINO runs, and keep the edges safe.

Nodes go to OpenVINO when OpenVINO converts their op (``support.py``). The
partitions proposed from that are then checked by the partition-edge rules
(``boundary.py``); a node a rule objects to is refused and partitions are
proposed again, until no rule objects. Every refusal is recorded in a
``WhyNoPartitionReporter`` and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import WhyNoPartitionReporter, tag_constant_data
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition

from openvino_backend.boundary import DEFAULT_RULES, BoundaryRule, PartitionView, is_getitem, unbindable
from openvino_backend.conversion_check import keep_converted_passthroughs_out
from openvino_backend.diagnostics import EdgeTensorError, Finding, NodeRef, op_name
from openvino_backend.dynamic import is_bound_pad, pad_dynamic_outputs, restores_size
from openvino_backend.fold import fold_constant_subgraphs
from openvino_backend.guard import ensure_sole_backend
from openvino_backend.numerics import NumericalCheck, sample_values
from openvino_backend.precision import warn_if_reduced
from openvino_backend.preprocess import PARTITION_KEY, CompileOptions, OpenvinoBackend
from openvino_backend.support import OPS_TO_NOT_DECOMPOSE, OpenvinoOperatorSupport

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionReport:
    """What the last ``partition`` call decided, for tools and users."""

    partitions: int = 0
    delegated_nodes: int = 0
    kept_out: tuple[tuple[NodeRef, str], ...] = ()
    # Ops computing tensors in the program (getitems and size arithmetic aside).
    total_nodes: int = 0

    @property
    def delegated_share(self) -> float:
        return self.delegated_nodes / self.total_nodes if self.total_nodes else 0.0


class OpenvinoPartitioner(Partitioner):
    """Partitions an edge program for ``OpenvinoBackend``.

    Args:
        compile_spec: passed to the backend; ``device`` selects the OpenVINO
            device (default ``CPU``).
        op_types_to_skip: op names (``aten.add.Tensor``) never delegated.
        op_names_to_skip: FX node names never delegated.
        boundary_rules: the partition-edge rules. The default set is what
            makes lowered programs correct; pass a subset only to test the
            export-time checks that back them up.
        check_by_conversion: convert each proposed partition (no compile)
            and keep out any node whose output OpenVINO would feed straight
            from an input, whether or not its op is on the copy list.
        pad_dynamic_outputs: let outputs with dynamic dims be computed in
            OpenVINO, padded to their upper bound and cut to size on the CPU
            (``dynamic.py``). Off, every dynamic output stays on the CPU.
        fold_constants: compute subgraphs with no run-time input (index
            arithmetic, masks, position ids) once with PyTorch at export, up
            to a size (``fold.py``); OpenVINO receives their values.
        check_numerics: run each proposed partition in OpenVINO and in
            PyTorch on the same values and keep out the node that makes them
            disagree (``numerics.py``). Costs a compile per partition.
        sample_inputs: the program's inputs to run that check on (a tuple,
            as given to ``torch.export``); drawn from the inputs' shapes and
            dtypes when not given.
    """

    def __init__(
        self,
        compile_spec: list[CompileSpec] | None = None,
        op_types_to_skip: Collection[str] | None = None,
        op_names_to_skip: Collection[str] | None = None,
        *,
        boundary_rules: Sequence[BoundaryRule] = DEFAULT_RULES,
        check_by_conversion: bool = True,
        pad_dynamic_outputs: bool = True,
        fold_constants: bool = True,
        check_numerics: bool = True,
        sample_inputs: Sequence[object] | None = None,
    ) -> None:
        ensure_sole_backend(OpenvinoBackend)
        self.compile_spec = list(compile_spec or [])
        self.delegation_spec = DelegationSpec(OpenvinoBackend.__name__, self.compile_spec)
        self._op_types_to_skip = frozenset(op_types_to_skip or ())
        self._op_names_to_skip = frozenset(op_names_to_skip or ())
        self._boundary_rules = tuple(boundary_rules)
        self._final_rules = (keep_converted_passthroughs_out,) if check_by_conversion else ()
        self._pad_dynamic_outputs = pad_dynamic_outputs
        self._fold_constants = fold_constants
        self._check_numerics = check_numerics
        self._sample_inputs = sample_inputs
        self.numerical_check: NumericalCheck | None = None
        self.reporter = WhyNoPartitionReporter()
        self.report = PartitionReport()

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        return list(OPS_TO_NOT_DECOMPOSE), None

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        """Fold constant subgraphs (``fold.py``) and route dynamic outputs through ``pad_to_bound``
        (``dynamic.py``); a new program if either changes anything."""
        if self._fold_constants:
            exported_program = fold_constant_subgraphs(exported_program)
        if self._pad_dynamic_outputs:
            exported_program = pad_dynamic_outputs(exported_program, bindable=lambda val: unbindable(val) is None)
        return exported_program

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        ensure_sole_backend(OpenvinoBackend)
        partitions, rejected = self.propose(exported_program)
        _ensure_pads_delegated(exported_program, partitions, rejected)
        self.reporter = WhyNoPartitionReporter()
        for node, reason in rejected.items():
            self.reporter.report_reject(node, reason)
        self.report = PartitionReport(
            partitions=len(partitions),
            delegated_nodes=sum(1 for p in partitions for n in p.nodes if _computes(n)),
            kept_out=tuple((NodeRef.from_node(node), reason) for node, reason in rejected.items() if _computes(node)),
            total_nodes=sum(1 for n in exported_program.graph.nodes if _computes(n)),
        )

        partition_tags: dict[str, DelegationSpec] = {}
        for index, partition in enumerate(partitions):
            tag = f"openvino_{index}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            spec = [*self.compile_spec, CompileSpec(PARTITION_KEY, str(index).encode())]
            partition_tags[tag] = DelegationSpec(OpenvinoBackend.__name__, spec)
        tag_constant_data(exported_program)

        warn_if_reduced(_float_dtypes(partitions), CompileOptions.from_specs(self.compile_spec).device)
        logger.info("OpenVINO takes %d nodes in %d partition(s)", self.report.delegated_nodes, len(partitions))
        if rejected:
            logger.info("Nodes not delegated to OpenVINO:\n%s", self.reporter.get_table_report())
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=partition_tags)

    def propose(self, program: ExportedProgram) -> tuple[list[Partition], dict[torch.fx.Node, str]]:
        """Partitions that satisfy every boundary rule, and every node refused with why.

        Tags nothing: ``partition`` does that once the proposal has settled.
        """
        stages = [self._boundary_rules, self._final_rules]
        self.numerical_check = None
        if self._check_numerics and (values := sample_values(program, self._sample_inputs)) is not None:
            device = CompileOptions.from_specs(self.compile_spec).device
            self.numerical_check = NumericalCheck(program, values, device)
            stages.append((self.numerical_check,))
        excluded: dict[torch.fx.Node, str] = {}
        while True:
            support = OpenvinoOperatorSupport(self._op_types_to_skip, self._op_names_to_skip, excluded)
            partitions = CapabilityBasedPartitioner(
                program.graph_module, support, allows_single_node_partition=True
            ).propose_partitions()
            partitions = [p for p in partitions if _has_compute(p)]
            # The cheap FX rules first; conversion, then running, only once they are satisfied.
            rejected: dict[torch.fx.Node, str] = {}
            for rules in stages:
                rejected = _apply(rules, partitions, program, excluded)
                if rejected:
                    break
            if not rejected:
                return partitions, support.rejected
            for node, reason in rejected.items():
                logger.info("keeping %s (%s) out of OpenVINO: %s", node.name, op_name(node), reason)
            excluded.update(rejected)


def _apply(
    rules: Sequence[BoundaryRule],
    partitions: list[Partition],
    program: ExportedProgram,
    excluded: dict[torch.fx.Node, str],
) -> dict[torch.fx.Node, str]:
    views = [PartitionView(frozenset(p.nodes), program) for p in partitions]
    rejected: dict[torch.fx.Node, str] = {}
    for view in views:
        for rule in rules:
            for node, reason in rule(view):
                # torch's partitioner puts a getitem in its producer's partition whatever
                # the support check says, so refusing the getitem alone would change nothing.
                target = node.args[0] if is_getitem(node) else node
                if target not in excluded:
                    rejected.setdefault(target, reason)
    return rejected


def _computes(node: torch.fx.Node) -> bool:
    """An op of the model that computes tensors (not a getitem, size arithmetic, or the pads and
    slices ``dynamic.py`` adds)."""
    val = node.meta.get("val")
    return (
        node.op == "call_function"
        and isinstance(val, (torch.Tensor, tuple, list))
        and not (is_getitem(node) or is_bound_pad(node) or restores_size(node))
    )


def _ensure_pads_delegated(
    program: ExportedProgram, partitions: list[Partition], rejected: dict[torch.fx.Node, str]
) -> None:
    """``pad_to_bound`` has no CPU kernel: a program that leaves one on the CPU would not load."""
    delegated = {node for p in partitions for node in p.nodes}
    stranded = [n for n in program.graph.nodes if is_bound_pad(n) and n not in delegated]
    if stranded:
        raise EdgeTensorError(
            summary=f"{len(stranded)} dynamic output(s) could not be padded to their upper bound in OpenVINO",
            findings=tuple(
                Finding(rejected.get(n, "not delegated"), (NodeRef.from_node(n.args[0]),)) for n in stranded
            ),
            why="the pad that lets OpenVINO return a dynamic output has no CPU kernel",
            fix="export without this backend's dynamic-output padding:\n"
            "OpenvinoPartitioner(compile_spec, pad_dynamic_outputs=False)  (dynamic outputs then run on the CPU)",
        )


def _has_compute(partition: Partition) -> bool:
    # A partition of getitems alone would be an empty delegate.
    return any(node.op == "call_function" and not is_getitem(node) for node in partition.nodes)


def _float_dtypes(partitions: list[Partition]) -> set[torch.dtype]:
    vals = (node.meta.get("val") for p in partitions for node in p.nodes)
    return {v.dtype for v in vals if isinstance(v, torch.Tensor) and v.dtype.is_floating_point}
