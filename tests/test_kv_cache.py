"""A KV cache longer than a block grows with what is written to it, and stays exact however it is written."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
import torch

from openvino_backend.llm.export import export_decoder
from openvino_backend.llm.models import load_decoder
from openvino_backend.lowering.kv_cache import BLOCK
from openvino_backend.runtime import Tolerance
from openvino_backend.tools.verify import LoadedMethod

LLAMA = {"dim": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 256}
CONTEXT = 2 * BLOCK + 64

# (first position, tokens) of each call: a prompt, the first tokens one at a time (few keys: each one
# counts), the rest of it in one call, decode across a block's end, a new prompt from 0 on the same
# loaded program (a new conversation) and decode, a call past every position written so far (the
# positions between read as the cache's exported zeros), and one writing the context's last positions.
CALLS = [
    *((p, 1) for p in range(3)),
    (3, 97),
    *((p, 1) for p in range(100, 140)),
    *((p, 1) for p in range(3)),
    (3, 17),
    *((p, 1) for p in range(20, 25)),
    (300, 3),
    (CONTEXT - 4, 4),
]


@pytest.fixture
def params(tmp_path: Path) -> Path:
    path = tmp_path / "params.json"
    path.write_text(json.dumps(LLAMA))
    return path


def _qwen2(directory: Path) -> Path:
    """A Qwen2 from its config (grouped keys and values, the mask computed from the positions)."""
    transformers = pytest.importorskip("transformers", reason="Hugging Face decoders need the llm extra")
    transformers.Qwen2Config(
        hidden_size=LLAMA["dim"],
        intermediate_size=128,
        num_hidden_layers=LLAMA["n_layers"],
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=LLAMA["vocab_size"],
        max_position_embeddings=CONTEXT,
    ).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("family", ["executorch llama", pytest.param("qwen2", marks=pytest.mark.slow)])
def test_a_long_cache_is_read_as_far_as_the_mask_reaches_and_follows_eager_through_rewinds_and_gaps(
    family: str, params: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    decoder = load_decoder(params if family == "executorch llama" else _qwen2(tmp_path), max_context=CONTEXT)
    eager = copy.deepcopy(decoder.module)
    with caplog.at_level(logging.DEBUG, logger="openvino_backend.lowering.kv_cache"):
        program = export_decoder(decoder)
    assert any("2 attentions read their KV cache" in record.getMessage() for record in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
    method = LoadedMethod(program.buffer)
    draw = torch.Generator().manual_seed(0)
    for position, length in CALLS:
        tokens = torch.randint(0, LLAMA["vocab_size"], (1, length), generator=draw)
        with torch.no_grad():
            want = eager(tokens, torch.tensor([position]))
        got = method([tokens, torch.tensor([position])])[0]
        want = want.reshape(-1, want.shape[-1])[-1]
        got = got.reshape(-1, got.shape[-1])[-1]
        tolerance = Tolerance.for_output(torch.float32, terms=LLAMA["dim"], scale=want.abs().max().item(), ops=8)
        assert tolerance.check(got, want), (position, length, (got - want).abs().max().item(), tolerance)


def test_a_cache_of_one_block_is_left_at_its_length(params: Path, caplog: pytest.LogCaptureFixture) -> None:
    short = load_decoder(params, max_context=BLOCK)
    with caplog.at_level(logging.DEBUG, logger="openvino_backend.lowering.kv_cache"):
        export_decoder(short)
    assert not any("read their KV cache" in record.getMessage() for record in caplog.records)
