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
