"""The properties the fuzzer checks, each on one generated graph.

``check_lowering``: lower with ``OpenvinoPartitioner`` and run on the stock
ExecuTorch runtime. Either export raises an ``OpenvinoExportError``, or every
output matches eager and no input is modified. Anything else is a failure.

``check_compute``: the same, on general compute graphs (``compute_graphs``),
with a tolerance that grows with the graph's length: OpenVINO computes f32 in
bf16 here, and no error within rounding is a finding.

``check_validator``: with the partitioner's edge rules off, convert every
partition and run it through OpenVINO's Python API in ExecuTorch's binding
order (inputs, then outputs pre-filled with a sentinel). Any partition whose
outputs come back stale (or whose inputs get overwritten) must be flagged by
the validator: no false negatives.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import numpy as np
import torch
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult

from fuzz.spec import GraphSpec
from openvino_backend.diagnostics import OpenvinoExportError
from openvino_backend.graph import dtype_of, output_nodes
from openvino_backend.lowering.convert import convert
from openvino_backend.lowering.preprocess import run_passes
from openvino_backend.lowering.validate import find_passthroughs, find_type_mismatches
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.runtime import Tolerance, openvino_core, run_like_runtime
from openvino_backend.tools.verify import check_run, declared_formats, lower_exported, resample

NO_DIM_ORDER = EdgeCompileConfig(_skip_dim_order=True)


@dataclass(frozen=True)
class Outcome:
    # lowering: "matched", "rejected" (OpenvinoExportError), "skipped" (ExecuTorch alone fails), "failed"
    # validator: "flagged", "clean", "refused" (OpenVINO cannot convert), "failed"
    kind: str
    error_class: str | None = None
    detail: str = ""
    # ops the numerical check kept on the CPU (lowering properties), with why
    narrowed: tuple[tuple[str, str], ...] = ()


def _config(spec: GraphSpec) -> EdgeCompileConfig | None:
    return None if spec.dim_order else NO_DIM_ORDER


def _export(spec: GraphSpec, module: torch.nn.Module, inputs) -> torch.export.ExportedProgram | Outcome:
    """The graph exported (with its dynamic dim, if any), or why torch would not keep the dim dynamic."""
    try:
        return torch.export.export(module, inputs, dynamic_shapes=spec.dynamic_shapes())
    except Exception as error:
        if spec.dynamic_size is None:
            raise
        # The ops pin the dim to one size (a broadcast against a static dim, say): torch's
        # constraint solver refuses the Dim, so the graph says nothing about dynamic shapes.
        return Outcome("skipped", "NotDynamic", f"{type(error).__name__}: {error}")


def check_compute(spec: GraphSpec) -> Outcome:
    return check_lowering(spec, ops=4 * max(1, len(spec.steps)))


def check_lowering(spec: GraphSpec, draws: int = 2, ops: int = 4) -> Outcome:
    module, inputs = spec.build()
    exported = _export(spec, module, inputs)
    if isinstance(exported, Outcome):
        return exported
    partitioner = OpenvinoPartitioner()
    try:
        program = lower_exported(exported, partitioner=partitioner, compile_config=_config(spec))
    except OpenvinoExportError as error:
        return Outcome("rejected", type(error).__name__, str(error))
    except Exception as error:
        if (limitation := executorch_alone_fails(spec, ops)) is not None:
            return Outcome("skipped", "ExecuTorchLimitation", limitation)
        return Outcome("failed", type(error).__name__, f"export raised:\n{traceback.format_exc(limit=-3)}{error}")
    generator = torch.Generator().manual_seed(spec.seed)
    formats = declared_formats(program)
    for attempt in range(draws):
        for shapes in spec.run_shapes():
            draw = (
                list(inputs) if attempt == 0 and shapes == spec.run_shapes()[0] else resample(inputs, generator, shapes)
            )
            report = check_run(module, program.buffer, draw, terms=spec.terms(), ops=ops, formats=formats)
            if not report.ok and (limitation := executorch_alone_fails(spec, ops)) is not None:
                return Outcome("skipped", "ExecuTorchLimitation", limitation)
            if not report.ok:
                problems = [report.error] if report.error else []
                problems += [f"input {i} was modified" for i in report.modified_inputs]
                problems += [
                    f"output {o.index} {o.shape}: max abs error {o.max_abs:.3g} (tolerance {o.tolerance})"
                    + ("" if o.layout_ok else ", memory format differs")
                    for o in report.outputs
                    if not o.ok
                ]
                return Outcome("failed", "Mismatch", f"run {attempt} at {shapes}: " + "; ".join(problems))
    check = partitioner.numerical_check
    return Outcome("matched", narrowed=tuple(check.narrowed) if check is not None else ())


def executorch_alone_fails(spec: GraphSpec, ops: int = 4) -> str | None:
    """Why ExecuTorch with no delegate at all cannot export, run or match ``spec``, or None.

    Such a graph says nothing about this backend (ExecuTorch's portable
    kernels reject ambiguous channels-last inputs with C = 1, and compute
    ``unsqueeze_copy`` of a channels-last tensor wrongly, for instance), so it
    is counted as skipped, under its own name, rather than failed.
    """
    module, inputs = spec.build()
    generator = torch.Generator().manual_seed(spec.seed)
    try:
        exported = torch.export.export(module, inputs, dynamic_shapes=spec.dynamic_shapes())
        program = to_edge_transform_and_lower(exported, compile_config=_config(spec)).to_executorch()
        reports = [
            check_run(module, program.buffer, resample(inputs, generator, shapes), terms=spec.terms(), ops=ops)
            for shapes in spec.run_shapes()
        ]
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    for report in reports:
        if report.error is not None:
            return report.error
        if not report.ok:
            return "ExecuTorch's portable kernels alone compute wrong values for this graph"
    return None


# --- the validator property -------------------------------------------------------------


@dataclass
class _PartitionProbe:
    flagged: bool
    stale: bool
    refused: str | None = None


_PROBES: list[_PartitionProbe] = []


class FuzzProbeBackend(BackendDetails):
    """Receives each partition in place of OpenvinoBackend and probes it; produces no blob."""

    @staticmethod
    def preprocess(edge_program, compile_specs) -> PreprocessResult:
        _PROBES.append(probe_partition(edge_program))
        return PreprocessResult(processed_bytes=b"")


class _ProbePartitioner(Partitioner):
    """OpenvinoPartitioner's partitions, without its edge rules or conversion check, sent to FuzzProbeBackend."""

    def __init__(self) -> None:
        self.inner = OpenvinoPartitioner(boundary_rules=(), check_by_conversion=False, check_numerics=False)
        self.delegation_spec = DelegationSpec(FuzzProbeBackend.__name__, [])

    def ops_to_not_decompose(self, ep):
        return self.inner.ops_to_not_decompose(ep)

    def partition(self, exported_program) -> PartitionResult:
        result = self.inner.partition(exported_program)
        result.partition_tags = {tag: self.delegation_spec for tag in result.partition_tags}
        return result


