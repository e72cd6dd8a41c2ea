"""``OpenvinoPartitioner``: choose what OpenVINO runs, and keep the edges safe.

Read ``partition`` top to bottom: each line is one defence, and each lives in
its own module. Refusals are ``Rejection`` records naming the rule that made
them, reported through ExecuTorch's ``WhyNoPartitionReporter`` and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import WhyNoPartitionReporter, tag_constant_data
from torch.export import ExportedProgram

from openvino_backend.compile_spec import HANDOVER_KEY, PARTITION_KEY, VERSION_KEY, CompileOptions
from openvino_backend.diagnostics import OpenvinoExportError, pass_failure
from openvino_backend.lowering.guard import share_backend_name
from openvino_backend.lowering.preprocess import OpenvinoBackend
from openvino_backend.ops import openvino_supported_ops, ops_to_keep_whole, overload
from openvino_backend.partition.conversion import keep_converted_passthroughs_out, offer_conversion
from openvino_backend.partition.cpu_kernels import ensure_cpu_runnable
from openvino_backend.partition.edge_rules import DEFAULT_RULES
from openvino_backend.partition.mutable_buffers import take_over_mutable_buffers
from openvino_backend.partition.numerical import NumericalCheck
from openvino_backend.partition.propose import Proposal, propose
from openvino_backend.partition.report import PartitionReport, report
from openvino_backend.partition.samples import sample_values
from openvino_backend.partition.state import ExportState
from openvino_backend.partition.support import OpenvinoOperatorSupport
from openvino_backend.partition.view import Rule
from openvino_backend.partition.whole_program import ensure_device, ensure_fusable, ensure_pads_delegated
from openvino_backend.program import warn_about_layout
from openvino_backend.runtime import (
    inference_precision,
    openvino_version,
    precision_name,
    unbindable,
    warn_if_int8_not_portable,
    warn_if_reduced,
)
from openvino_backend.timing import timed
from openvino_backend.transform.dynamic import pad_dynamic_outputs
from openvino_backend.transform.fold import fold_constant_subgraphs
from openvino_backend.transform.layout_copies import layout_keeping_aliases_as_clones
from openvino_backend.transform.split import splits_as_slices

logger = logging.getLogger(__name__)


class OpenvinoPartitioner(Partitioner):
    """Partitions an edge program for ``OpenvinoBackend``.

    Args:
        compile_spec: passed to the backend; ``device`` selects the OpenVINO
            device (default ``CPU``); ``inference_precision`` (``f32``,
            ``bf16``) is the precision the target CPU computes f32 partitions
            in (bf16 on CPUs with AMX or AVX512-BF16, f32 on others), which
            the numerical check compiles for and judges by; default: this
            machine's.
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
            (``transform/dynamic.py``). Off, every dynamic output stays on the CPU.
        fold_constants: compute subgraphs with no run-time input (index
            arithmetic, masks, position ids) once with PyTorch at export, up
            to a size (``transform/fold.py``); OpenVINO receives their values.
        check_numerics: run each proposed partition in OpenVINO and in
            PyTorch on the same values and keep out the node that makes them
            disagree (``partition/numerical.py``). Costs a compile per partition.
        sample_inputs: the program's inputs to run that check on (a tuple,
            as given to ``torch.export``); drawn from the inputs' shapes and
            dtypes when not given.
        take_over_mutable_buffers: a buffer the program updates (a KV cache)
            whose readers and update all sit in one partition lives in
            OpenVINO as state, instead of crossing the delegate's edge twice
            per call (``partition/mutable_buffers.py``).
        keep_whole: ops (``aten.linear.default``) kept whole, beyond those
            always kept, where OpenVINO takes every node of them: fewer nodes
            for every later trace of the graph. One that a later check keeps
            out of OpenVINO fails the export (``CpuKernelError``): ExecuTorch
            refuses a program that leaves it on the CPU whole.
    """

    def __init__(
        self,
        compile_spec: list[CompileSpec] | None = None,
        op_types_to_skip: Collection[str] | None = None,
        op_names_to_skip: Collection[str] | None = None,
        *,
        boundary_rules: Sequence[Rule] = DEFAULT_RULES,
        check_by_conversion: bool = True,
        pad_dynamic_outputs: bool = True,
        fold_constants: bool = True,
        check_numerics: bool = True,
        sample_inputs: Sequence[object] | None = None,
        take_over_mutable_buffers: bool = True,
        keep_whole: Collection[str] = (),
    ) -> None:
        share_backend_name(OpenvinoBackend, PARTITION_KEY)
        self.compile_spec = list(compile_spec or [])
        self.options = CompileOptions.from_specs(self.compile_spec)
        ensure_device(self.options.device)
        self.delegation_spec = DelegationSpec(OpenvinoBackend.__name__, self.compile_spec)
        self.op_types_to_skip = frozenset(op_types_to_skip or ())
        self.op_names_to_skip = frozenset(op_names_to_skip or ())
        self.boundary_rules = tuple(boundary_rules)
        self.check_by_conversion = check_by_conversion
        self.pad_dynamic_outputs = pad_dynamic_outputs
        self.fold_constants = fold_constants
        self.check_numerics = check_numerics
        self.sample_inputs = sample_inputs
        self.take_over_mutable_buffers = take_over_mutable_buffers
        unknown = sorted(name for name in keep_whole if name not in openvino_supported_ops())
        if unknown:
            names = ", ".join(unknown)
            raise ValueError(f"keep_whole: {names}: not ops OpenVINO converts (named as aten.linear.default)")
        self.keep_whole = tuple(sorted(keep_whole))
        self._export = ExportState()
        # What the last ``partition`` call decided.
        self.numerical_check: NumericalCheck | None = None
        self.reporter = WhyNoPartitionReporter()
        self.report = PartitionReport()

    @property
    def precision(self) -> str:
        """What the target computes f32 partitions in (``inference_precision`` compile spec, or else
        this machine's default): the numerical check compiles for it and judges by it."""
        return precision_name(inference_precision(self.options.device, self.options.precision))

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        # Kept whole only where OpenVINO takes every node of it; otherwise decomposed for the CPU's
        # kernels. Decided here, per op: given a per-node filter instead, ExecuTorch runs the whole
        # decomposition once more (a third of lowering time on a large model).
        support = OpenvinoOperatorSupport(self.op_types_to_skip, self.op_names_to_skip)
        ops = {*ops_to_keep_whole(), *(overload(name) for name in self.keep_whole)}
        names = {op: str(op).replace("::", ".") for op in sorted(ops, key=str)}
        kept = [
            op
            for op, name in names.items()
            if name in openvino_supported_ops()
            and name not in self.op_types_to_skip
            and all(support.rejection(n) is None for n in ep.graph.find_nodes(op="call_function", target=op))
        ]
        # ExecuTorch refuses a program that leaves one of these on the CPU: cpu_kernels says so first.
        self._export.kept_whole = frozenset(names[op] for op in kept)
        return kept, None

    @timed("pre_decomposition")
    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        """Aliases of tensors laid out otherwise as clones (``transform/layout_copies.py``),
        splits of tensors with dynamic dims as slices (``transform/split.py``), fold
        constant subgraphs (``transform/fold.py``) and route dynamic outputs through ``pad_to_bound``
        (``transform/dynamic.py``); a new program if any changes anything."""
        exported_program = layout_keeping_aliases_as_clones(exported_program)
        exported_program = splits_as_slices(exported_program)
        if self.fold_constants:
            exported_program = fold_constant_subgraphs(exported_program)
        if self.pad_dynamic_outputs:
            try:
                exported_program = pad_dynamic_outputs(exported_program, bindable=lambda v: unbindable(v) is None)
            except OpenvinoExportError:
                raise
            except Exception as error:
                raise pass_failure("padding dynamic outputs (pad_dynamic_outputs)", error) from error
        self._export.remember_weights(exported_program)
        return exported_program

    @timed("partition")
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        share_backend_name(OpenvinoBackend, PARTITION_KEY)
        warn_about_layout()
        self._export.restore_weights(exported_program)
        try:
            proposal = self.propose(exported_program)
        finally:
            if self.numerical_check is not None:
                self.numerical_check.finish()
        ensure_pads_delegated(exported_program, proposal.delegated, proposal.rejected)
        ensure_cpu_runnable(
            exported_program.graph_module, proposal.delegated, proposal.rejected, self._export.kept_whole
        )
        ensure_fusable(exported_program.graph_module, proposal.partitions)
        self.reporter, self.report = report(exported_program, proposal, self.precision)
        partition_tags = self._tag(exported_program, proposal)
        if self.take_over_mutable_buffers:
            self.report = replace(self.report, state_buffers=take_over_mutable_buffers(exported_program))
        warn_if_reduced(_float_dtypes(proposal), self.options.device, self.options.precision)
        warn_if_int8_not_portable(_weight_ranges(proposal), self.options.device)
        logger.info("OpenVINO takes %d nodes in %d partition(s)", self.report.delegated_nodes, len(proposal.partitions))
        if proposal.rejected:
            logger.info("Nodes not delegated to OpenVINO:\n%s", self.reporter.get_table_report())
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=partition_tags)

    def propose(self, program: ExportedProgram) -> Proposal:
        """Partitions that satisfy every rule: the edge rules, then converting each partition, then
        running it against PyTorch. Tags nothing: ``partition`` does that once they have settled."""
        stages: list[Sequence[Rule]] = [self.boundary_rules]
        if self.check_by_conversion:
            stages.append((keep_converted_passthroughs_out,))
        self.numerical_check = None
        if self.check_numerics and (values := sample_values(program, self.sample_inputs)) is not None:
            self.numerical_check = NumericalCheck(program, values, self.options.device, self.options.precision)
            stages.append((self.numerical_check,))
        return propose(
            program, stages, self.op_types_to_skip, self.op_names_to_skip, holds_state=self.take_over_mutable_buffers
        )

    def _tag(self, program: ExportedProgram, proposal: Proposal) -> dict[str, DelegationSpec]:
        """Tag each partition's nodes and constants; its compile specs carry its index and the handle
        of the conversion the checks made of it (preprocess need not convert, or compile, it again)."""
        partition_tags: dict[str, DelegationSpec] = {}
        for index, (partition, view) in enumerate(zip(proposal.partitions, proposal.views, strict=True)):
            tag = f"openvino_{index}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            spec = [
                *self.compile_spec,
                CompileSpec(PARTITION_KEY, str(index).encode()),
                CompileSpec(VERSION_KEY, openvino_version().encode()),
            ]
            if (handle := offer_conversion(view)) is not None:
                spec.append(CompileSpec(HANDOVER_KEY, handle.encode()))
            partition_tags[tag] = DelegationSpec(OpenvinoBackend.__name__, spec)
        tag_constant_data(program)
        return partition_tags


def _float_dtypes(proposal: Proposal) -> set[torch.dtype]:
    vals = (node.meta.get("val") for node in proposal.delegated)
    return {v.dtype for v in vals if isinstance(v, torch.Tensor) and v.dtype.is_floating_point}


def _weight_ranges(proposal: Proposal) -> list[tuple[int, int]]:
    """The integer range of each int8 weight dequantized inside a partition: a per-channel dequantize,
    or a per-tensor one over a narrow symmetric range (activations use the full -128..127)."""
    ranges = []
    for node in proposal.delegated:
        name = str(getattr(node.target, "__name__", node.target))
        if node.op != "call_function" or "dequantize_per_" not in name or node.args[-1] != torch.int8:
            continue
        low, high = node.args[-3], node.args[-2]
        if "per_channel" in name or low == -high:
            ranges.append((int(low), int(high)))
    return ranges
