"""A device OpenVINO cannot find is refused when the partitioner is built, not at the first compile."""

from __future__ import annotations

import os

import openvino as ov
import pytest
from executorch.exir.backend.compile_spec_schema import CompileSpec

from openvino_backend.diagnostics import DeviceError
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.runtime import has_vnni, openvino_core


def test_an_absent_device_is_refused_naming_the_available_ones() -> None:
    available = openvino_core().available_devices
    absent = next(d for d in ("GPU", "NPU", "FPGA") if d not in available)
    with pytest.raises(DeviceError) as caught:
        OpenvinoPartitioner([CompileSpec("device", absent.encode())])
    text = str(caught.value)
    assert f"no {absent} device" in text and f"available devices: {', '.join(available)}" in text
    assert f'CompileSpec("device", b"{available[0]}")' in text


@pytest.mark.parametrize("device", ["CPU", "AUTO", "MULTI:CPU"])
def test_devices_that_exist_are_accepted(device) -> None:
    OpenvinoPartitioner([CompileSpec("device", device.encode())])


def test_a_virtual_device_over_an_absent_one_is_refused() -> None:
    absent = next(d for d in ("GPU", "NPU", "FPGA") if d not in openvino_core().available_devices)
    with pytest.raises(DeviceError, match=f"no {absent} device"):
        OpenvinoPartitioner([CompileSpec("device", f"HETERO:{absent},CPU".encode())])


@pytest.mark.isa
@pytest.mark.skipif("AVX2_EMULATOR" not in os.environ, reason="only under .ci/avx2, which sets AVX2_EMULATOR")
def test_under_the_avx2_emulator_the_cpu_is_avx2_only() -> None:
    # CI runs the isa tests in emulated workers: were a worker native, they would check this CPU twice.
    assert not has_vnni(), "this process runs on a CPU with VNNI: not under the AVX2 emulator"
    assert openvino_core().get_property("CPU", "INFERENCE_PRECISION_HINT") == ov.Type.f32
