"""Run each proposed partition in OpenVINO and in PyTorch, on the same values, before committing.

The copy rules and the conversion check know the ways a partition is known
to go wrong; this check assumes none of them. Every node of the program is
computed once in eager PyTorch on sample values (the user's, or draws shaped
by ``meta["val"]``); each proposed partition is then converted as preprocess
converts it, compiled for the target device in f32 (with the properties the
runtime will use where it computes in f32; forced to f32 where it computes in
a reduced precision, whose own run could not tell a wrong result hiding within
its rounding from a right one), and run the way the stock runtime runs it,
inputs bound before outputs pre-filled with values that cannot pass for a
result. Its outputs are compared with PyTorch's. A partition that reads more
weights than a few layers' worth (a large model's) is checked a stretch at a
time, at the memory a stretch costs, not a second whole model: each stretch
is fed PyTorch's values, and every value it hands on, to the next stretch or
out of the partition, is compared.

A disagreement beyond f32's rounding is confirmed at a relative error of
1e-3, past which it is a real error and not rounding; a confirmed one is
narrowed to the node whose addition makes a prefix of the partition wrong,
and that node stays on the CPU.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch.export import ExportedProgram

from openvino_backend.diagnostics import OpenvinoExportError
from openvino_backend.graph import is_getitem, op_name, user_input_nodes
from openvino_backend.lowering.edge_layout import DimOrder
from openvino_backend.lowering.partition_model import ConvertedPartition, compile_key, convert_partition
from openvino_backend.lowering.validate import find_passthroughs
from openvino_backend.ops import is_quantize
from openvino_backend.partition.conversion import converted
from openvino_backend.partition.quantized import compressed_matmuls, dynamic_judges, quantizes, step_judges
from openvino_backend.partition.samples import SampleValues
from openvino_backend.partition.view import PartitionView, Rejection
from openvino_backend.runtime import (
    Tolerance,
    as_bound,
    default_precision,
    effective_dtype,
    from_bound,
    inference_precision,
    int8_weight_bits,
    no_vnni_note,
    openvino_core,
    precision_name,
    run_like_runtime,
    supported_precisions,
)
from openvino_backend.timing import timed

logger = logging.getLogger(__name__)

# An f32 result further than this (relative to its magnitude) from PyTorch's is wrong, not rounded.
F32_ERROR = 1e-3
# A partition reading more weights than this is checked a stretch at a time (``NumericalCheck.stretches``).
STRETCH_BYTES = 256 << 20


@dataclass(frozen=True)
class Mismatch:
    """An output of a (sub)partition that OpenVINO computes differently from PyTorch."""

    node: torch.fx.Node
    detail: str


class NumericalCheck:
    """A partition rule: keep out the node that makes OpenVINO disagree with PyTorch."""

    def __init__(
        self, program: ExportedProgram, values: SampleValues, device: str = "CPU", precision: str | None = None
    ) -> None:
        self.program = program
        self.values = values
        self.device = device
        # The precision the target computes in (named in reasons); the check compiles with the runtime's
        # properties where that is f32, and forced to f32 where it is reduced: f32 judges either way.
        self.precision = precision_name(inference_precision(device, precision))
        self._computes_in = self.precision if self.precision in supported_precisions(device) else "f32"
        default = precision_name(default_precision(device))
        self._properties = {} if self._computes_in == default else {"INFERENCE_PRECISION_HINT": self._computes_in}
        users = set(user_input_nodes(program))
        self._constants = frozenset(n for n in program.graph.find_nodes(op="placeholder") if n not in users)
        self.narrowed: list[tuple[str, str]] = []  # (op, why) of each node the check kept out
        self.unchecked = 0  # partitions the check could not run

    def finish(self) -> None:
        """Drop the sample values once the partitions have settled. They hold every node's value,
        a model's transposed weights among them; the partitioner (and so this check, for what it
        kept out) outlives the export."""
        self.values = SampleValues()

    @timed("numerical_check")
    def __call__(self, part: PartitionView) -> Iterator[Rejection]:
        nodes = part.ordered()
        try:
            stretches = self.stretches(nodes)
            if len(stretches) <= 1:
                mismatch = self.run(nodes, lambda: converted(part))
            else:
                logger.info("numerical check: a partition of %d nodes, in %d stretches", len(nodes), len(stretches))
                mismatch = None
                edge = (frozenset(part.inputs()), frozenset(part.outputs()))
                for stretch in stretches:
                    if (mismatch := self.run(stretch, edge=edge)) is not None:
                        nodes = stretch  # narrowed within the stretch that disagrees
                        break
            if mismatch is None:
                return
            culprit, mismatch = self.narrow(nodes, mismatch)
        except Exception as error:  # a check that cannot run must not take the export down with it
            logger.warning("numerical check could not run a partition of %d nodes: %s", len(nodes), error)
            self.unchecked += 1
            return
        reason = (
            f"OpenVINO computes this {op_name(culprit)} differently from PyTorch: {mismatch.detail} "
            "(found by running the partition on sample values; please report the op)"
        )
        if int8_weight_bits(self.device) < 8 and quantizes(nodes):
            reason += f"; {no_vnni_note()}"
        self.narrowed.append((op_name(culprit), mismatch.detail))
        yield culprit, reason

    def stretches(self, nodes: list[torch.fx.Node]) -> list[list[torch.fx.Node]]:
        """``nodes`` in consecutive stretches, each reading at most ``STRETCH_BYTES`` of weights (or
        one unit that reads more): what the check converts, compiles and runs at a time. A model's
        partition is checked a few layers at a time, at the memory a few layers cost; each stretch
        is fed PyTorch's values and every value it passes on is compared. A stretch ends, in the
        second half of what fits, where the fewest values cross: between a model's layers, not
        inside an attention. What the weights alone give (a weight dequantized, transposed) never
        crosses: each stretch reading it computes it, as OpenVINO folds it (a tied embedding's
        table is the first stretch's and the last's)."""
        folded, within = self.values.from_weights, set(nodes)
        units = [  # a unit the weights alone compute and the partition alone reads goes with its readers
            unit
            for unit in _units(nodes)
            if not all(node in folded and all(user in within for user in node.users) for node in unit)
        ]
        reads = [_weights_read(unit, folded, within) for unit in units]
        crossing = _crossing(units)
        stretches: list[list[torch.fx.Node]] = []
        start = 0
        while start < len(units):
            seen: set[torch.fx.Node] = set()
            size, end = 0, start
            while end < len(units):
                added = sum(_nbytes(self.values.get(n)) for n in reads[end] - seen if n.op == "placeholder")
                if end > start and size + added > STRETCH_BYTES:
                    break
                seen |= reads[end]
                size += added
                end += 1
            if end < len(units):
                end = min(range(max(start + 1, (start + end + 1) // 2), end + 1), key=lambda k: (crossing[k], -k))
            stretch = {node for unit in units[start:end] for node in unit}
            stretch |= {n for k in range(start, end) for n in reads[k] if n in within}
            stretches.append([node for node in nodes if node in stretch])
            start = end
        return stretches

    def narrow(self, nodes: list[torch.fx.Node], mismatch: Mismatch) -> tuple[torch.fx.Node, Mismatch]:
        """The node whose addition to a prefix of ``nodes`` makes OpenVINO wrong (bisection)."""
        units = _units(nodes)
        good, bad = 0, len(units)  # prefix of `good` units agrees; of `bad` units disagrees
        while bad - good > 1:
            middle = (good + bad) // 2
            found = self.run([n for unit in units[:middle] for n in unit])
            if found is None:
                good = middle
            else:
                bad, mismatch = middle, found
        return units[bad - 1][0], mismatch

    def run(
        self,
        nodes: list[torch.fx.Node],
        convert: Callable[[], ConvertedPartition] | None = None,
        *,
        edge: tuple[frozenset[torch.fx.Node], frozenset[torch.fx.Node]] | None = None,
    ) -> Mismatch | None:
        """Run ``nodes`` as one partition in OpenVINO; the first output PyTorch disagrees with.

        ``edge``: the inputs and outputs of the partition ``nodes`` are a stretch of. An output
        of the stretch that OpenVINO feeds straight from an input is judged only where both are
        on that edge: elsewhere no runtime binds them (a copy at the start of a stretch). What
        the weights alone give is not an output of a stretch: the stretches reading it compute it."""
        try:
            partition = convert() if convert is not None else convert_partition(self.program, nodes)
        except OpenvinoExportError as error:
            logger.debug("numerical check: %d nodes do not convert (%s)", len(nodes), error.why)
            return None  # the conversion check and preprocess explain what does not convert
        if edge is not None:  # a stretch: only what some runtime would see of it is judged
            unseen = {i for i, node in enumerate(partition.outputs) if node in self.values.from_weights}
            unseen |= {
                p.output
                for p in find_passthroughs(partition.model)
                if not (partition.inputs[p.parameter] in edge[0] and partition.outputs[p.output] in edge[1])
            }
            if unseen:
                partition = _without_outputs(partition, sorted(unseen))
        inputs, outputs = partition.inputs, partition.outputs
        unbindable = [n.name for n in inputs if not _checkable(self.values.get(n))]
        unbindable += [n.name for n in outputs if not _checkable(self.values.get(n), scalar=False)]
        if unbindable:
            logger.debug("numerical check: %d nodes not run, no value to bind for %s", len(nodes), unbindable[:3])
            return None
        feeds = [as_bound(self.values[n], order) for n, order in zip(inputs, partition.input_orders, strict=True)]
        expected = [self.values[node] for node in outputs]
        orders = partition.output_orders
        if self._computes_in == "f32":
            found = self._compare(partition, feeds, expected, nodes, outputs, orders, self._properties, confirm=False)
            if found is None:
                return None
            logger.debug("%s: past f32's rounding (%s); wrong past F32_ERROR?", found.node.name, found.detail)
        # Rounding, or a wrong result? f32 at a relative error of F32_ERROR tells them apart. A reduced
        # precision's own run cannot: a wrong result can hide within the rounding it is allowed (0.1
        # after two bf16 layers), and one past it is still rounding if f32 agrees. There f32 decides.
        f32 = self._properties if self._computes_in == "f32" else {"INFERENCE_PRECISION_HINT": "f32"}
        return self._compare(partition, feeds, expected, nodes, outputs, orders, f32, confirm=True)

    def _compare(
        self,
        partition: ConvertedPartition,
        feeds: list[object],
        expected: list[torch.Tensor],
        nodes: Sequence[torch.fx.Node],
        outputs: Sequence[torch.fx.Node],
        orders: Sequence[DimOrder | None],
        properties: Mapping[str, str],
        *,
        confirm: bool,
    ) -> Mismatch | None:
        depths = _depths(nodes)
        try:
            key = compile_key(self.device, properties)
            compiled = partition.compiled.get(key)
            if compiled is None:
                compiled = openvino_core().compile_model(partition.model, self.device, dict(properties))
                partition.compiled[key] = compiled
            planned = [as_bound(want, order) for want, order in zip(expected, orders, strict=True)]
            bound, overwritten = run_like_runtime(compiled, feeds, planned)
            actual = [from_bound(b, o, w.shape) for b, o, w in zip(bound, orders, expected, strict=True)]
        except RuntimeError as error:
            logger.debug("numerical check could not run a partition: %s", error)
            return None
        if overwritten:
            return Mismatch(outputs[0], "running it overwrote one of its inputs")
        tolerances = [
            _tolerance(want, self.device, "f32", confirm=confirm, ops=2 * depths.get(node, 1))
            for node, want in zip(outputs, expected, strict=True)
        ]
        pairs = enumerate(zip(actual, expected, strict=True))
        failed = [i for i, (got, want) in pairs if not tolerances[i].check(got, want)]
        if not failed:
            return None
        # A quantized value a step from PyTorch's is rounding too: judged in steps (quantized.py), once
        # computed in f32 (a reduced precision's own rounding would blur a step). Only the outputs that
        # failed are judged: PyTorch reruns the partition for them, keeping nothing else.
        in_f32 = confirm or self._computes_in == "f32"
        judged = [outputs[i] for i in failed]
        judges: list = []
        if in_f32 and quantizes(nodes):
            judges = step_judges(nodes, judged, self.values, self._constants)
        elif in_f32 and (matmuls := compressed_matmuls(nodes, self._constants)):
            judges = dynamic_judges(nodes, judged, self.values, matmuls)
        for position, index in enumerate(failed):
            node, got, want, tolerance = outputs[index], actual[index], expected[index], tolerances[index]
            judge = judges[position] if judges else None
            if judge is None or got.shape != want.shape:
                return Mismatch(node, _describe(got, want, tolerance, self.precision, confirm))
            ok, how = judge.judge(got, want, tolerance.atol, tolerance.rtol)
            logger.debug("%s: %s (%s)", node.name, how, "agrees" if ok else "disagrees")
            if not ok:
                return Mismatch(node, f"{_describe(got, want, tolerance, self.precision, confirm)}, {how}")
        return None


def _checkable(value: object, *, scalar: bool = True) -> bool:
    """Values the check can bind through OpenVINO's Python API (numpy has no bf16); ints if ``scalar``."""
    if isinstance(value, (int, torch.SymInt)):
        return scalar
    return isinstance(value, torch.Tensor) and value.dtype not in (torch.bfloat16,) and not value.is_complex()


