"""A decoder to a ``.pte`` lowered by this backend: one program that prefills a prompt of any
length in one call and decodes, its KV cache in OpenVINO state, its weights in f32 or
compressed to 8 or 4 bits.

Compressed weights are NNCF's (``nncf.compress_weights`` on the exported graph: OpenVINO's own
scheme, INT8 asymmetric (or, asked, symmetric) per channel or INT4 symmetric in groups of 128,
smaller where a layer's width asks for it; with AWQ and scale estimation when calibration prompts
are given; mixed with 8-bit layers for a ratio below 1). The integer weights and their dequantize reach OpenVINO as
they are, which keeps them compressed in the compiled model: the ``.pte`` stores them at 8 or
4 bits, and decode reads a quarter or an eighth of the bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Literal

import torch
from executorch.exir import (
    EdgeCompileConfig,
    EdgeProgramManager,
    ExecutorchProgramManager,
    to_edge,
)
from executorch.exir.verification.verifier import EXIREdgeDialectVerifier
from torch._export.verifier import SpecViolationError
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from openvino_backend.diagnostics import CpuKernelError, OpenvinoExportError
from openvino_backend.llm.models import Decoder, UnsupportedDecoderError
from openvino_backend.llm.pages import releasing_pages
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.program import to_executorch, writing_inline

logger = logging.getLogger(__name__)

Weights = Literal["f32", "int8", "int4"]
WEIGHTS: tuple[str, ...] = ("f32", "int8", "int4")
INT4_GROUP = 128
# Kept whole for OpenVINO where it takes every one: a decoder's linears decomposed are a tenth of its
# graph's nodes, traced again by each of ExecuTorch's steps (the same MatMul reaches OpenVINO either way).
KEEP_WHOLE = ("aten.linear.default",)
# NNCF unpacks 4-bit weights with a shift that is no core ATen op; OpenVINO folds it into a u4 constant.
_UNPACKING_OPS = [torch.ops.aten.bitwise_right_shift.Tensor_Scalar]


class CompressionError(ValueError):
    """The weights cannot be compressed as asked."""


def example_inputs(decoder: Decoder, prompt: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``prompt``-token input at position 0, ids within the vocabulary."""
    tokens = torch.arange(prompt, dtype=torch.long).reshape(1, prompt) % decoder.vocab_size
    return tokens, torch.tensor([0], dtype=torch.long)


def dynamic_shapes(decoder: Decoder, dynamic: bool) -> tuple[dict[int, object], None] | None:
    """``torch.export``'s dynamic shapes for ``example_inputs``: prompts of 1 to ``max_context - 1``."""
    return ({1: torch.export.Dim("prompt", min=1, max=decoder.max_context - 1)}, None) if dynamic else None


def metadata(decoder: Decoder, dynamic: bool) -> dict[str, object]:
    """Constant methods ExecuTorch's LLM runners read (``get_max_seq_len``, ...)."""
    values: dict[str, object] = {
        "get_max_seq_len": decoder.max_context,
        "get_max_context_len": decoder.max_context,
        "get_vocab_size": decoder.vocab_size,
        "use_kv_cache": True,
        "enable_dynamic_shape": dynamic,
    }
    if decoder.bos_id is not None:
        values["get_bos_id"] = decoder.bos_id
    if decoder.eos_ids:
        values["get_eos_ids"] = list(decoder.eos_ids)
    return values


def export_decoder(
    decoder: Decoder,
    *,
    dynamic: bool = True,
    weights: Weights = "f32",
    calibration: Sequence[Sequence[int]] = (),
    ratio: float = 1.0,
    group_size: int = INT4_GROUP,
    symmetric: bool = False,
    partitioner: OpenvinoPartitioner | None = None,
) -> ExecutorchProgramManager:
    """Export and lower ``decoder``. ``dynamic``: prompts of 1 to ``max_context - 1`` tokens in one
    call; otherwise one token per call. ``weights``: ``f32``, or compressed to ``int8`` / ``int4``.
    For ``int4``: ``calibration`` prompts (token ids) turn on AWQ and scale estimation; ``ratio`` is
    the share of the layers in 4 bits (the rest, those NNCF ranks most sensitive, in 8), and
    ``group_size`` the weights per 4-bit scale. ``symmetric``: 8-bit weights without a zero point (as
    optimum-cli's ``--sym``; 4-bit weights always are)."""
    exported = export_graph(
        decoder,
        dynamic=dynamic,
        weights=weights,
        calibration=calibration,
        ratio=ratio,
        group_size=group_size,
        symmetric=symmetric,
    )
    return lower_graph(exported, decoder, dynamic=dynamic, partitioner=partitioner)


