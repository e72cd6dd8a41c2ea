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
