"""Models with dynamic dims, shared by the dynamic-shape tests and the bench."""

from __future__ import annotations

import torch


class ConvBlock(torch.nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(c_in, c_out, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class SmallCNN(torch.nn.Module):
    """Conv / batch norm / relu blocks, a spatial mean and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(ConvBlock(3, 8), ConvBlock(8, 16))
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x).mean(dim=(2, 3)))
