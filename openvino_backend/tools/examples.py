"""Built-in example models: the bug's minimal form and the model it broke."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


class CopyOfInput(nn.Module):
    """The seed's model: a copy of the input leaves the partition and feeds it."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.clone()
        return y, torch.sin(y)


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, tokens, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, tokens, width))
        return x + self.mlp(self.norm2(x))


class RobotPolicy(nn.Module):
    """Shaped like a LeRobot action-chunking policy.

    Observation encoder, a small transformer over the observation history and
    an action head; it also returns a copy of its normalized observation (and
    of the raw state) beside the actions, the pattern that made a real policy
    return stale memory when lowered to OpenVINO.
    """

    def __init__(self, obs_dim: int = 24, state_dim: int = 6, width: int = 64, depth: int = 2, actions: int = 7):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.register_buffer("obs_mean", torch.randn(obs_dim, generator=generator) * 0.1)
        self.register_buffer("obs_std", torch.rand(obs_dim, generator=generator) + 0.5)
        self.encoder = nn.Sequential(nn.Linear(obs_dim + state_dim, width), nn.GELU(), nn.Linear(width, width))
        self.blocks = nn.ModuleList(_Block(width, heads=4) for _ in range(depth))
        self.head = nn.Linear(width, actions)

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        normalized = (obs - self.obs_mean) / self.obs_std
        steps = normalized.shape[1]
        tokens = self.encoder(torch.cat([normalized, state.unsqueeze(1).expand(-1, steps, -1)], dim=-1))
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(tokens), normalized.clone(), state.clone()


def _seeded(make: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    """``make()`` with the same weights every time, the caller's random state left as it was."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return make().eval()


@dataclass(frozen=True)
class Example:
    name: str
    description: str
    build: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    # Longest reduction feeding an output, for the comparison tolerance.
    terms: int = 1


EXAMPLES: dict[str, Example] = {
    example.name: example
    for example in (
        Example(
            "copy-of-input",
            "y = x.clone(); return y, torch.sin(y)",
            CopyOfInput,
            lambda g: (torch.randn(4, 8, generator=g),),
        ),
        Example(
            "robot-policy",
            "encoder + 2 transformer blocks + action head, returns copies of its observation",
            lambda: _seeded(RobotPolicy),
            lambda g: (torch.randn(2, 8, 24, generator=g), torch.randn(2, 6, generator=g)),
            terms=16,  # ~15 matmuls deep: rounding errors add up as a random walk
        ),
    )
}
