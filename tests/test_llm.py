"""The LLM recipe: decoders exported with their KV cache in OpenVINO state, run on ExecuTorch's runtime."""

from __future__ import annotations

import copy
import json
import logging
from collections import Counter
from pathlib import Path

import pytest
import torch

from openvino_backend.llm import export as export_module
from openvino_backend.llm.export import CompressionError, example_inputs, export_decoder, export_graph, lower_graph
from openvino_backend.llm.generate import Generator
from openvino_backend.llm.models import Decoder, ModelSourceError, UnsupportedDecoderError, load_decoder
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.runtime import Tolerance
from openvino_backend.tools.cli import main
from openvino_backend.tools.results import EXIT_OK, EXIT_USAGE

TINY_LLAMA = {"dim": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 256}
CONTEXT = 64


def _assert_follows_eager(decoder: Decoder, eager: torch.nn.Module, layers: int, dim: int, steps: int = 32) -> None:
    """Prefill an 8-token prompt in one call, then decode ``steps`` tokens (the eager model's choice
    each time), comparing every logits vector with eager's at the runtime's precision."""
    program = export_decoder(decoder)
    lowered = program.exported_program()
    # Nothing cache-sized is written back by ExecuTorch (a transformers model keeps 0-d position
    # counters with ExecuTorch: the runtime cannot bind 0-d tensors).
    remaining = set(lowered.graph_signature.buffers_to_mutate.values())
    buffers = lowered.graph_signature.inputs_to_buffers
    sizes = [
        n.meta["val"].numel() for n in lowered.graph.find_nodes(op="placeholder") if buffers.get(n.name) in remaining
    ]
    assert all(size <= 1 for size in sizes), f"a KV cache is copied through the delegate: {remaining}"
    generator = Generator(program.buffer)
    tokens = torch.randint(0, decoder.vocab_size, (8,), generator=torch.Generator().manual_seed(0)).tolist()
    position = 0
    for step in range(steps + 1):
        with torch.no_grad():
            want = eager(torch.tensor([tokens]), torch.tensor([position]))[-1]
        got = generator(tokens)
        tolerance = Tolerance.for_output(torch.float32, terms=dim, scale=want.abs().max().item(), ops=4 * layers)
        assert tolerance.check(got, want), (step, (got - want).abs().max().item(), tolerance)
        position += len(tokens)
        tokens = [int(want.argmax())]


@pytest.fixture
def llama_params(tmp_path: Path) -> Path:
    path = tmp_path / "params.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return path


@pytest.mark.isa
@pytest.mark.slow  # the inner loop exports a decoder in test_families' llama
def test_example_llama_prefills_in_one_call_and_decodes_like_eager(llama_params: Path) -> None:
    decoder = load_decoder(llama_params, max_context=CONTEXT)
    _assert_follows_eager(decoder, copy.deepcopy(decoder.module), TINY_LLAMA["n_layers"], TINY_LLAMA["dim"])


@pytest.mark.slow
def test_the_whole_cache_stays_in_openvino_and_any_prompt_length_runs(llama_params: Path) -> None:
    decoder = load_decoder(llama_params, max_context=CONTEXT)
    eager = copy.deepcopy(decoder.module)
    from openvino_backend.llm.export import example_inputs
    from openvino_backend.partition.partitioner import OpenvinoPartitioner

    partitioner = OpenvinoPartitioner(sample_inputs=example_inputs(decoder))
    program = export_decoder(decoder, partitioner=partitioner)
    assert len(partitioner.report.state_buffers) == 2 * TINY_LLAMA["n_layers"]  # a key and a value cache per layer
    for length in (1, CONTEXT - 1):  # the bounds of the prompt's dynamic dim, each in one call
        tokens = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(length))
        got = Generator(program.buffer)(tokens[0].tolist())
        with torch.no_grad():
            want = copy.deepcopy(eager)(tokens, torch.tensor([0]))[-1]
        assert Tolerance.for_output(torch.float32, terms=64, scale=want.abs().max().item(), ops=8).check(got, want)