def _tolerance(want: torch.Tensor, device: str, precision: str, *, confirm: bool, ops: int) -> Tolerance:
    scale = float(want.abs().max()) if want.numel() and want.dtype.is_floating_point else 1.0
    scale = max(scale, 1.0) if math.isfinite(scale) else 1.0
    if confirm:  # in f32, where anything beyond F32_ERROR is wrong and not rounding
        return Tolerance(atol=F32_ERROR * scale, rtol=F32_ERROR) if want.dtype.is_floating_point else Tolerance(0, 0)
    return Tolerance.for_output(want.dtype, device, scale=scale, ops=max(ops, 4), target=precision)


def _describe(got: torch.Tensor, want: torch.Tensor, tolerance: Tolerance, precision: str, confirm: bool) -> str:
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} where PyTorch gives {tuple(want.shape)}"
    diff = (got.double() - want.double()).abs().nan_to_num(nan=math.inf)
    where = int(diff.flatten().argmax()) if diff.numel() else 0
    precision = "f32" if confirm else str(effective_dtype(want.dtype, target=precision)).removeprefix("torch.")
    return (
        f"max error {float(diff.max()):.3g} (element {where}: {got.flatten()[where].item()!r} where PyTorch gives "
        f"{want.flatten()[where].item()!r}), allowed {tolerance.atol:.3g} + {tolerance.rtol:.3g}*|value| in {precision}"
    )