def _random_like(val: torch.Tensor, rng: np.random.Generator) -> np.ndarray:
    shape = tuple(d if isinstance(d, int) else d.node.hint for d in val.shape)  # a dynamic dim at its example size
    if val.dtype == torch.bool:
        return rng.random(shape) < 0.5
    if val.dtype.is_floating_point:
        return rng.standard_normal(shape).astype(str(val.dtype).removeprefix("torch."))
    return rng.integers(-5, 6, shape).astype(str(val.dtype).removeprefix("torch."))


def probe_partition(edge_program) -> _PartitionProbe:
    graph_module = run_passes(edge_program).module()
    try:
        model = convert(graph_module)
        compiled = openvino_core().compile_model(model, "CPU")
    except OpenvinoExportError as error:
        return _PartitionProbe(False, False, refused=type(error).__name__)
    flagged = bool(find_passthroughs(model) or find_passthroughs(compiled.get_runtime_model()))

    vals = [n.meta["val"] for n in graph_module.graph.find_nodes(op="placeholder")]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        # A size read from outside (i64[1] at run time): not what this probe binds; counted by name.
        return _PartitionProbe(flagged, False, refused="SizeInput")
    if find_type_mismatches(model, [dtype_of(node) for node in output_nodes(graph_module)]):
        # An output OpenVINO types differently (an int8 sum: i8, PyTorch int64) cannot be bound as
        # PyTorch's dtype; preprocess refuses it (OutputTypeError). Counted by name.
        return _PartitionProbe(flagged, False, refused="OutputType")
    rng = np.random.default_rng(0)
    arrays = [_random_like(v, rng) for v in vals]
    with torch.no_grad():
        expected = graph_module(*[torch.from_numpy(a.copy()) for a in arrays])
    expected = [e for e in (expected if isinstance(expected, (list, tuple)) else [expected])]

    outputs, stale = run_like_runtime(compiled, [torch.from_numpy(a) for a in arrays], expected)
    for got, want in zip(outputs, expected, strict=True):
        tolerance = Tolerance.for_output(want.dtype, terms=max(1, want.numel()), scale=max(1.0, _scale(want)))
        stale |= not tolerance.check(got, want.contiguous())
    return _PartitionProbe(flagged, stale)


def _scale(tensor: torch.Tensor) -> float:
    if not tensor.numel() or not tensor.dtype.is_floating_point:
        return 1.0
    return float(tensor.abs().max())


def check_validator(spec: GraphSpec) -> Outcome:
    module, inputs = spec.build()
    _PROBES.clear()
    exported = _export(spec, module, inputs)
    if isinstance(exported, Outcome):
        return exported
    try:
        to_edge_transform_and_lower(exported, partitioner=[_ProbePartitioner()], compile_config=_config(spec))
    except Exception as error:
        return Outcome("failed", type(error).__name__, f"probing raised:\n{traceback.format_exc(limit=-3)}")
    missed = [p for p in _PROBES if p.stale and not p.flagged]
    if missed:
        return Outcome("failed", "FalseNegative", f"{len(missed)} partition(s) returned stale outputs unflagged")
    if any(p.flagged for p in _PROBES):
        return Outcome("flagged")
    if any(p.refused for p in _PROBES):
        return Outcome("refused", next(p.refused for p in _PROBES if p.refused))
    return Outcome("clean")
