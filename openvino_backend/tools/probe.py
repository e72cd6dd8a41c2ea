"""Does the installed OpenVINO still return stale memory? A plain-OpenVINO check.

No ExecuTorch involved: a model whose Result 0 is its Parameter and whose
Result 1 is ``sin`` of it, bound in ExecuTorch's order (input tensor first,
then output tensors pre-filled with a sentinel) and in the opposite order.
The day OpenVINO writes such outputs, the partitioner's workaround can be
reconsidered; the test suite watches for that day (a strict xfail).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import openvino as ov
import openvino.opset13 as opset

from openvino_backend.runtime import openvino_version

SENTINEL = 42.0


@dataclass(frozen=True)
class ProbeResult:
    openvino_version: str
    device: str
    stale_output: bool  # inputs first: output 0 kept the sentinel (or other stale data)
    input_overwritten: bool  # inputs first: the input buffer changed
    outputs_first_ok: bool  # outputs first: every output correct, input intact

    @property
    def bug_present(self) -> bool:
        return self.stale_output or self.input_overwritten

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "bug_present": self.bug_present}


def passthrough_model(shape: tuple[int, ...] = (2, 8)) -> ov.Model:
    x = opset.parameter(shape, np.float32, name="x")
    return ov.Model([x.output(0), opset.sin(x).output(0)], [x], "passthrough")


def _infer(compiled: ov.CompiledModel, x: np.ndarray, *, outputs_first: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    request = compiled.create_infer_request()
    given = x.copy()
    outputs = [np.full(x.shape, SENTINEL, dtype=np.float32) for _ in compiled.outputs]

    def bind_outputs() -> None:
        for index, buffer in enumerate(outputs):
            request.set_output_tensor(index, ov.Tensor(buffer, shared_memory=True))

    if outputs_first:
        bind_outputs()
    request.set_input_tensor(0, ov.Tensor(given, shared_memory=True))
    if not outputs_first:
        bind_outputs()
    request.infer()
    return given, outputs


def probe(device: str = "CPU") -> ProbeResult:
    """Run the reproduction on ``device``; nothing here raises for the bug itself."""
    compiled = ov.Core().compile_model(passthrough_model(), device)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    expected = [x, np.sin(x)]

    given, outputs = _infer(compiled, x, outputs_first=False)
    stale = not np.array_equal(outputs[0], x)
    overwritten = not np.array_equal(given, x)

    given_first, outputs_first = _infer(compiled, x, outputs_first=True)
    first_ok = np.array_equal(given_first, x) and all(
        np.allclose(out, want, rtol=1e-2, atol=1e-2) for out, want in zip(outputs_first, expected, strict=True)
    )
    return ProbeResult(openvino_version(), device, stale, overwritten, first_ok)
