"""A device OpenVINO cannot find is refused when the partitioner is built, not at the first compile."""

from __future__ import annotations

import pytest
from executorch.exir.backend.compile_spec_schema import CompileSpec

from openvino_backend.diagnostics import DeviceError
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.runtime import openvino_core


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
