"""A checkpoint's weights compressed as they are read: the export of a bf16 checkpoint to int8 or int4
weights never makes the model's f32 copy, and gives exactly the graph the f32 model gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openvino_backend.llm.export import example_inputs, export_graph
from openvino_backend.llm.models import load_decoder
from tests.llm_fixtures import write_tiny_llama

pytest.importorskip("transformers", reason="Hugging Face decoders need the llm extra")
pytest.importorskip("nncf", reason="compressed weights need the quantize extra")
pytestmark = pytest.mark.slow  # two exports of a decoder per test


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama whose weights are stored in bf16, as released checkpoints are; its head tied."""
    import transformers

    directory = write_tiny_llama(tmp_path_factory.mktemp("bf16-llama"))
    config = transformers.AutoConfig.from_pretrained(directory)
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_stored_weights_compress_to_exactly_what_the_f32_model_compresses_to(bf16_checkpoint, weights) -> None:
    stored = load_decoder(bf16_checkpoint, max_context=32, stored_weights=True)
    assert stored.stored and all(t.dtype == torch.bfloat16 for t in stored.stored.values())
    assert all(p.dtype == torch.float32 for p in stored.module.parameters())  # the stand-ins trace in f32
    streamed = export_graph(stored, weights=weights)
    reference = export_graph(load_decoder(bf16_checkpoint, max_context=32), weights=weights)
    # The same integer weights, scales and zero points, f32 norms and caches (named as each trace
    # names them: the two exports trace the static cache and the tied head differently).
    got, want = _contents(streamed), _contents(reference)
    assert got == want
    assert any(dtype == torch.uint8 for dtype, _, _ in want)  # compressed, not f32
    tokens, start = example_inputs(stored, 5)
    with torch.no_grad():
        torch.testing.assert_close(streamed.module()(tokens, start), reference.module()(tokens, start))


def _contents(program: torch.export.ExportedProgram) -> list[tuple[torch.dtype, tuple[int, ...], bytes]]:
    tensors = [*program.state_dict.values(), *(t for t in program.constants.values() if isinstance(t, torch.Tensor))]
    return sorted(
        ((t.dtype, tuple(t.shape), t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()) for t in tensors),
        key=lambda entry: (str(entry[0]), entry[1], entry[2]),
    )


def test_f32_weights_from_stored_ones_are_the_checkpoint_s(bf16_checkpoint) -> None:
    """Where the export needs the f32 model (f32 weights, calibration), it puts the weights back."""
    stored = load_decoder(bf16_checkpoint, max_context=32, stored_weights=True)
    streamed = export_graph(stored, weights="f32")
    assert stored.stored is None
    reference = export_graph(load_decoder(bf16_checkpoint, max_context=32), weights="f32")
    assert _contents(streamed) == _contents(reference)
    tokens, start = example_inputs(stored, 5)
    with torch.no_grad():
        torch.testing.assert_close(streamed.module()(tokens, start), reference.module()(tokens, start), atol=0, rtol=0)


def test_the_compressed_graph_holds_no_dequantized_copy_of_the_weights(bf16_checkpoint) -> None:
    """NNCF records each decompressor's output as its node's value, running it on the real weight:
    every weight dequantized, held through compression (a 3 B model's 6 GB) and beyond. Only the
    shapes are recorded here (fake tensors)."""
    from torch._subclasses.fake_tensor import FakeTensor

    from openvino_backend.llm.export import compress_weights

    decoder = load_decoder(bf16_checkpoint, max_context=32)
    exported = torch.export.export(decoder.module, example_inputs(decoder, 3), strict=True)
    compressed = compress_weights(exported.module(), "int4", [], decoder)
    decompressors = [
        n
        for n in compressed.graph.nodes
        if n.op == "call_module" and hasattr(compressed.get_submodule(n.target), "result_dtype")
    ]
    assert decompressors
    assert all(isinstance(n.meta.get("val"), FakeTensor) for n in decompressors)
    values = [n.meta.get("val") for n in compressed.graph.nodes]
    assert [v for v in values if isinstance(v, torch.Tensor) and not isinstance(v, FakeTensor)] == []


def test_a_streamed_export_lets_the_checkpoint_go_once_compressed(bf16_checkpoint) -> None:
    """The memory-mapped checkpoint is unmapped as soon as its weights are compressed, not held through
    lowering; the decoder, whose module has no weights of its own, then refuses a second export."""
    import gc

    decoder = load_decoder(bf16_checkpoint, max_context=32, stored_weights=True)

    def mapped() -> bool:
        gc.collect()
        return str(bf16_checkpoint / "model.safetensors") in Path("/proc/self/maps").read_text()

    assert mapped()
    export_graph(decoder, weights="int8")
    assert decoder.released and not mapped()
    with pytest.raises(ValueError, match="load it again"):
        export_graph(decoder, weights="int8")


def test_released_checkpoint_pages_leave_the_process_and_the_values_intact(tmp_path) -> None:
    """What ``releasing_pages`` does to a memory-mapped checkpoint while NNCF reads it: the pages
    read so far stop counting as this process's memory, and reading again gives the same values."""
    from safetensors.torch import load_file, save_file

    from openvino_backend.llm.pages import file_mappings, release_pages

    path = tmp_path / "weights.safetensors"
    save_file({"w": torch.arange(4 << 20, dtype=torch.float32)}, str(path))  # 16 MB
    weight = load_file(str(path))["w"]  # memory-mapped

    def resident_mb() -> float:
        text, total, inside = Path("/proc/self/smaps").read_text(), 0.0, False
        for line in text.splitlines():
            if "-" in line.split(" ")[0] and len(line.split()) >= 5:
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) / 1024
        return total

    ranges = file_mappings([weight])
    assert ranges, "the tensor is not memory-mapped from the file"
    assert torch.equal(weight, torch.arange(4 << 20, dtype=torch.float32))  # read: resident
    assert resident_mb() >= 15
    release_pages(ranges)
    assert resident_mb() < 1
    assert torch.equal(weight, torch.arange(4 << 20, dtype=torch.float32))
