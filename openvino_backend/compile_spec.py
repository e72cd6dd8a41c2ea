"""The compile spec, typed: what the partitioner and preprocess read from ExecuTorch's
``CompileSpec`` list, validated once, in one place.

The stock runtime reads only ``device``; the other keys are for this package
(the runtime ignores keys it does not know).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executorch.exir.backend.compile_spec_schema import CompileSpec

from openvino_backend.diagnostics import CompileSpecError
from openvino_backend.runtime import PRECISIONS

# Compile-spec key the partitioner adds so errors can name the partition. The
# runtime reads only "device" and ignores other keys.
PARTITION_KEY = "openvino_backend.partition"
# And the handle under which the partitioner's checks left their conversion of the partition.
HANDOVER_KEY = "openvino_backend.handover"
# And the OpenVINO version that compiled the partition: its blob imports into that version only.
VERSION_KEY = "openvino_backend.openvino_version"
DEVICE_KEY = "device"
# The precision the target CPU will compute f32 partitions in (f32, bf16, f16): what the report,
# `verify` and the warnings speak of (the numerical check judges in f32 whatever it is). Not a
# property of the blob: the runtime imports it with none.
PRECISION_KEY = "inference_precision"


@dataclass(frozen=True)
class CompileOptions:
    device: str = "CPU"
    partition: int | None = None
    handover: str | None = None
    precision: str | None = None  # None: this machine's default for the device
    properties: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_specs(cls, specs: list[CompileSpec]) -> CompileOptions:
        values = {spec.key: bytes(spec.value).decode().rstrip("\0") for spec in specs}
        partition = values.pop(PARTITION_KEY, None)
        values.pop(VERSION_KEY, None)  # for loaders: preprocess compiles with the OpenVINO it runs on
        precision = values.pop(PRECISION_KEY, None)
        if precision is not None and precision not in PRECISIONS:
            raise CompileSpecError(
                summary=f"unknown {PRECISION_KEY} {precision!r} in the compile spec",
                why=f"OpenVINO computes f32 models in one of: {', '.join(PRECISIONS)}",
                fix=f'CompileSpec("{PRECISION_KEY}", b"f32") for a CPU without AMX or AVX512-BF16,\n'
                f'CompileSpec("{PRECISION_KEY}", b"bf16") for one with',
            )
        return cls(
            device=values.pop(DEVICE_KEY, "CPU"),
            partition=int(partition) if partition is not None else None,
            handover=values.pop(HANDOVER_KEY, None),
            precision=precision,
            properties=values,
        )
