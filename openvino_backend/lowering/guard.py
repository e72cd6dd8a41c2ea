"""Share the name ``OpenvinoBackend`` with ExecuTorch's own OpenVINO backend, safely.

ExecuTorch finds a backend's ahead-of-time half by class name among
``BackendDetails.__subclasses__()``, and its two look-ups disagree when two
classes share a name (one takes the first, the other the last). Importing
``executorch.backends.openvino`` (its ``OpenVINOQuantizer`` does) defines a
second ``OpenvinoBackend``, so either preprocess may be handed either
backend's partitions.

With that class loaded, both preprocesses route by the partitioner that made
the partition: this package's partitioner marks its compile specs
(``marker``), so a marked partition is lowered by this package's preprocess
whichever class ExecuTorch picked, and an unmarked one by ExecuTorch's. The
user's partitioner decides. Any other class of that name is unknown ground:
an error, never a fallback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from openvino_backend.diagnostics import BackendConflictError

logger = logging.getLogger(__name__)

BACKEND_NAME = "OpenvinoBackend"
UPSTREAM_MODULE = "executorch.backends.openvino.preprocess"

Preprocess = Callable[[ExportedProgram, list[CompileSpec]], PreprocessResult]
# ExecuTorch's own preprocess, once this module has routed its class.
_upstream: dict[str, Preprocess] = {}


def share_backend_name(ours: type[BackendDetails], marker: str) -> None:
    """Route ExecuTorch's ``OpenvinoBackend`` by ``marker``; raise ``BackendConflictError`` for any
    other class of that name."""
    others = [cls for cls in BackendDetails.__subclasses__() if cls.__name__ == BACKEND_NAME and cls is not ours]
    unknown = [cls for cls in others if cls.__module__ != UPSTREAM_MODULE]
    if unknown:
        where = ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls in unknown)
        raise BackendConflictError(
            summary=f"another BackendDetails class named {BACKEND_NAME} is loaded: {where}",
            why=(
                "ExecuTorch looks a backend up by class name and its look-ups disagree when two\n"
                "classes share one, so either preprocess may run on this backend's partitions."
            ),
            fix=(
                "keep that module out of the process that uses openvino_backend (ExecuTorch's own\n"
                f"{UPSTREAM_MODULE} is the one class this backend can share the name with)."
            ),
        )
    for upstream in others:
        _route(upstream, ours, marker)


def upstream_preprocess(specs: Sequence[CompileSpec], marker: str) -> Preprocess | None:
    """ExecuTorch's preprocess when it is loaded and ``specs`` are not this package's partitioner's."""
    if any(spec.key == marker for spec in specs):
        return None
    return _upstream.get(BACKEND_NAME)


def _route(upstream: type[BackendDetails], ours: type[BackendDetails], marker: str) -> None:
    if BACKEND_NAME in _upstream:
        return
    original = upstream.preprocess

    def preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        if any(spec.key == marker for spec in compile_specs):
            return ours.preprocess(edge_program, compile_specs)
        return original(edge_program, compile_specs)

    _upstream[BACKEND_NAME] = original
    upstream.preprocess = staticmethod(preprocess)
    logger.info(
        "%s.%s is loaded too: each partition is lowered by the preprocess of the partitioner that made it",
        upstream.__module__,
        upstream.__qualname__,
    )
