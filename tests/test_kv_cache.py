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
from executorch.exir.dialects._ops import ops as exir_ops

from openvino_backend.llm.export import export_decoder
from openvino_backend.llm.models import load_decoder
from openvino_backend.lowering.model_passes.kv_cache import _one_value
from openvino_backend.lowering.model_passes.kv_cache_writes import BLOCK
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
    with caplog.at_level(logging.DEBUG, logger="openvino_backend.lowering.model_passes.kv_cache"):
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
    # An attention's key and value caches hold the same positions: it reads all they hold, its mask cut
    # to match, rather than a copy of them cut to the mask's reach.
    kind = {op.get_friendly_name(): op.get_rt_info()["layerType"].astype(str) for op in model.get_ordered_ops()}
    cut = [
        op.get_friendly_name()
        for op in model.get_ordered_ops()
        if kind[op.get_friendly_name()] == "StridedSlice"
        and kind[op.input_value(0).get_node().get_friendly_name()] == "ScatterUpdate"
    ]
    assert not cut, cut
    _assert_follows_eager(program, eager, CALLS, seed=0)


@pytest.mark.slow
def test_a_cache_of_one_block_is_left_at_its_length(params: Path, caplog: pytest.LogCaptureFixture) -> None:
    short = load_decoder(params, max_context=BLOCK)
    with caplog.at_level(logging.DEBUG, logger="openvino_backend.lowering.model_passes.kv_cache"):
        export_decoder(short)
    assert not any("read their KV cache" in record.getMessage() for record in caplog.records)


def _compiled_models(program: ExecutorchProgramManager) -> list[ov.Model]:
    """The runtime graphs of the program's OpenVINO blobs, as the CPU plugin imports them."""
    graph_module = program.exported_program().graph_module
    blobs = [m.processed_bytes for m in graph_module.children() if hasattr(m, "processed_bytes")]
    return [ov.Core().import_model(io.BytesIO(blob), "CPU").get_runtime_model() for blob in blobs]


@pytest.mark.slow
def test_a_cache_written_along_its_positions_is_never_transposed_whole(
    params: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The frontend writes ``index_put`` along the positions' axis by transposing the whole cache
    twice; each write becomes a ``ScatterUpdate`` of its rows, at any length, and stays exact."""
    decoder = load_decoder(params, max_context=BLOCK)
    eager = copy.deepcopy(decoder.module)
    with caplog.at_level(logging.DEBUG, logger="openvino_backend.lowering.model_passes.kv_cache"):
        program = export_decoder(decoder)
    assert any("4 variable(s) written along their axis" in r.getMessage() for r in caplog.records)
    (model,) = _compiled_models(program)
    kinds = {op.get_friendly_name(): op.get_rt_info()["layerType"].astype(str) for op in model.get_ordered_ops()}
    assert "ScatterNDUpdate" not in kinds.values(), sorted(set(kinds.values()))
    for op in model.get_ordered_ops():
        if kinds[op.get_friendly_name()] == "Transpose":
            source = op.input_value(0).get_node()
            assert kinds[source.get_friendly_name()] != "MemoryInput", f"{op.get_friendly_name()} transposes a cache"
        if kinds[op.get_friendly_name()] == "ScatterUpdate":
            # The rows written are the model's keys and values as it computed them: their count is the
            # positions' (torch.export's sizes say so), so the frontend's broadcast to it is gone.
            values = op.input_value(2).get_node()
            chain = [kinds[values.get_friendly_name()]]
            if chain[0] == "Transpose":
                chain.append(kinds[values.input_value(0).get_node().get_friendly_name()])
            assert "Broadcast" not in chain, f"{op.get_friendly_name()} writes {' <- '.join(chain)}"
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


class Writes(torch.nn.Module):
    """Two buffers written at a call's positions: one with a row per position, one with a single row
    broadcast to every position."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("rows", torch.zeros(1, 2, 16, 4))
        self.register_buffer("filled", torch.zeros(1, 2, 16, 4))

    def forward(self, x: torch.Tensor, fill: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[2]) + start
        self.rows[:, :, positions] = x
        self.filled[:, :, positions] = fill
        return self.rows * 2 + self.filled


def test_only_writes_whose_values_fill_their_positions_skip_the_broadcast() -> None:
    """A write whose values have one row per position (torch.export's sizes: the same symbol) is
    written as given; one row broadcast to every position keeps its broadcast, and both stay exact."""
    from executorch.exir import to_edge_transform_and_lower

    from openvino_backend.lowering.model_passes.kv_cache_writes import exact_writes
    from openvino_backend.partition.partitioner import OpenvinoPartitioner
    from openvino_backend.program import to_executorch

    inputs = (torch.randn(1, 2, 3, 4), torch.randn(1, 2, 1, 4), torch.tensor([0]))
    shapes = ({2: torch.export.Dim("n", min=1, max=8)}, None, None)
    exported = torch.export.export(Writes(), inputs, dynamic_shapes=shapes)
    edge = to_edge_transform_and_lower(exported, partitioner=[OpenvinoPartitioner()])
    (lowered,) = [m for m in edge.exported_program().graph_module.children() if hasattr(m, "original_module")]
    graph = lowered.original_module.graph_module
    writes = {n.name: n.args[0].name for n in graph.graph.nodes if n.target == exir_ops.edge.aten.index_put.default}
    assert {writes[name] for name in exact_writes(graph)} == {"b_rows"}, writes
    (model,) = _compiled_models(edge)
    broadcasts = [op for op in model.get_ordered_ops() if op.get_rt_info()["layerType"].astype(str) == "Broadcast"]
    assert len(broadcasts) == 1, [op.get_friendly_name() for op in broadcasts]  # the fill's
    method = LoadedMethod(to_executorch(edge).buffer)
    module = Writes()
    for n, start in [(3, 0), (1, 3), (5, 4), (2, 0), (8, 8)]:
        x, fill = torch.randn(1, 2, n, 4), torch.randn(1, 2, 1, 4)
        (got,) = method([x, fill, torch.tensor([start])])
        want = module(x, fill, torch.tensor([start]))
        assert Tolerance.for_output(torch.float32, scale=want.abs().max().item(), ops=2).check(got, want), (n, start)
