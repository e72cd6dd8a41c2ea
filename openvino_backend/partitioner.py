"""``OpenvinoPartitioner``: choose what OpenVINO runs, and keep the edges safe.

Nodes go to OpenVINO when OpenVINO converts their op (``support.py``). The
partitions proposed from that are then checked by the partition-edge rules
(``boundary.py``); a node a rule objects to is refused and partitions are
proposed again, until no rule objects. Every refusal is recorded in a
``WhyNoPartitionReporter`` and logged.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import WhyNoPartitionReporter, tag_constant_data
from executorch.exir.lowered_backend_module import create_submodule_from_nodes
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition

from openvino_backend.boundary import DEFAULT_RULES, BoundaryRule, PartitionView, is_getitem, unbindable
from openvino_backend.compile_spec import HANDOVER_KEY, PARTITION_KEY, CompileOptions
from openvino_backend.conversion_check import hand_over, keep_converted_passthroughs_out
from openvino_backend.cpu_kernels import ensure_cpu_runnable
from openvino_backend.diagnostics import (
    DeviceError,
    EdgeTensorError,
    Finding,
    FusionOrderError,
    NodeRef,
    OpenvinoExportError,
    op_name,
    pass_failure,
)
from openvino_backend.dynamic import is_bound_pad, pad_dynamic_outputs, restores_size
from openvino_backend.fold import fold_constant_subgraphs
from openvino_backend.guard import share_backend_name
from openvino_backend.numerics import NumericalCheck, sample_values
from openvino_backend.precision import (
    inference_precision,
    missing_devices,
    openvino_core,
    openvino_version,
    precision_name,
    warn_if_reduced,
)
from openvino_backend.preprocess import OpenvinoBackend
from openvino_backend.support import OPS_TO_NOT_DECOMPOSE, OpenvinoOperatorSupport, openvino_supported_ops
from openvino_backend.timing import timed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionReport:
    """What the last ``partition`` call decided, for tools and users."""

    partitions: int = 0
    delegated_nodes: int = 0
    kept_out: tuple[tuple[NodeRef, str], ...] = ()
    # Ops computing tensors in the program (getitems and size arithmetic aside).
    total_nodes: int = 0
    # The precision f32 partitions were checked in: the target's (compile spec), or this machine's.
    precision: str = "f32"

    @property
    def delegated_share(self) -> float:
        return self.delegated_nodes / self.total_nodes if self.total_nodes else 0.0


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
        share_backend_name(OpenvinoBackend, PARTITION_KEY)
        self.compile_spec = list(compile_spec or [])
        _ensure_device(CompileOptions.from_specs(self.compile_spec).device)
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
        self._views: list[PartitionView] | None = None  # the last proposal's, one per partition
        self._kept_whole: frozenset[str] = frozenset()
        # Each program's real state dict, in the order ExecuTorch transforms (and then partitions) them.
        self._real_states: list[dict[str, torch.Tensor]] = []
        self.reporter = WhyNoPartitionReporter()
        self.report = PartitionReport()

    @property
    def precision(self) -> str:
        """What the target computes f32 partitions in (``inference_precision`` compile spec, or else
        this machine's default): the numerical check compiles for it and judges by it."""
        options = CompileOptions.from_specs(self.compile_spec)
        return precision_name(inference_precision(options.device, options.precision))

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        # Kept whole only where OpenVINO takes every node of it; otherwise decomposed for the CPU's
        # kernels. Decided here, per op: given a per-node filter instead, ExecuTorch runs the whole
        # decomposition once more (a third of lowering time on a large model).
        support = OpenvinoOperatorSupport(self._op_types_to_skip, self._op_names_to_skip)
        names = {op: str(op).replace("::", ".") for op in OPS_TO_NOT_DECOMPOSE}
        kept = [
            op
            for op, name in names.items()
            if name in openvino_supported_ops()
            and name not in self._op_types_to_skip
            and all(support.rejection(n) is None for n in ep.graph.find_nodes(op="call_function", target=op))
        ]
        # ExecuTorch refuses a program that leaves one of these on the CPU: cpu_kernels says so first.
        self._kept_whole = frozenset(names[op] for op in kept)
        return kept, None

    @timed("pre_decomposition")
    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        """Fold constant subgraphs (``fold.py``) and route dynamic outputs through ``pad_to_bound``
        (``dynamic.py``); a new program if either changes anything."""
        if self._fold_constants:
            exported_program = fold_constant_subgraphs(exported_program)
        if self._pad_dynamic_outputs:
            try:
                exported_program = pad_dynamic_outputs(exported_program, bindable=lambda v: unbindable(v) is None)
            except OpenvinoExportError:
                raise
            except Exception as error:
                raise pass_failure("padding dynamic outputs (pad_dynamic_outputs)", error) from error
        # ExecuTorch hands ``partition`` a copy whose state dict holds fake tensors; the checks
        # that convert and run partitions need the real weights.
        self._real_states.append(dict(exported_program.state_dict))
        return exported_program

    @timed("partition")
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        share_backend_name(OpenvinoBackend, PARTITION_KEY)
        _restore_real_state(exported_program, _take_state(self._real_states, exported_program))
        partitions, rejected = self.propose(exported_program)
        views, self._views = self._views, None
        _ensure_pads_delegated(exported_program, partitions, rejected)
        delegated = {node for p in partitions for node in p.nodes}
        ensure_cpu_runnable(exported_program.graph_module, delegated, rejected, self._kept_whole)
        _ensure_fusable(exported_program.graph_module, partitions)
        self.reporter = WhyNoPartitionReporter()
        for node, reason in rejected.items():
            self.reporter.report_reject(node, reason)
        self.report = PartitionReport(
            partitions=len(partitions),
            delegated_nodes=sum(1 for p in partitions for n in p.nodes if _computes(n)),
            kept_out=tuple((NodeRef.from_node(node), reason) for node, reason in rejected.items() if _computes(node)),
            total_nodes=sum(1 for n in exported_program.graph.nodes if _computes(n)),
            precision=self.precision,
        )

        partition_tags: dict[str, DelegationSpec] = {}
        for index, partition in enumerate(partitions):
            tag = f"openvino_{index}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            spec = [*self.compile_spec, CompileSpec(PARTITION_KEY, str(index).encode())]
            handle = hand_over(views[index]) if views is not None else None
            if handle is not None:  # preprocess need not convert (or compile) this partition again
                spec.append(CompileSpec(HANDOVER_KEY, handle.encode()))
            partition_tags[tag] = DelegationSpec(OpenvinoBackend.__name__, spec)
        tag_constant_data(exported_program)

        options = CompileOptions.from_specs(self.compile_spec)
        warn_if_reduced(_float_dtypes(partitions), options.device, options.precision)
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
            options = CompileOptions.from_specs(self.compile_spec)
            self.numerical_check = NumericalCheck(program, values, options.device, options.precision)
            stages.append((self.numerical_check,))
        excluded = _feeding_only_checks(program.graph)
        refused: dict[torch.fx.Node, str] = {}  # by the op-support check, over all rounds
        kept: list[tuple[Partition, PartitionView]] = []  # partitions no rule touched last round
        candidates: frozenset[torch.fx.Node] | None = None  # what this round may partition (None: all)
        while True:
            support = OpenvinoOperatorSupport(self._op_types_to_skip, self._op_names_to_skip, excluded, candidates)
            # torch's proposal is quadratic on long chains: after the first round it runs again only
            # over the partitions a rule cut, the others are kept as they are.
            fresh = CapabilityBasedPartitioner(
                program.graph_module, support, allows_single_node_partition=True
            ).propose_partitions()
            refused.update(support.rejected)
            # One view per partition: the checks that convert share the conversion, across rounds too.
            proposal = kept + [(p, PartitionView(frozenset(p.nodes), program)) for p in fresh if _has_compute(p)]
            views = [view for _, view in proposal]
            # The cheap FX rules first; conversion, then running, only once they are satisfied.
            rejected: dict[torch.fx.Node, str] = {}
            for rules in stages:
                rejected = _apply(rules, views, excluded)
                if rejected:
                    break
            if not rejected:
                self._views = views  # their conversions go to preprocess with the partition tags
                return [partition for partition, _ in proposal], refused
            for node, reason in rejected.items():
                logger.info("keeping %s (%s) out of OpenVINO: %s", node.name, op_name(node), reason)
            excluded.update(rejected)
            cut = {v for _, v in proposal if not rejected.keys().isdisjoint(v.nodes)}
            kept = [(p, v) for p, v in proposal if v not in cut]
            candidates = frozenset(node for view in cut for node in view.nodes)


def _apply(
    rules: Sequence[BoundaryRule], views: list[PartitionView], excluded: dict[torch.fx.Node, str]
) -> dict[torch.fx.Node, str]:
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


def _ensure_fusable(graph_module: torch.fx.GraphModule, partitions: list[Partition]) -> None:
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


def _ensure_device(device: str) -> None:
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


def _take_state(states: list[dict[str, torch.Tensor]], program: ExportedProgram) -> dict[str, torch.Tensor]:
    """The first state (in transform order) whose tensors fit ``program``'s fake ones; removed.

    ExecuTorch transforms every method, then partitions them in the same order; methods can share
    parameter names (two models of one architecture), so names alone do not tell their weights apart.
    """
    fakes = {k: v for k, v in program.state_dict.items() if isinstance(v, FakeTensor)}
    for index, state in enumerate(states):
        # (Constants ExecuTorch lifts during to_edge are in no state dict; _restore_real_state
        # reads them from their fakes.)
        if all(state[k].shape == v.shape and state[k].dtype == v.dtype for k, v in fakes.items() if k in state):
            return states.pop(index)
    return {}


def _restore_real_state(program: ExportedProgram, real: dict[str, torch.Tensor]) -> None:
    """Put real tensors back in the state dict of the fake copy ExecuTorch partitions.

    Nothing here writes to them; ExecuTorch restores the real program after
    partitioning anyway. Fake values left (a program not seen by
    ``transform_for_pre_decomposition``) make the numerical check stand aside.
    """
    placeholders = program.graph.find_nodes(op="placeholder")
    for node, spec in zip(placeholders, program.graph_signature.input_specs, strict=True):
        value = program.state_dict.get(spec.target) if spec.target is not None else None
        if not isinstance(value, FakeTensor):
            continue
        # Constants ExecuTorch lifts during to_edge (a scalar operand) keep their value on the fake.
        restored = real.get(spec.target, getattr(node.meta.get("val"), "constant", None))
        if restored is not None:
            program.state_dict[spec.target] = restored


def _feeding_only_checks(graph: torch.fx.Graph) -> dict[torch.fx.Node, str]:
    """Nodes whose results reach no output, only run-time checks (``_assert_async`` and the like).

    Delegated, they would leave a partition whose only reader is a node with
    no users, which ExecuTorch's partition fusing can move past the output
    node (an invalid program: "last node must be output").
    """
    reaches_output: set[torch.fx.Node] = set()
    for node in reversed(graph.nodes):
        if node.op == "output" or any(user in reaches_output for user in node.users):
            reaches_output.add(node)
    return {
        node: "its result only feeds a run-time check, which ExecuTorch runs on the CPU"
        for node in graph.nodes
        if node.op == "call_function" and node not in reaches_output
    }


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
