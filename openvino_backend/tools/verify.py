"""Lower a model, run it on the stock ExecuTorch runtime, compare with eager.

This is the loop the CLI, the tests, the fuzzer and the benchmarks share: the
real ``to_edge_transform_and_lower`` -> ``.pte`` -> ``executorch.runtime``
path, never a mock of it.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import torch
from executorch.exir import EdgeCompileConfig, ExecutorchProgramManager, to_edge_transform_and_lower
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import Partitioner
from executorch.runtime import Runtime

from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.program import check_program, check_program_file, to_executorch, writing_inline
from openvino_backend.runtime import Tolerance, torch_workers_idle


def lower(
    module: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    *,
    partitioner: OpenvinoPartitioner | None = None,
    compile_config: EdgeCompileConfig | None = None,
    device: str = "CPU",
    dynamic_shapes: Sequence[dict] | None = None,
) -> ExecutorchProgramManager:
    """``torch.export`` + lower with ``OpenvinoPartitioner`` + ``to_executorch``."""
    partitioner = partitioner or OpenvinoPartitioner([CompileSpec("device", device.encode())])
    exported = torch.export.export(module.eval(), tuple(inputs), dynamic_shapes=dynamic_shapes)
    return lower_exported(exported, partitioner=partitioner, compile_config=compile_config)


def lower_exported(
    exported: torch.export.ExportedProgram,
    *,
    partitioner: Partitioner,
    compile_config: EdgeCompileConfig | None = None,
) -> ExecutorchProgramManager:
    with writing_inline():
        edge = to_edge_transform_and_lower(exported, partitioner=[partitioner], compile_config=compile_config)
    return to_executorch(edge)


@lru_cache(maxsize=1)
def runtime() -> Runtime:
    return Runtime.get()


class LoadedMethod:
    """A method of a serialized program, loaded once on the ExecuTorch runtime and run as often as
    needed: what it keeps between calls (a KV cache in OpenVINO state) lives as long as this object.

    The program is loaded from a file, memory-mapped, as deployments load it (ExecuTorch's
    ``Module``, its LLM runners): bytes are written to a temporary file first. A program whose
    OpenVINO blobs the runtime would free under OpenVINO is refused (``ProgramLayoutError``).
    """

    def __init__(self, program: bytes | Path, method: str = "forward") -> None:
        if isinstance(program, bytes):
            self._program = _load_from_file(program)
        else:
            check_program_file(Path(program))
            self._program = runtime().load_program(Path(program))  # must outlive its method
        self._method = self._program.load_method(method)
        if self._method is None:
            raise ValueError(f"the program has no method {method!r}")

    def __call__(self, inputs: Sequence[object]) -> list[torch.Tensor]:
        with torch_workers_idle():  # the runtime copies the outputs with PyTorch
            return list(self._method.execute(list(inputs)))

    def constant(self, name: str) -> object | None:
        """What the program's constant method ``name`` returns (None if it has none)."""
        if name not in self._program.method_names:
            return None
        values = self._program.load_method(name).execute([])
        return values[0] if len(values) == 1 else list(values)


def _load_from_file(buffer: bytes) -> object:
    check_program(buffer)
    with tempfile.TemporaryDirectory(prefix="openvino-backend-") as directory:
        path = Path(directory) / "program.pte"
        path.write_bytes(buffer)
        # The runtime maps the file; the mapping outlives the name.
        return runtime().load_program(path)


def run_program(buffer: bytes, inputs: Sequence[torch.Tensor], method: str = "forward") -> list[torch.Tensor]:
    """Execute ``method`` of a serialized program on the ExecuTorch runtime, freshly loaded."""
    return LoadedMethod(buffer, method)(inputs)


def delegate_ids(program: ExecutorchProgramManager) -> list[str]:
    """Backend id of every delegate in the program's first execution plan."""
    return [d.id for d in program.executorch_program.execution_plan[0].delegates]


