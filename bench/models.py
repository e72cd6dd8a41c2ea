"""Benchmark models, built in code with seeded random weights (no downloads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from openvino_backend.examples import RobotPolicy, _Block
from tests.dynamic_models import Decoder


class ResidualCNN(nn.Module):
    """A small ResNet: conv/bn/relu stages with identity and projection shortcuts."""

    def __init__(self, width: int = 32, blocks: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.stages = nn.ModuleList(_ResBlock(width, stride=1 if i == 0 else 2) for i in range(blocks))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.head(x.mean(dim=(2, 3)))


class _ResBlock(nn.Module):
    """A basic residual block: ``width`` channels in, ``out`` (default ``width``) out."""

    def __init__(self, width: int, stride: int, out: int | None = None) -> None:
        super().__init__()
        cin, cout = width, out or width
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.shortcut = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18's shape (torchvision's layout: 4 stages of 2 basic blocks, 64 to 512 channels), built here."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [_ResBlock(cin, stride, cout), _ResBlock(cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class TransformerEncoder(nn.Module):
    def __init__(self, width: int = 128, depth: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class CopiesLeaving(nn.Module):
    """Several copies leave their partitions: of inputs, of outputs, in chains."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        h = torch.tanh(self.proj(x))
        z = self.proj(h + y)
        return x.clone(), y.detach(), h, h.clone(), z, z.clone().clone(), x[:, :].sin()


@dataclass(frozen=True)
class BenchModel:
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], tuple[torch.Tensor, ...]]


def _seeded(factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return factory().eval()

    return build


MODELS: dict[str, BenchModel] = {
    m.name: m
    for m in (
        BenchModel("resnet-cnn", _seeded(ResidualCNN), lambda g: (torch.randn(1, 3, 64, 64, generator=g),)),
        BenchModel("transformer", _seeded(TransformerEncoder), lambda g: (torch.randn(1, 32, 128, generator=g),)),
        BenchModel(
            "robot-policy",
            _seeded(RobotPolicy),
            lambda g: (torch.randn(2, 8, 24, generator=g), torch.randn(2, 6, generator=g)),
        ),
        BenchModel(  # Llama-shaped (hidden 128, 4 heads, 16 layers): the lowering-cost row
            "decoder-16",
            _seeded(lambda: Decoder(vocab=1000, width=128, heads=4, layers=16)),
            lambda g: (torch.randint(0, 1000, (1, 32), generator=g),),
        ),
        BenchModel(
            "copies",
            _seeded(CopiesLeaving),
            lambda g: (torch.randn(16, 64, generator=g), torch.randn(16, 64, generator=g)),
        ),
    )
}


def inputs_for(name: str) -> tuple[torch.Tensor, ...]:
    return MODELS[name].inputs(torch.Generator().manual_seed(0))