@pytest.mark.slow
def test_a_prompt_beyond_the_context_is_refused(llama_params: Path) -> None:
    generator = Generator(export_decoder(load_decoder(llama_params, max_context=8)).buffer)
    with pytest.raises(ValueError, match="exceed the program's context of 8"):
        generator(list(range(9)))


@pytest.mark.slow
def test_a_hugging_face_decoder_from_its_config_decodes_like_eager(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="Hugging Face decoders need the llm extra")
    transformers.Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=CONTEXT,
    ).save_pretrained(tmp_path)
    decoder = load_decoder(tmp_path, max_context=CONTEXT)
    _assert_follows_eager(decoder, copy.deepcopy(decoder.module), layers=2, dim=64, steps=8)


@pytest.mark.slow
def test_export_and_generate_from_the_command_line(tmp_path: Path, llama_params: Path, capsys) -> None:
    program = tmp_path / "tiny.pte"
    assert main(["export-llm", str(llama_params), "-o", str(program), "--max-seq-len", str(CONTEXT)]) == EXIT_OK
    assert "wrote" in capsys.readouterr().out
    assert main(["generate", str(program), "--prompt-ids", "1,5,9", "--max-new-tokens", "6"]) == EXIT_OK
    out, err = capsys.readouterr()
    decoder = load_decoder(llama_params, max_context=CONTEXT)  # the same random weights: seeded
    with torch.no_grad():
        logits = decoder.module(torch.tensor([[1, 5, 9]]), torch.tensor([0]))
    assert out.split()[0] == str(int(logits.argmax()))  # the first token is unambiguous at any precision
    assert len(out.split()) == 6 and "3 prompt tokens" in err


@pytest.mark.slow
def test_compressing_from_the_command_line_prints_only_its_own_lines(
    tmp_path: Path, llama_params: Path, capsys
) -> None:
    """NNCF logs a table and a progress bar per compression on stdout, and resets its level when
    imported: without --debug none of it reaches the command's output."""
    pytest.importorskip("nncf", reason="weight compression runs on NNCF (the quantize extra)")
    program = tmp_path / "tiny.pte"
    argv = ["export-llm", str(llama_params), "-o", str(program), "--max-seq-len", str(CONTEXT), "--weights", "int8"]
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert program.exists()
    assert out.splitlines()[0].startswith("model: ") and "weights int8" in out, out
    assert not any(word in out for word in ("bitwidth", "Weight compression", "Applying")), out
    argv[-1:] = ["int4", "--ratio", "0.5", "--group-size", "32", "--sym"]
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert "weights int4, groups of 32, 50% of the layers, the rest int8 symmetric)" in out.splitlines()[0], out