@dataclass(frozen=True)
class OutputCheck:
    """One output of one run, against eager."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    max_abs: float
    max_rel: float
    tolerance: Tolerance
    values_ok: bool
    layout_ok: bool
    # Against the float model, when the program is a quantized one (``check_run(float_module=)``).
    float_error: float | None = None

    @property
    def ok(self) -> bool:
        return self.values_ok and self.layout_ok


@dataclass
class RunCheck:
    """All outputs of one run, and whether the run modified its inputs."""

    outputs: list[OutputCheck] = field(default_factory=list)
    modified_inputs: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.modified_inputs and all(o.ok for o in self.outputs)


def flatten_outputs(value: object) -> list[torch.Tensor]:
    leaves, _ = torch.utils._pytree.tree_flatten(value)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def check_run(
    module: torch.nn.Module,
    buffer: bytes,
    inputs: Sequence[torch.Tensor],
    *,
    device: str = "CPU",
    terms: int = 1,
    ops: int = 4,
    formats: Sequence[torch.memory_format | None] | None = None,
    float_module: torch.nn.Module | None = None,
) -> RunCheck:
    """Run the program and eager on the same inputs and compare every output.

    Each output gets ``Tolerance.for_output`` for its dtype on ``device`` with
    ``terms`` (the longest reduction feeding it) and the output's magnitude as
    scale, for ``ops`` roundings in sequence. ``formats`` (from ``declared_formats``) are the memory formats the
    program promises for its outputs; eager's own strides are no guide, since
    an eager view (a permute, say) can look like any format.

    With ``float_module`` (``module`` being its quantized version), each
    output may also differ from ``module``'s by twice the quantization noise
    (how far ``module``'s output is from ``float_module``'s): INT8 kernels
    round differently from the quantized model's float arithmetic. The error
    against the float model is reported beside it.
    """
    originals = [x.clone() for x in inputs]
    with torch.no_grad():
        expected = flatten_outputs(module(*[x.clone() for x in inputs]))
        floats = flatten_outputs(float_module(*[x.clone() for x in inputs])) if float_module is not None else None
    given = [x.clone() for x in inputs]
    try:
        actual = run_program(buffer, given)
    except RuntimeError as error:
        return RunCheck(error=str(error))
    report = RunCheck(
        modified_inputs=[i for i, (a, b) in enumerate(zip(given, originals, strict=True)) if not _same(a, b)]
    )
    if len(actual) != len(expected):
        report.error = f"the program returned {len(actual)} outputs, eager {len(expected)}"
        return report
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        declared = formats[index] if formats is not None else None
        output = compare_output(index, got, want, device=device, terms=terms, ops=ops, declared=declared)
        if floats is not None and index < len(floats):
            output = _against_float(output, got, want, floats[index])
        report.outputs.append(output)
    return report


def compare_output(
    index: int,
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    device: str = "CPU",
    terms: int = 1,
    ops: int = 4,
    declared: torch.memory_format | None = None,
) -> OutputCheck:
    scale = float(expected.detach().abs().max()) if expected.numel() and expected.dtype.is_floating_point else 1.0
    tolerance = Tolerance.for_output(expected.dtype, device, terms=terms, scale=max(scale, 1.0), ops=ops)
    max_abs, max_rel = _errors(actual, expected)
    return OutputCheck(
        index=index,
        shape=tuple(expected.shape),
        dtype=expected.dtype,
        max_abs=max_abs,
        max_rel=max_rel,
        tolerance=tolerance,
        values_ok=tolerance.check(actual, expected),
        layout_ok=declared in (None, memory_format(actual)),
    )


def _against_float(
    output: OutputCheck, actual: torch.Tensor, expected: torch.Tensor, float_: torch.Tensor
) -> OutputCheck:
    if not expected.dtype.is_floating_point or actual.shape != float_.shape:
        return output
    noise = _errors(expected, float_)[0]
    tolerance = Tolerance(max(output.tolerance.atol, 2 * noise), output.tolerance.rtol)
    return replace(
        output, tolerance=tolerance, values_ok=tolerance.check(actual, expected), float_error=_errors(actual, float_)[0]
    )


def declared_formats(program: ExecutorchProgramManager) -> list[torch.memory_format | None]:
    """The memory format the program declares for each output (from ``meta["val"]``)."""
    outputs = program.exported_program().graph.output_node().args[0]
    vals = [node.meta.get("val") if isinstance(node, torch.fx.Node) else None for node in outputs]
    return [memory_format(v) if isinstance(v, torch.Tensor) else None for v in vals]


def memory_format(tensor: torch.Tensor) -> torch.memory_format | None:
    """The memory format a tensor is laid out in, or None for other strides (views)."""
    if tensor.is_contiguous():
        return torch.contiguous_format
    for fmt, rank in ((torch.channels_last, 4), (torch.channels_last_3d, 5)):
        if tensor.dim() == rank and tensor.is_contiguous(memory_format=fmt):
            return fmt
    return None


def _errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    if actual.shape != expected.shape or actual.numel() == 0:
        return (math.inf, math.inf) if actual.shape != expected.shape else (0.0, 0.0)
    a, e = actual.double(), expected.double()
    both_nan = a.isnan() & e.isnan()
    diff = (a - e).abs().masked_fill(both_nan, 0.0).nan_to_num(nan=math.inf)
    rel = diff / e.abs().clamp_min(torch.finfo(torch.float32).tiny)
    return float(diff.max()), float(rel.max())


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b) or (a.isnan() & b.isnan() | (a == b)).all())


def resample(
    inputs: Sequence[torch.Tensor], generator: torch.Generator, shapes: Sequence[Sequence[int]] | None = None
) -> list[torch.Tensor]:
    """New values for each input: same dtype, memory format and value range; same shape unless ``shapes``."""
    fresh = []
    for index, x in enumerate(inputs):
        shape = tuple(shapes[index]) if shapes is not None else x.shape
        if x.dtype == torch.bool:
            y = torch.rand(shape, generator=generator) < 0.5
        elif x.dtype.is_floating_point:
            y = torch.randn(shape, generator=generator).to(x.dtype)
        else:
            low, high = (int(x.min()), int(x.max()) + 1) if x.numel() else (0, 1)
            y = torch.randint(low, high, shape, generator=generator, dtype=x.dtype)
        fresh.append(y.contiguous(memory_format=memory_format(x) or torch.contiguous_format))
    return fresh
