"""A KV cache longer than a block grows with what is written to it, and stays exact however it is written."""

from __future__ import annotations

import copy
import io
import json
import logging
import math
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
import torch
from executorch.exir import ExecutorchProgramManager

from openvino_backend.llm.export import export_decoder
from openvino_backend.llm.models import load_decoder
from openvino_backend.lowering.kv_cache import BLOCK, _one_value
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
    # The positions not yet held grow from the exported zeros broadcast, not from a cache-sized constant
    # per cache in the blob (the gap call below reads them). What is left along the positions: a stand-in
    # of one byte per position, which gives the rows' shape.
    (model,) = _compiled_models(program)
    cache_sized = []
    for op in model.get_ordered_ops():
        if op.get_rt_info()["layerType"].astype(str) != "Const":
            continue
        shape = op.get_output_partial_shape(0)
        dims = shape.to_shape() if shape.is_static else []
        if len(dims) == 4 and dims[2] == CONTEXT and math.prod(dims) > CONTEXT:
            cache_sized.append((op.get_friendly_name(), list(dims)))
    assert not cache_sized, cache_sized
    # Caches written at the same positions and read as far as one mask reaches hold the same positions
    # throughout: how many is read once for all of them, not once per cache. ExecuTorch's Llama takes
    # its position into each layer as a scalar of its own (`input_pos.item()`, a delegate input each),
    # so there a layer's key and value share one read.
    length_reads = [
        op
        for op in model.get_ordered_ops()
        if op.get_rt_info()["layerType"].astype(str) == "ShapeOf"
        and op.input_value(0).get_node().get_rt_info()["layerType"].astype(str) == "MemoryInput"
    ]
    want = 1 if family == "qwen2" else LLAMA["n_layers"]
    assert len(length_reads) == want, [op.get_friendly_name() for op in length_reads]
    _assert_follows_eager(program, eager, CALLS, seed=0)


def test_a_cache_of_one_block_is_left_at_its_length(params: Path, caplog: pytest.LogCaptureFixture) -> None:
    short = load_decoder(params, max_context=BLOCK)
    with caplog.at_level(logging.DEBUG, logger="openvino_backend.lowering.kv_cache"):
        export_decoder(short)
    assert not any("read their KV cache" in record.getMessage() for record in caplog.records)


def _compiled_models(program: ExecutorchProgramManager) -> list[ov.Model]:
    """The runtime graphs of the program's OpenVINO blobs, as the CPU plugin imports them."""
    graph_module = program.exported_program().graph_module
    blobs = [m.processed_bytes for m in graph_module.children() if hasattr(m, "processed_bytes")]
    return [ov.Core().import_model(io.BytesIO(blob), "CPU").get_runtime_model() for blob in blobs]


def test_a_cache_written_along_its_positions_is_never_transposed_whole(
    params: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The frontend writes ``index_put`` along the positions' axis by transposing the whole cache
    twice; each write becomes a ``ScatterUpdate`` of its rows, at any length, and stays exact."""
    decoder = load_decoder(params, max_context=BLOCK)
    eager = copy.deepcopy(decoder.module)
    with caplog.at_level(logging.DEBUG, logger="openvino_backend.lowering.kv_cache"):
        program = export_decoder(decoder)
    assert any("4 variable(s) written along their axis" in r.getMessage() for r in caplog.records)
    (model,) = _compiled_models(program)
    kinds = {op.get_friendly_name(): op.get_rt_info()["layerType"].astype(str) for op in model.get_ordered_ops()}
    assert "ScatterNDUpdate" not in kinds.values(), sorted(set(kinds.values()))
    for op in model.get_ordered_ops():
        if kinds[op.get_friendly_name()] == "Transpose":
            source = op.input_value(0).get_node()
            assert kinds[source.get_friendly_name()] != "MemoryInput", f"{op.get_friendly_name()} transposes a cache"
    calls = [(0, 5), *((p, 1) for p in range(5, 12)), (0, 3), (3, 1), (BLOCK - 2, 2)]
    _assert_follows_eager(program, eager, calls, seed=1)


def _assert_follows_eager(
    program: ExecutorchProgramManager, eager: torch.nn.Module, calls: list[tuple[int, int]], seed: int
) -> None:
    """One loaded program called at each (first position, tokens) in turn, random tokens: its last
    logits match eager's at the runtime's precision after every call."""
    method = LoadedMethod(program.buffer)
    draw = torch.Generator().manual_seed(seed)
    for position, length in calls:
        tokens = torch.randint(0, LLAMA["vocab_size"], (1, length), generator=draw)
        with torch.no_grad():
            want = eager(tokens, torch.tensor([position]))
        got = method([tokens, torch.tensor([position])])[0]
        want = want.reshape(-1, want.shape[-1])[-1]
        got = got.reshape(-1, got.shape[-1])[-1]
        tolerance = Tolerance.for_output(torch.float32, terms=LLAMA["dim"], scale=want.abs().max().item(), ops=8)
        assert tolerance.check(got, want), (position, length, (got - want).abs().max().item(), tolerance)


@pytest.mark.parametrize(
    ("value", "one"),
    [
        (np.zeros((1, 2, 8, 4), np.float32), True),
        (np.full((3, 5), np.nan, np.float32), True),
        (np.array([0.0, -0.0], np.float32), False),  # equal as numbers, not as bits: sliced, not broadcast
        (np.array([[1, 1], [1, 2]], np.int64), False),
    ],
)
def test_a_cache_grows_from_a_broadcast_only_when_its_exported_value_is_one_bit_pattern(
    value: np.ndarray, one: bool
) -> None:
    assert _one_value(value) is one