def test_bad_model_sources_are_refused_by_name(tmp_path: Path, capsys) -> None:
    with pytest.raises(ModelSourceError, match=r"expected a params\.json"):
        load_decoder(tmp_path)
    assert main(["export-llm", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.pte")]) == EXIT_USAGE
    assert "missing.json: no such file or directory" in capsys.readouterr().err
    assert main(["export-llm", str(tmp_path), "-o", str(tmp_path / "x.pte"), "--sym"]) == EXIT_USAGE
    assert "--sym shapes compressed weights" in capsys.readouterr().err
    # Options that only shape 4-bit weights are refused with any other weights, not ignored.
    for weights, extra, named in (
        ("int8", ["--ratio", "0.8"], "--ratio only shape"),
        ("f32", ["--group-size", "64", "--calibration-prompt", "hi"], "--group-size and --calibration-prompt"),
        ("int8", ["--group-size", "128"], "--group-size only shape"),
    ):
        argv = ["export-llm", str(tmp_path), "-o", str(tmp_path / "x.pte"), "--weights", weights, *extra]
        assert main(argv) == EXIT_USAGE, extra
        assert named in capsys.readouterr().err, extra
    broken = tmp_path / "params.json"
    broken.write_text("{")
    assert main(["export-llm", str(broken), "-o", str(tmp_path / "x.pte")]) == EXIT_USAGE
    assert "cannot read the model's parameters" in capsys.readouterr().err


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory: pytest.TempPathFactory) -> Decoder:
    # Wide enough that weights dominate the program, as in any real LLM.
    path = tmp_path_factory.mktemp("wide") / "params.json"
    path.write_text(json.dumps({"dim": 256, "n_layers": 2, "n_heads": 4, "vocab_size": 512}))
    return load_decoder(path, max_context=CONTEXT)


@pytest.mark.slow
@pytest.mark.parametrize(("weights", "largest_share"), [("int8", 0.35), ("int4", 0.25)])
def test_compressed_weights_stay_compressed_and_keep_the_logits(
    wide_llama: Decoder, weights: str, largest_share: float
) -> None:
    pytest.importorskip("nncf", reason="weight compression runs on NNCF (the quantize extra)")
    f32 = export_decoder(wide_llama).buffer
    compressed = export_decoder(wide_llama, weights=weights).buffer
    assert len(compressed) <= largest_share * len(f32), (len(compressed), len(f32))
    tokens = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = copy.deepcopy(wide_llama.module)(tokens, torch.tensor([0]))[-1]
    got = Generator(compressed)(tokens[0].tolist())
    assert torch.nn.functional.cosine_similarity(got, want, dim=0) >= 0.99


@pytest.mark.slow
def test_the_exported_graph_is_the_eager_model_with_the_programs_weights(wide_llama: Decoder) -> None:
    """``export_graph`` hands back what ``lower_graph`` lowers: its module computes with the 4-bit
    weights, and the program follows it more closely than it follows the float model."""
    pytest.importorskip("nncf", reason="weight compression runs on NNCF (the quantize extra)")
    graph = export_graph(wide_llama, weights="int4")
    same = graph.module()
    assert any(b.dtype == torch.uint8 for b in same.buffers()), "no compressed weights in the graph"
    got = Generator(lower_graph(graph, wide_llama).buffer)
    tokens = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        compressed = same(tokens, torch.tensor([0]))[-1]
        floating = copy.deepcopy(wide_llama.module)(tokens, torch.tensor([0]))[-1]
    ours = got(tokens[0].tolist())
    cosine = torch.nn.functional.cosine_similarity
    to_compressed, to_float = float(cosine(ours, compressed, dim=0)), float(cosine(ours, floating, dim=0))
    assert to_compressed >= 0.999, to_compressed
    assert to_compressed > to_float, (to_compressed, to_float)


@pytest.mark.slow
def test_symmetric_8_bit_weights_have_no_zero_point_and_the_program_follows_them(wide_llama: Decoder) -> None:
    """``symmetric`` (``--sym``): 8-bit weights are signed with a scale alone, where the default keeps an
    unsigned weight and a zero point per channel; the program computes with the weights it was given."""
    pytest.importorskip("nncf", reason="weight compression runs on NNCF (the quantize extra)")
    graphs = {symmetric: export_graph(wide_llama, weights="int8", symmetric=symmetric) for symmetric in (False, True)}
    dtypes = {symmetric: Counter(b.dtype for b in graph.module().buffers()) for symmetric, graph in graphs.items()}
    assert dtypes[True][torch.int8] > 0 and dtypes[True][torch.uint8] == 0, dtypes[True]
    # Unsigned: a weight and a zero point per channel, for each signed weight of the symmetric graph.
    assert dtypes[False][torch.uint8] == 2 * dtypes[True][torch.int8] and dtypes[False][torch.int8] == 0, dtypes
    graph = graphs[True]
    got = Generator(lower_graph(graph, wide_llama).buffer)
    tokens = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = graph.module()(tokens, torch.tensor([0]))[-1]
    assert float(torch.nn.functional.cosine_similarity(got(tokens[0].tolist()), want, dim=0)) >= 0.999


def test_an_op_outside_executorch_s_ir_left_to_its_kernels_is_still_refused(
    wide_llama: Decoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lowering runs without ExecuTorch's IR check; ``check_ir`` runs it on what OpenVINO did not
    take. NNCF's 4-bit unpacking shift is no core ATen op: kept out of OpenVINO and off the exception
    list, the program is refused by name, not written for kernels that do not exist."""
    pytest.importorskip("nncf", reason="weight compression runs on NNCF (the quantize extra)")
    graph = export_graph(wide_llama, weights="int4")
    monkeypatch.setattr(export_module, "_UNPACKING_OPS", [])
    shift = "aten.bitwise_right_shift.Tensor_Scalar"
    partitioner = OpenvinoPartitioner(sample_inputs=example_inputs(wide_llama), op_types_to_skip={shift})
    with pytest.raises(UnsupportedDecoderError, match=r"ExecuTorch's IR refuses it.*bitwise_right_shift"):
        lower_graph(graph, wide_llama, partitioner=partitioner)


def test_compression_is_refused_by_name_when_asked_wrongly(wide_llama: Decoder) -> None:
    with pytest.raises(CompressionError, match="weights 'int3'"):
        export_decoder(wide_llama, weights="int3")
    with pytest.raises(CompressionError, match="outside the vocabulary of 512"):
        export_decoder(wide_llama, weights="int4", calibration=[[1, 600]])
    for ratio in (0.0, 1.5):
        with pytest.raises(CompressionError, match=f"ratio {ratio}: the share of layers in 4 bits"):
            export_decoder(wide_llama, weights="int4", ratio=ratio)
    with pytest.raises(CompressionError, match="group size 0"):
        export_decoder(wide_llama, weights="int4", group_size=0)


def test_a_bad_ratio_is_a_usage_error_on_the_command_line(tmp_path: Path, llama_params: Path, capsys) -> None:
    out = tmp_path / "x.pte"
    assert main(["export-llm", str(llama_params), "-o", str(out), "--weights", "int4", "--ratio", "2"]) == EXIT_USAGE
    assert "ratio 2.0" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_mixed_4_and_8_bit_weights_and_smaller_groups_reach_the_program(wide_llama: Decoder) -> None:
    """``ratio`` keeps some layers in 8 bits and ``group_size`` sets the scales' reach: both show in
    the program's size, between all-4-bit and all-8-bit, and the mix keeps the logits."""
    pytest.importorskip("nncf", reason="weight compression runs on NNCF (the quantize extra)")
    size = {
        name: len(export_decoder(wide_llama, weights=weights, **options).buffer)
        for name, weights, options in (
            ("int4", "int4", {}),
            ("int8", "int8", {}),
            ("groups of 32", "int4", {"group_size": 32}),
        )
    }
    mixed = export_decoder(wide_llama, weights="int4", ratio=0.5).buffer
    assert size["int4"] < len(mixed) < size["int8"], (size, len(mixed))
    assert size["int4"] < size["groups of 32"] < size["int8"], size
    tokens = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = copy.deepcopy(wide_llama.module)(tokens, torch.tensor([0]))[-1]
    got = Generator(mixed)(tokens[0].tolist())
    assert torch.nn.functional.cosine_similarity(got, want, dim=0) >= 0.99


@pytest.mark.slow
def test_4_bit_weights_of_a_width_no_multiple_of_128_compress_in_smaller_groups(tmp_path: Path) -> None:
    """SmolLM2-135M is 576 wide: 4.5 groups of 128. Its layers take groups of 64 rather than refusing."""
    pytest.importorskip("nncf", reason="weight compression runs on NNCF (the quantize extra)")
    path = tmp_path / "params.json"
    path.write_text(json.dumps({"dim": 320, "n_layers": 1, "n_heads": 5, "vocab_size": 512}))
    decoder = load_decoder(path, max_context=CONTEXT)
    f32 = export_decoder(decoder).buffer
    compressed = export_decoder(decoder, weights="int4").buffer
    assert len(compressed) <= 0.3 * len(f32), (len(compressed), len(f32))
    tokens = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = copy.deepcopy(decoder.module)(tokens, torch.tensor([0]))[-1]
    got = Generator(compressed)(tokens[0].tolist())
    assert torch.nn.functional.cosine_similarity(got, want, dim=0) >= 0.99


def test_a_hugging_face_prompt_puts_only_its_last_position_through_the_head(tmp_path: Path) -> None:
    """The program returns the last position's logits, so the head multiplies one row by the
    vocabulary's weights, not one per prompt token (most of a short prompt's prefill at a large
    vocabulary)."""
    transformers = pytest.importorskip("transformers", reason="Hugging Face decoders need the llm extra")
    transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=CONTEXT,
    ).save_pretrained(tmp_path)
    exported = export_graph(load_decoder(tmp_path, max_context=CONTEXT))
    heads = [
        node
        for node in exported.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
        if tuple(node.args[1].meta["val"].shape) == (256, 64)
    ]
    assert len(heads) == 1, heads
    rows = heads[0].args[0].meta["val"].shape[:-1]
    assert all(isinstance(size, int) and size == 1 for size in rows), f"the head multiplies {rows} rows"


def test_lowering_decomposes_the_graph_once_and_keeps_whole_what_openvino_takes_whole(
    wide_llama: Decoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each decomposition traces the whole graph: ``lower_graph`` runs one (ExecuTorch's
    ``to_edge_transform_and_lower`` runs two). What the partitioner keeps whole (the stack that
    unpacks NNCF's 4-bit weights, and the linears: fewer nodes for every later trace) reaches
    OpenVINO whole, and the program follows the graph."""
    pytest.importorskip("nncf", reason="weight compression runs on NNCF (the quantize extra)")
    graph = export_graph(wide_llama, weights="int4")
    decompositions = []
    run_decompositions = torch.export.ExportedProgram.run_decompositions

    def counted(self, *args, **kwargs):
        decompositions.append(self)
        return run_decompositions(self, *args, **kwargs)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counted)
    program = lower_graph(graph, wide_llama)
    assert len(decompositions) == 1
    delegated = [
        node.target.__name__
        for module in program.exported_program().graph_module.modules()
        if hasattr(module, "original_module")
        for node in module.original_module.graph.nodes
        if node.op == "call_function"
    ]
    assert {"aten.stack.default", "aten.linear.default"} <= set(delegated), sorted(set(delegated))
    tokens = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = graph.module()(tokens, torch.tensor([0]))[-1]
    got = Generator(program.buffer)(tokens[0].tolist())
    assert float(torch.nn.functional.cosine_similarity(got, want, dim=0)) >= 0.999


def test_a_linear_a_check_keeps_out_of_openvino_is_lowered_again_decomposed(
    wide_llama: Decoder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Linears are kept whole for OpenVINO; one that a check then keeps out could not run on the CPU
    whole (ExecuTorch refuses it). The export lowers again with linears decomposed, says so, and the
    program still follows the graph."""
    pytest.importorskip("nncf", reason="weight compression runs on NNCF (the quantize extra)")
    from openvino_backend.graph import op_name
    from openvino_backend.partition.numerical import NumericalCheck

    graph = export_graph(wide_llama, weights="int4")
    check = NumericalCheck.__call__
    refused = []

    def refusing_a_linear(self, part):
        linears = [node for node in part.ordered() if op_name(node) == "aten.linear.default"]
        if linears:
            refused.append(linears[-1].name)
            yield linears[-1], "kept out by this test"
            return
        yield from check(self, part)

    monkeypatch.setattr(NumericalCheck, "__call__", refusing_a_linear)
    with caplog.at_level(logging.WARNING, logger="openvino_backend"):
        program = lower_graph(graph, wide_llama)
    assert refused, "the first lowering kept no linear whole"
    assert "lowering again with" in caplog.text and "decomposed" in caplog.text
    tokens = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        want = graph.module()(tokens, torch.tensor([0]))[-1]
    got = Generator(program.buffer)(tokens[0].tolist())
    assert float(torch.nn.functional.cosine_similarity(got, want, dim=0)) >= 0.999


def test_an_op_to_keep_whole_that_openvino_does_not_convert_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"keep_whole: aten\.no_such_op\.default"):
        OpenvinoPartitioner(keep_whole={"aten.no_such_op.default"})
