"""Writing a lowered program so that it runs where ExecuTorch programs run: loaded from a file.

The stock runtime hands each OpenVINO blob to ``ov_core_import_model`` and frees
it right after the delegate's ``init`` when it sits in a segment (ExecuTorch's
default, ``extract_delegate_segments=True``): the loader unmaps it, or frees it to
the heap. Whether that is safe depends on the OpenVINO doing the import, and
``blob_import.import_copies_blob`` asks the installed one:

- its import copies what the compiled model reads (OpenVINO 2025.4): segments
  are fine, ``to_executorch`` keeps ExecuTorch's layout, and a program has no
  size limit but ExecuTorch's (64-bit segment offsets);
- it keeps reading constants (a bias, an embedding table) from the caller's
  buffer (OpenVINO 2026.4): a freed segment crashes at the first call, or,
  reused by the heap, computes wrong values with no error. Blobs are then
  written inline, where they live as long as the ``Program``, and a program
  must fit the flatbuffer's 2 GiB.

A blob is bound to the OpenVINO that wrote it: the partitioner records its
version in each delegate's compile specs, and ``check_program`` refuses a
program from another version, or with a blob in a segment that the installed
OpenVINO would read after it is freed, before it runs.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import flatbuffers
from executorch.exir import EdgeProgramManager, ExecutorchBackendConfig, ExecutorchProgramManager

from openvino_backend.blob_import import import_copies_blob
from openvino_backend.compile_spec import VERSION_KEY
from openvino_backend.diagnostics import OpenvinoExportError
from openvino_backend.runtime import openvino_version

logger = logging.getLogger(__name__)

BACKEND_ID = "OpenvinoBackend"

# A flatbuffer may not exceed 2 GiB; delegate data written inline counts against it.
FLATBUFFER_LIMIT = 2**31 - 1


@dataclass(eq=False)
class ProgramLayoutError(OpenvinoExportError):
    """A program whose OpenVINO blobs the stock runtime frees while OpenVINO still reads them."""

    delegates: tuple[int, ...] = ()


@dataclass(eq=False)
class BlobVersionError(OpenvinoExportError):
    """A program whose OpenVINO blobs were written by another OpenVINO than the one installed."""

    written_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class DelegateBlob:
    """One OpenVINO delegate of a program: its index among the program's delegates, where its blob
    sits, and the OpenVINO version that wrote it (None for writers that do not record it)."""

    index: int
    in_segment: bool
    openvino_version: str | None


def blobs_must_be_inline() -> bool:
    """True where the installed OpenVINO reads a blob after importing it (see the module docstring)."""
    return not import_copies_blob()


def to_executorch(edge: EdgeProgramManager, config: ExecutorchBackendConfig | None = None) -> ExecutorchProgramManager:
    """``edge.to_executorch(config)``, its OpenVINO blobs laid out so the program runs from a file."""
    if not blobs_must_be_inline():
        return edge.to_executorch(config)
    from flatbuffers.builder import BuilderSizeError  # ExecuTorch's serializer's

    try:
        inline = dataclasses.replace(config or ExecutorchBackendConfig(), extract_delegate_segments=False)
        program = edge.to_executorch(inline)
        size = len(program.buffer)  # serialized here
    except BuilderSizeError:
        size = None  # the serializer stopped at its limit
    if size is None or size > FLATBUFFER_LIMIT:
        how_big = "" if size is None else f" ({size:,} bytes)"
        raise ProgramLayoutError(
            f"the program{how_big} is over the 2 GiB a flatbuffer can hold with its OpenVINO blobs inline",
            why=f"OpenVINO {openvino_version()} reads its constants from the blob after import, so the blob must\n"
            "live as long as the program, and only inline data does; inline data counts against the\n"
            "flatbuffer's 2 GiB",
            fix="use OpenVINO 2025.4 (its import copies the blob: segments, no 2 GiB limit), compress the\n"
            "weights (export-llm --weights int8|int4), or split the model into smaller programs",
        )
    return program


_WRITING_INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("openvino_writing_inline", default=False)
_warned = False


@contextlib.contextmanager
def writing_inline() -> Iterator[None]:
    """Lowering inside this block is written by ``to_executorch`` here: no layout warning."""
    token = _WRITING_INLINE.set(True)
    try:
        yield
    finally:
        _WRITING_INLINE.reset(token)


def warn_about_layout() -> None:
    """Once per process, outside ``writing_inline``, where blobs must be inline: say how to write them."""
    global _warned
    if _warned or _WRITING_INLINE.get() or not blobs_must_be_inline():
        return
    _warned = True
    logger.warning(
        "OpenVINO %s reads constants from its blob after the runtime has freed it when the blob sits in a "
        "segment, ExecuTorch's default: write this program with openvino_backend.to_executorch(edge), or "
        "edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=False)), or it crashes (or "
        "computes wrong values) when loaded from a file",
        openvino_version(),
    )


def delegate_blobs(buffer: bytes) -> tuple[DelegateBlob, ...]:
    """The OpenVINO delegates of a serialized program (every execution plan's, in order)."""
    if len(buffer) < 8 or buffer[4:6] != b"ET":
        raise ValueError("not an ExecuTorch program (no 'ET' file identifier)")
    found: list[DelegateBlob] = []
    index = 0
    try:
        program = flatbuffers.table.Table(buffer, _root(buffer))
        for plan in _vector(program, 1):  # Program.execution_plan
            for delegate in _vector(plan, 7):  # ExecutionPlan.delegates
                if _string(delegate, 0) == BACKEND_ID:  # BackendDelegate.id
                    processed = _child(delegate, 1)  # BackendDelegate.processed
                    specs = {_string(s, 0): _bytes(s, 1) for s in _vector(delegate, 2)}  # .compile_specs
                    version = specs.get(VERSION_KEY)
                    found.append(
                        DelegateBlob(
                            index=index,
                            in_segment=processed is not None and _byte(processed, 0) == 1,  # location == SEGMENT
                            openvino_version=version.decode() if version is not None else None,
                        )
                    )
                index += 1
    except (struct.error, IndexError, UnicodeDecodeError) as error:
        raise ValueError(f"not a complete ExecuTorch program ({len(buffer):,} bytes; {error})") from error
    return tuple(found)


def segmented_delegates(buffer: bytes) -> tuple[int, ...]:
    """Indices of the OpenVINO delegates whose blob is in a segment."""
    return tuple(blob.index for blob in delegate_blobs(buffer) if blob.in_segment)


def check_program(buffer: bytes, source: str = "the program") -> None:
    """Raise if ``buffer`` cannot run on the installed OpenVINO: blobs another version wrote
    (``BlobVersionError``), or blobs in segments it would read after the runtime frees them
    (``ProgramLayoutError``)."""
    blobs = delegate_blobs(buffer)
    installed = openvino_version()
    others = sorted({b.openvino_version for b in blobs if b.openvino_version not in (None, installed)})
    if others:
        raise BlobVersionError(
            f"{source} holds OpenVINO blobs written by OpenVINO {', '.join(others)}; this is OpenVINO {installed}",
            why="a compiled OpenVINO blob is bound to the OpenVINO version that exported it: another version\n"
            "refuses it at import, or reads it differently",
            fix=f'run it with the OpenVINO that wrote it (pip install "openvino=={others[0]}"), or export it\n'
            f"again with OpenVINO {installed}",
            written_by=tuple(others),
        )
    segmented = tuple(b.index for b in blobs if b.in_segment)
    if segmented and blobs_must_be_inline():
        raise ProgramLayoutError(
            f"{source} keeps {len(segmented)} OpenVINO blob(s) in segments the runtime frees after loading them",
            why=f"OpenVINO {installed} reads constants (biases, embedding tables) from the blob after import;\n"
            "ExecuTorch unmaps or frees a segment right after the delegate's init, so the program crashes when\n"
            "loaded from a file, or computes with whatever memory the heap reuses there",
            fix="write it again with openvino_backend.to_executorch(edge), or with\n"
            "edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=False)); or run it with\n"
            "OpenVINO 2025.4, whose import copies the blob",
            delegates=segmented,
        )


def check_program_file(path: Path) -> None:
    """``check_program`` of the file at ``path``, mapped rather than read (an LLM's is gigabytes)."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        check_program(mapped, str(path))


def write_program(program: ExecutorchProgramManager | bytes, path: Path) -> int:
    """Write a program that runs from ``path`` (checked first); the number of bytes written."""
    if isinstance(program, bytes):
        check_program(program, str(path))
        path.write_bytes(program)
        return len(program)
    with open(path, "wb") as file:
        program.write_to_file(file)  # without joining a large program's segments into one buffer first
    try:
        check_program_file(path)
    except (OpenvinoExportError, ValueError):
        path.unlink()
        raise
    return path.stat().st_size


# A minimal reader of the .pte flatbuffer: just the fields above (schema: exir/_serialize/program.fbs).


def _root(buffer: bytes) -> int:
    return flatbuffers.encode.Get(flatbuffers.packer.uoffset, buffer, 0)


def _field(table: flatbuffers.table.Table, slot: int) -> int:
    return table.Offset(4 + 2 * slot)


def _vector(table: flatbuffers.table.Table, slot: int) -> list[flatbuffers.table.Table]:
    offset = _field(table, slot)
    if not offset:
        return []
    start = table.Vector(offset)
    return [flatbuffers.table.Table(table.Bytes, table.Indirect(start + 4 * i)) for i in range(table.VectorLen(offset))]


def _child(table: flatbuffers.table.Table, slot: int) -> flatbuffers.table.Table | None:
    offset = _field(table, slot)
    return flatbuffers.table.Table(table.Bytes, table.Indirect(table.Pos + offset)) if offset else None


def _string(table: flatbuffers.table.Table, slot: int) -> str | None:
    offset = _field(table, slot)
    return table.String(table.Pos + offset).decode() if offset else None


def _byte(table: flatbuffers.table.Table, slot: int) -> int:
    offset = _field(table, slot)
    return table.Get(flatbuffers.number_types.Int8Flags, table.Pos + offset) if offset else 0


def _bytes(table: flatbuffers.table.Table, slot: int) -> bytes | None:
    offset = _field(table, slot)
    if not offset:
        return None
    start = table.Vector(offset)
    return bytes(table.Bytes[start : start + table.VectorLen(offset)])