def export_graph(
    decoder: Decoder,
    *,
    dynamic: bool = True,
    weights: Weights = "f32",
    calibration: Sequence[Sequence[int]] = (),
    ratio: float = 1.0,
    group_size: int = INT4_GROUP,
    symmetric: bool = False,
) -> torch.export.ExportedProgram:
    """``decoder`` exported, its weights compressed as asked: the graph ``lower_graph`` lowers, and
    whose ``module()`` is the eager model with exactly the program's weights."""
    if weights not in WEIGHTS:
        raise CompressionError(f"weights {weights!r}: expected one of {', '.join(WEIGHTS)}")
    if symmetric and weights == "f32":
        logger.warning("symmetric only shapes compressed weights: ignored for f32")
    _still_loaded(decoder)
    inputs, shapes = example_inputs(decoder, 3 if dynamic else 1), dynamic_shapes(decoder, dynamic)
    streamed = decoder.stored is not None and weights != "f32" and not calibration
    if decoder.stored is not None and not streamed:
        # f32 weights are the program's, and calibration runs the model: both need the f32 model.
        put_back_weights(decoder)
    with torch.no_grad():
        try:
            # The stand-ins of stored weights trace without strict's copy of every parameter.
            strict = decoder.strict and not streamed
            exported = torch.export.export(decoder.module, inputs, dynamic_shapes=shapes, strict=strict)
        except Exception as error:  # the model's code: data-dependent control flow, unsupported ops, ...
            raise UnsupportedDecoderError(f"{decoder.name}: torch.export cannot export it ({_first(error)})") from error
        if weights != "f32":
            graph_module = exported.module()
            if streamed:
                _take_stored_weights(graph_module, decoder.stored)
            with releasing_pages(decoder.stored.values() if streamed else ()):
                compressed = compress_weights(
                    graph_module,
                    weights,
                    calibration,
                    decoder,
                    ratio=ratio,
                    group_size=group_size,
                    symmetric=symmetric,
                )
            if streamed:
                _computing_in_f32(compressed)
                # Nothing reads the checkpoint any more: its pages (memory-mapped) go with it.
                del graph_module
                decoder.stored, decoder.released = None, True
            exported = torch.export.export(compressed, inputs, dynamic_shapes=shapes)
    return exported


@contextlib.contextmanager
def _decompressed_shapes_only() -> Iterator[None]:
    """NNCF records the value of each weight decompressor it inserts by running it on the compressed
    weight: every weight dequantized, all held until compression ends (a 3 B model's 6 GB in bf16).
    Here it runs them on fake tensors: the shapes and dtypes it records, and nothing else."""
    try:
        from nncf.experimental.torch.fx import transformations

        record = transformations._set_new_node_meta
    except (ImportError, AttributeError):  # another NNCF: compress_weights drops the values afterwards
        yield
        return

    def shapes_only(*args: object, **kwargs: object) -> None:
        with FakeTensorMode(allow_non_fake_inputs=True):
            record(*args, **kwargs)

    transformations._set_new_node_meta = shapes_only
    try:
        yield
    finally:
        transformations._set_new_node_meta = record


def put_back_weights(decoder: Decoder) -> None:
    """Give ``decoder.module`` its stored weights, in f32: an eager model again."""
    _still_loaded(decoder)
    if decoder.stored is None:
        return
    with torch.no_grad():
        for name, parameter in decoder.module.named_parameters(remove_duplicate=False):
            if name in decoder.stored:
                parameter.copy_(decoder.stored[name])
    decoder.stored = None


def _still_loaded(decoder: Decoder) -> None:
    if decoder.released:
        raise ValueError(f"{decoder.name}: an export compressed its stored weights and let them go: load it again")


def _take_stored_weights(graph_module: torch.fx.GraphModule, stored: dict[str, torch.Tensor]) -> None:
    """The exported graph's parameters, stand-ins traced in f32, become the stored weights (checkpoint
    dtype) for NNCF to compress: it reads each in f32 and writes integer weights whose dequantize gives
    f32 (``_computing_in_f32``), exactly what it makes of f32 weights."""
    for name in [name for name, _ in graph_module.named_parameters(remove_duplicate=False)]:
        if name not in stored:
            raise RuntimeError(f"the exported graph's parameter {name} stands for no stored weight")
        owner, _, attribute = name.rpartition(".")
        weight = torch.nn.Parameter(stored[name], requires_grad=False)
        setattr(graph_module.get_submodule(owner) if owner else graph_module, attribute, weight)


