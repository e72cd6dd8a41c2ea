"""Graphs the fuzzer found, kept as regression tests."""

from __future__ import annotations

import torch

from tests.harness import execute_layer_test


class ChannelsLastViewChain(torch.nn.Module):
    def forward(self, x):
        v = x.clone()
        return (v.unsqueeze(0).squeeze(0),)


def test_channels_last_input_through_copy_and_view_chain() -> None:
    # Found by the nightly fuzz run while layout changes were kept on the CPU:
    # ExecuTorch's portable unsqueeze_copy computes a channels-last input
    # wrongly (max error ~2). Adapted inside the ov.Model, the whole chain runs
    # in OpenVINO and matches eager.
    x = torch.randn(1, 3, 2, 1).to(memory_format=torch.channels_last)
    execute_layer_test(ChannelsLastViewChain(), (x,), expected_partitions=1)


class CumsumOfBools(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x > 0, 0), (x > 0).sum(0, keepdim=True)


def test_output_typed_differently_by_openvino_is_kept_out() -> None:
    # OpenVINO computes cumsum of bools as boolean (PyTorch: int64): unbound at
    # run time (error 0x1) and wrong past 127 if converted. The conversion
    # check keeps the cumsum on the CPU; 300 elements would overflow i8.
    execute_layer_test(CumsumOfBools(), (torch.rand(300) + 0.1,), expected_partitions=1)
