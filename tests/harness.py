"""The shared lowering test: real export, real runtime, real OpenVINO."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from executorch.exir import EdgeCompileConfig, ExecutorchProgramManager
from executorch.exir._serialize._program import deserialize_pte_binary
from executorch.exir.backend.compile_spec_schema import CompileSpec

from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.runtime import supported_precisions
from openvino_backend.tools.verify import check_run, declared_formats, delegate_ids, lower, resample

# ExecuTorch's edge config with dim order turned off: copies are aten.clone.
NO_DIM_ORDER = EdgeCompileConfig(_skip_dim_order=True)


def execute_layer_test(
    module: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    expected_partitions: int | None = 1,
    compile_config: EdgeCompileConfig | None = None,
    *,
    partitioner: OpenvinoPartitioner | None = None,
    terms: int = 1,
    draws: int = 2,
) -> ExecutorchProgramManager:
    """Lower ``module``, check its delegates, run it and compare with eager.

    Runs ``draws`` times on the same loaded program (the given inputs, then
    fresh values of the same kind) so an output that keeps an earlier run's
    memory cannot pass by luck. Every run must match eager within the
    tolerance of the device's real precision and leave its inputs untouched.
    """
    module = module.eval()
    program = lower(module, inputs, partitioner=partitioner, compile_config=compile_config)
    ids = delegate_ids(program)
    if expected_partitions is not None:
        assert len(ids) == expected_partitions, f"expected {expected_partitions} delegates, got {ids}"
    assert all(i == "OpenvinoBackend" for i in ids), ids

    generator = torch.Generator().manual_seed(1234)
    draw = list(inputs)
    for attempt in range(draws):
        report = check_run(module, program.buffer, draw, terms=terms, formats=declared_formats(program))
        assert report.error is None, report.error
        assert not report.modified_inputs, f"run {attempt} modified inputs {report.modified_inputs}"
        for out in report.outputs:
            assert out.values_ok, (
                f"run {attempt}, output {out.index} {out.shape}: max abs error {out.max_abs:.3g} "
                f"over tolerance {out.tolerance}"
            )
            assert out.layout_ok, f"run {attempt}, output {out.index}: memory format differs from eager"
        draw = resample(inputs, generator)
    return program


def non_delegated_ops(program: ExecutorchProgramManager) -> list[str]:
    """Names of the ops the program runs outside any delegate (memory planning aside)."""
    bookkeeping = ("executorch_call_delegate", "getitem", "alloc")
    names = [
        str(getattr(node.target, "__name__", node.target))
        for node in program.exported_program().graph.nodes
        if node.op == "call_function"
    ]
    return [name for name in names if not any(word in name for word in bookkeeping)]


# The inference precisions this machine's CPU can compute in (f32 everywhere, bf16 with AMX or
# AVX512-BF16): tests whose verdict depends on the precision run once per target precision.
TARGET_PRECISIONS = supported_precisions("CPU")


@functools.cache
def compiles_bare_attention(device: str = "CPU") -> bool:
    """Whether this OpenVINO compiles, with no properties (as the runtime does), an attention whose
    queries, keys and values are the model's inputs. OpenVINO 2025.3 and 2025.4 cannot on a CPU with
    AMX, where they compute f32 in bf16 ("BrgemmCopyB expression is not found"); 2025.2 and 2026.4 can."""
    import openvino as ov
    import openvino.opset13 as ops

    q, k, v = (ops.parameter([1, 2, 8, 16], ov.Type.f32) for _ in range(3))
    model = ov.Model([ops.scaled_dot_product_attention(q, k, v, causal=False)], [q, k, v])
    try:
        ov.Core().compile_model(model, device)
    except RuntimeError:
        return False
    return True


def partitioner_for(precision: str, **options: object) -> OpenvinoPartitioner:
    """A partitioner whose numerical check targets a CPU computing in ``precision``."""
    return OpenvinoPartitioner([CompileSpec("inference_precision", precision.encode())], **options)


def delegate_blobs(buffer: bytes) -> list[bytes]:
    """The delegate blobs a program holds inline (as this project writes it), in the program's order."""
    program = deserialize_pte_binary(buffer)
    return [bytes(data.data) for data in getattr(program, "program", program).backend_delegate_data]
