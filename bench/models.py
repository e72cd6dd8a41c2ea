"""The models the bench runs, by name, with their inputs (the architectures live in ``zoo``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from openvino_backend.tools.examples import RobotPolicy
from zoo import CopiesLeaving, Decoder, ResidualCNN, TransformerEncoder


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