def _nbytes(value: object) -> int:
    return value.nbytes if isinstance(value, torch.Tensor) else 0


def _without_outputs(partition: ConvertedPartition, indices: Sequence[int]) -> ConvertedPartition:
    """``partition`` without the Results at ``indices``; its model is changed in place (a stretch's,
    converted for this run alone)."""
    results = partition.model.get_results()
    for index in indices:
        partition.model.remove_result(results[index])
    kept = [i for i in range(len(partition.outputs)) if i not in set(indices)]
    return replace(
        partition,
        outputs=tuple(partition.outputs[i] for i in kept),
        output_orders=tuple(partition.output_orders[i] for i in kept),
    )


def _weights_read(
    unit: list[torch.fx.Node], folded: set[torch.fx.Node], within: set[torch.fx.Node]
) -> set[torch.fx.Node]:
    """What ``unit`` reads of the weights, with what computes it from them ``within`` the partition."""
    read: set[torch.fx.Node] = set()
    pending = [n for node in unit for n in node.all_input_nodes if n in folded]
    while pending:
        node = pending.pop()
        if node not in read:
            read.add(node)
            if node in within:
                pending += [n for n in node.all_input_nodes if n in folded]
    return read


def _crossing(units: list[list[torch.fx.Node]]) -> list[int]:
    """For each unit, how many values made by the units before it are read by it or after it:
    what a stretch ending before it would hand on."""
    made = {node: k for k, unit in enumerate(units) for node in unit}
    last = {}
    for k, unit in enumerate(units):
        for node in unit:
            for source in node.all_input_nodes:
                if source in made and made[source] < k:
                    last[source] = k
    starts, ends = [0] * (len(units) + 1), [0] * (len(units) + 1)
    for source, k in last.items():
        starts[made[source] + 1] += 1
        ends[k] += 1  # read by unit k: crosses every cut up to and before unit k
    crossing, live = [], 0
    for k in range(len(units) + 1):
        live += starts[k]
        crossing.append(live)
        live -= ends[k]
    return crossing


def _units(nodes: list[torch.fx.Node]) -> list[list[torch.fx.Node]]:
    """``nodes`` in order, each with what cannot be split from it: the getitems reading it, and
    a quantize's dequantizes (``boundary.keep_quantize_pairs_together``)."""
    units: list[list[torch.fx.Node]] = []
    owner: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in nodes:
        source = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        if source in owner and (is_getitem(node) or is_quantize(source)):
            owner[source].append(node)
            owner[node] = owner[source]
        else:
            units.append(owner.setdefault(node, [node]))
    return units


def _depths(nodes: Sequence[torch.fx.Node]) -> dict[torch.fx.Node, int]:
    """How many ops of ``nodes`` the longest path to each node goes through (roundings in sequence)."""
    depth: dict[torch.fx.Node, int] = {}
    for node in nodes:
        depth[node] = (0 if is_getitem(node) else 1) + max((depth.get(n, 0) for n in node.all_input_nodes), default=0)
    return depth
