"""The models the tests, the bench and the fuzzer share: built in code, seeded by the caller,
no downloads. Dynamic-shape models first, then the larger ones the bench times."""

from __future__ import annotations

import torch
from torch import nn

from openvino_backend.tools.examples import _Block


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


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Policy(torch.nn.Module):
    """Robot-policy-shaped: linear encoder, a learned query expanded to the batch, a 2-layer
    ``nn.TransformerEncoder`` and an action head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(24, 64)
        self.query = torch.nn.Parameter(torch.randn(1, 1, 64))
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.transformer = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(64, 7)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        tokens = torch.cat([self.query.expand(obs.shape[0], -1, -1), self.encoder(obs)], dim=1)
        return self.head(self.transformer(tokens)[:, 0])


class RMSNorm(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class DecoderLayer(torch.nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(width), RMSNorm(width)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width, bias=False) for _ in range(4))
        self.gate, self.up = (torch.nn.Linear(width, 2 * width, bias=False) for _ in range(2))
        self.down = torch.nn.Linear(2 * width, width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        h = self.norm1(x)
        q, k, v = (p(h).view(batch, seq, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        q, k = (t * cos + _rotate_half(t) * sin for t in (q, k))
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(batch, seq, width))
        h = self.norm2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class Decoder(torch.nn.Module):
    """Llama-shaped: token embedding, rotary positions from ``arange(seq)``, causal attention,
    RMSNorm and a SiLU-gated MLP; returns the last hidden states."""

    def __init__(self, vocab: int = 100, width: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList(DecoderLayer(width, heads) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, width // heads, 2).float() / (width // heads)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        angles = torch.arange(tokens.shape[1], dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


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
