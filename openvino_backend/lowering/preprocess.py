"""``OpenvinoBackend``: one partition in, an exported OpenVINO blob out.

The pipeline, one named step each::

    edge dim orders -> validate edge tensors -> passes -> convert -> validate output types
        -> adapt edge layouts -> validate pass-throughs -> make stateful -> grow caches
        -> compile -> validate compiled -> export (by OpenVINO's model cache, ``blob_export.py``)

The partitioner's checks have already converted (and the numerical check
compiled) each final partition the same way; preprocess takes that work over
under the handle the partitioner put in its compile specs, when the
partition it is given has the same nodes, inputs, outputs and constants
(``conversion_check.take_over``), and skips those steps. The checks run
on it all the same.

The class name must be exactly ``OpenvinoBackend``: the stock ExecuTorch
runtime finds its C++ half by that name.
"""

from __future__ import annotations

import copy
import logging
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import final

import openvino as ov
import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from openvino_backend.compile_spec import PARTITION_KEY, CompileOptions
from openvino_backend.diagnostics import NodeRef
from openvino_backend.graph import non_default_dim_order, output_nodes, user_input_nodes, user_output_nodes
from openvino_backend.lowering.blob_export import (
    CACHE_DIR,
    blob_directory,
    cache_holds_export,
    has_cached_blob,
    read_cached_blob,
    room_for_blob,
)
from openvino_backend.lowering.convert import conversion_error, convert
from openvino_backend.lowering.edge_layout import DimOrder, adapt_edge_layouts
from openvino_backend.lowering.guard import share_backend_name, upstream_preprocess
from openvino_backend.lowering.handover import release, take_over
from openvino_backend.lowering.model_passes.kv_cache import grow_caches
from openvino_backend.lowering.model_passes.kv_cache_writes import exact_writes
from openvino_backend.lowering.partition_model import compile_key
from openvino_backend.lowering.passes import prepare_for_frontend
from openvino_backend.lowering.state import drop_unread_state, graph_for_conversion, make_stateful, state_buffers
from openvino_backend.lowering.validate import (
    validate_compiled,
    validate_edge_tensors,
    validate_model,
    validate_output_types,
)
from openvino_backend.runtime import openvino_core
from openvino_backend.timing import stage, timed

logger = logging.getLogger(__name__)