def _computing_in_f32(graph_module: torch.fx.GraphModule) -> None:
    """After compression: dequantized weights in f32, and what NNCF left of the stored weights (norms,
    biases) as f32 copies, so the graph computes as the model does in f32."""
    for module in graph_module.modules():
        if isinstance(getattr(module, "result_dtype", None), torch.dtype):  # NNCF's weight decompressors
            module.result_dtype = torch.float32
        for name, parameter in list(module.named_parameters(recurse=False)):
            if parameter.is_floating_point() and parameter.dtype != torch.float32:
                setattr(module, name, torch.nn.Parameter(parameter.float(), requires_grad=False))


def lower_graph(
    exported: torch.export.ExportedProgram,
    decoder: Decoder,
    *,
    dynamic: bool = True,
    partitioner: OpenvinoPartitioner | None = None,
) -> ExecutorchProgramManager:
    """An ``export_graph`` result lowered by this backend, with the constant methods LLM runners read."""
    # The numerical check runs on a real prompt at position 0 (drawn positions could be negative).
    sample = example_inputs(decoder, 3 if dynamic else 1)
    given = partitioner is not None
    partitioner = partitioner or OpenvinoPartitioner(sample_inputs=sample, keep_whole=KEEP_WHOLE)
    with writing_inline():
        try:
            try:
                edge = lower_in_one_pass(exported, partitioner, metadata(decoder, dynamic))
            except CpuKernelError as error:
                if given or not partitioner.keep_whole:
                    raise
                # A check kept a linear out of OpenVINO, where ExecuTorch refuses it whole: decomposed, its
                # parts run on ExecuTorch's kernels. Lowered again, nothing kept whole, from the graph traced
                # again (lowering leaves its trace's symbols in the program's shape environment).
                logger.warning("%s: lowering again with %s decomposed (%s)", decoder.name, KEEP_WHOLE, error.why)
                partitioner = OpenvinoPartitioner(sample_inputs=sample)
                with torch.no_grad():
                    retraced = torch.export.export(
                        exported.module(), sample, dynamic_shapes=dynamic_shapes(decoder, dynamic)
                    )
                edge = lower_in_one_pass(retraced, partitioner, metadata(decoder, dynamic))
            check_ir(edge)
        except OpenvinoExportError:
            raise
        except SpecViolationError as error:  # an op outside ExecuTorch's IR (core ATen)
            raise UnsupportedDecoderError(f"{decoder.name}: ExecuTorch's IR refuses it ({_first(error)})") from error
        except Exception as error:  # ExecuTorch's edge dialect re-traces the graph, and may fail doing so
            raise UnsupportedDecoderError(f"{decoder.name}: ExecuTorch cannot lower it ({_first(error)})") from error
    report = partitioner.report
    logger.info(
        "%s: %d of %d ops in OpenVINO, %d buffer(s) kept as OpenVINO state",
        decoder.name,
        report.delegated_nodes,
        report.total_nodes,
        len(report.state_buffers),
    )
    return to_executorch(edge)


def lower_in_one_pass(
    exported: torch.export.ExportedProgram,
    partitioner: OpenvinoPartitioner,
    constant_methods: dict[str, object] | None = None,
) -> EdgeProgramManager:
    """``to_edge_transform_and_lower(exported, partitioner=[partitioner])``, with the graph decomposed
    once. ExecuTorch's runs the decomposition twice (once with an empty table, to functionalize the
    graph before it asks the partitioner what to keep whole; once with the table): each a trace of
    the whole graph, a ninth of a 0.5 B decoder's export. ``to_edge`` decomposes once, keeping whole
    what the partitioner asks (``preserve_ops``), and functionalizes in the same trace; the partitioner
    then sees the same edge program, and its pre-decomposition transforms run first, as there."""
    program = partitioner.transform_for_pre_decomposition(exported)
    kept, _ = partitioner.ops_to_not_decompose(program)
    config = EdgeCompileConfig(
        _check_ir_validity=False,
        _core_aten_ops_exception_list=[*_UNPACKING_OPS, *kept],
        preserve_ops=list(kept),
    )
    edge = to_edge(program, constant_methods=constant_methods, compile_config=config)
    return edge.to_backend(partitioner)