@final
class OpenvinoBackend(BackendDetails):
    @classmethod
    def copy_exported_program_for_preprocess(
        cls, edge_program: ExportedProgram, compile_specs: list[CompileSpec]
    ) -> ExportedProgram:
        """The partition's program for ``preprocess``: its graph copied (the passes change it), its
        weights shared (nothing here writes one). ExecuTorch's default, a deep copy of each partition
        held until every partition is lowered, copied every weight once more: 1.9 GB for a 3 B int4
        decoder."""
        owned = (
            *edge_program.state_dict.values(),
            *edge_program.constants.values(),
            *edge_program.graph_module.parameters(),
            *edge_program.graph_module.buffers(),
        )
        memo: dict[int, object] = {id(t): t for t in owned if isinstance(t, torch.Tensor)}
        return copy.deepcopy(edge_program, memo)

    @classmethod
    @timed("preprocess")
    def preprocess(cls, edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        share_backend_name(cls, PARTITION_KEY)
        if (theirs := upstream_preprocess(compile_specs, PARTITION_KEY)) is not None:
            return theirs(edge_program, compile_specs)  # ExecuTorch's own partitioner's partition
        options = CompileOptions.from_specs(compile_specs)
        parent = blob_directory()
        place = tempfile.TemporaryDirectory(prefix="openvino_backend-blob-", dir=parent) if parent else nullcontext()
        with place as directory:
            cache = Path(directory) if directory is not None else None
            blob = cls._compile(edge_program, options, cache)
            # Nothing of the converted or compiled model is left: the blob is read beside neither.
            with stage("export"):
                return PreprocessResult(processed_bytes=blob if blob is not None else read_cached_blob(cache))

    @classmethod
    def _compile(cls, edge_program: ExportedProgram, options: CompileOptions, directory: Path | None) -> bytes | None:
        """Convert, check and compile the partition; its blob, or None where OpenVINO wrote it into
        a model cache in ``directory`` (``blob_export.py``)."""
        input_orders, output_orders = edge_dim_orders(edge_program)
        # On the program ExecuTorch gives, before any pass: this check trusts no earlier step.
        validate_edge_tensors(edge_program, partition=options.partition)
        # Buffers the partition owns and mutates become OpenVINO state (state.py): the checks
        # converted the partition with them as inputs and outputs, so their work is not taken over.
        states = state_buffers(edge_program)
        if states:
            release(options.handover)
        handed = take_over(options.handover, edge_program) if not states else None
        if handed is not None:  # converted (and adapted) exactly so by the partitioner's checks
            graph_module, model = handed.graph_module, handed.model
        else:
            program = run_passes(edge_program)
            graph_module = graph_for_conversion(program, states) if states else program.module()
            with stage("convert"):
                model = convert(graph_module, partition=options.partition)
        with stage("validate_output_types"):
            validate_output_types(model, graph_module, partition=options.partition)
        if handed is None and any(order is not None for order in (*input_orders, *output_orders)):
            readers, writers = edge_nodes(graph_module)
            kept = [None] * len(states)  # a variable never crosses the edge: no layout to adapt
            with stage("adapt_edge_layouts"):
                adapt_edge_layouts(
                    model,
                    [*input_orders, *kept],
                    [*output_orders, *kept],
                    partition=options.partition,
                    input_nodes=readers,
                    output_nodes=writers,
                )
        # After the layouts: an input copied to an output in another dim order is a real transpose.
        with stage("validate_model"):
            validate_model(model, graph_module, partition=options.partition)
        with stage("make_stateful"):
            make_stateful(model, states)
        if states:
            with stage("grow_caches"):
                grow_caches(model, exact_writes(graph_module))
            drop_unread_state(model)
        compiled = handed.compiled.get(compile_key(options.device, options.properties)) if handed else None
        cache = None
        if compiled is None:
            streamed = directory is not None and cache_holds_export(options.device, options.properties)
            cache = directory if streamed and room_for_blob(model, directory) else None
            compiled = compile_model(model, options, graph_module, cache)
        with stage("validate_compiled"):
            validate_compiled(compiled, graph_module, partition=options.partition)
        if cache is not None and has_cached_blob(cache):
            return None
        with stage("export"):
            return compiled.export_model().getvalue()


@timed("run_passes")
def run_passes(program: ExportedProgram) -> ExportedProgram:
    """Rewrite dim-order ops to aten and fix floor division, for the frontend."""
    program._graph_module = prepare_for_frontend(program.graph_module)
    return program


@timed("edge_dim_orders")
def edge_dim_orders(program: ExportedProgram) -> tuple[list[DimOrder | None], list[DimOrder | None]]:
    """The dim order of each partition input and output whose layout is not contiguous.

    Read from ``meta["val"]``, which is what ExecuTorch's tensor specs (and so
    the runtime's tensors) are made from. Lifted constants are not runtime
    inputs; they are skipped, as ``program.module()`` turns them into attributes.
    """
    inputs = [non_default_dim_order(node.meta.get("val")) for node in user_input_nodes(program)]
    return inputs, [
        non_default_dim_order(node.meta.get("val")) if isinstance(node, torch.fx.Node) else None
        for node in user_output_nodes(program)
    ]


def edge_nodes(graph_module: torch.fx.GraphModule) -> tuple[list[tuple[NodeRef, ...]], list[tuple[NodeRef, ...]]]:
    """For each partition input the nodes reading it, for each output the node making it."""
    readers = [
        tuple(NodeRef.from_node(user) for user in node.users)
        for node in graph_module.graph.find_nodes(op="placeholder")
    ]
    writers = [
        (NodeRef.from_node(node),) if isinstance(node, torch.fx.Node) else () for node in output_nodes(graph_module)
    ]
    return readers, writers


@timed("compile_model")
def compile_model(
    model: ov.Model, options: CompileOptions, graph_module: torch.fx.GraphModule, cache: Path | None = None
) -> ov.CompiledModel:
    """``model`` compiled; with ``cache``, OpenVINO also writes its blob there."""
    properties = options.properties if cache is None else {**options.properties, CACHE_DIR: str(cache)}
    try:
        return openvino_core().compile_model(model, options.device, properties)
    except RuntimeError as error:
        raise conversion_error(
            f"OpenVINO could not compile for {options.device}", graph_module, options.partition, error
        ) from error