def check_ir(edge: EdgeProgramManager) -> None:
    """ExecuTorch's edge-dialect check (core ATen ops, dtypes its kernels take) on what lowering left
    to ExecuTorch's kernels. Lowering runs with it off: on, it judges every op of the whole graph at
    each of ExecuTorch's ten or so steps, ops OpenVINO takes included (a tenth of a 0.5 B decoder's
    export); what it must judge is what runs outside OpenVINO. Raises ``SpecViolationError``."""
    config = dataclasses.replace(edge.compile_config, _check_ir_validity=True)
    for method in edge.methods:
        EXIREdgeDialectVerifier(edge_compile_config=config, class_only=True)()(
            edge.exported_program(method).graph_module
        )


def _first(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300]}" if text else type(error).__name__


def compress_weights(
    graph_module: torch.fx.GraphModule,
    weights: Weights,
    calibration: Sequence[Sequence[int]],
    decoder: Decoder,
    *,
    ratio: float = 1.0,
    group_size: int = INT4_GROUP,
    symmetric: bool = False,
) -> torch.fx.GraphModule:
    """The exported graph with its linear and embedding weights compressed by NNCF (``export_decoder``
    says what the options mean)."""
    if not 0 < ratio <= 1:
        raise CompressionError(f"ratio {ratio}: the share of layers in 4 bits is in (0, 1]")
    if group_size < 1:
        raise CompressionError(f"group size {group_size}: expected a positive number of weights per scale")
    try:
        import nncf
    except ImportError as error:
        raise CompressionError("compressed weights need nncf: pip install 'openvino-backend[quantize]'") from error
    options: dict[str, object] = {}
    # 8-bit weights, alone or as the rest of a mix, keep a zero point unless asked not to: NNCF's and
    # optimum-cli's default, and ExecuTorch's openvino_8wo. Without it the CPU plugin's compressed matmul
    # skips a subtraction per weight (about 3% of SmolLM2-135M's decode step).
    eight_bits = nncf.CompressWeightsMode.INT8_SYM if symmetric else nncf.CompressWeightsMode.INT8_ASYM
    if weights == "int8":
        options["mode"] = eight_bits
    else:
        # A layer whose input width is no multiple of 128 (SmolLM2's 576) gets the largest power of
        # two that divides it, down to 32; below that it stays 8-bit. NNCF refuses the model otherwise.
        adjust = nncf.AdvancedCompressionParameters(group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST)
        options.update(
            mode=nncf.CompressWeightsMode.INT4_SYM,
            group_size=group_size,
            ratio=ratio,
            backup_mode=nncf.BackupMode(eight_bits.value),
            advanced_parameters=adjust,
        )
        if calibration:
            samples = [
                (torch.tensor([list(prompt)], dtype=torch.long), torch.tensor([0], dtype=torch.long))
                for prompt in calibration
            ]
            options.update(dataset=nncf.Dataset(samples), awq=True, scale_estimation=True, subset_size=len(samples))
    if calibration and weights != "int4":
        logger.warning("calibration prompts only serve 4-bit weights (AWQ, scale estimation): ignored")
    if (ratio, group_size) != (1.0, INT4_GROUP) and weights != "int4":
        logger.warning("ratio and group size only shape 4-bit weights: ignored for %s", weights)
    outside = [t for prompt in calibration for t in prompt if not 0 <= t < decoder.vocab_size]
    if outside:
        raise CompressionError(
            f"calibration token ids {outside[:5]} are outside the vocabulary of {decoder.vocab_size}"
        )
    # NNCF's errors that judge the model or the options, not NNCF itself.
    verdicts = (
        nncf.errors.ValidationError,
        nncf.errors.InvalidGroupSizeError,
        nncf.errors.UnsupportedModelError,
        nncf.errors.ParameterNotSupportedError,
    )
    try:
        with _decompressed_shapes_only():
            compressed = nncf.compress_weights(graph_module, **options)
    except verdicts as error:
        raise CompressionError(f"NNCF cannot compress {decoder.name} to {weights}: {error}") from error
    # Where that hook is missing (another NNCF), what NNCF recorded goes once it is done: nothing reads it.
    for node in compressed.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
            del node.meta["val"]
    return compressed
