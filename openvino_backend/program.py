"""Writing a lowered program so that it runs where ExecuTorch programs run: loaded from a file.

OpenVINO's CPU plugin imports a compiled blob without copying its constants:
a constant an op reads as it is (a bias, an embedding table, a scale) keeps
pointing into the caller's buffer after ``ov_core_import_model`` returns. The
stock runtime frees a delegate's data right after ``init``
(``processed->Free()``), which is harmless only when that data is not a
buffer of its own:

- in a segment (ExecuTorch's default, ``extract_delegate_segments=True``) the
  loader unmaps it (a memory-mapped file: segfault at the first call) or frees
  it to the heap (``FileDataLoader``: OpenVINO reads whatever the heap puts
  there next, wrong values and no error);
- inline in the program's flatbuffer, the data lives exactly as long as the
  ``Program``, which every ``Method`` needs alive anyway.

So OpenVINO blobs must be written inline. ``to_executorch`` here does that;
``check_program`` tells a program written the other way before it runs.
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

from openvino_backend.diagnostics import OpenvinoExportError

logger = logging.getLogger(__name__)

BACKEND_ID = "OpenvinoBackend"

# A flatbuffer may not exceed 2 GiB; delegate data written inline counts against it.
FLATBUFFER_LIMIT = 2**31 - 1


@dataclass(eq=False)
class ProgramLayoutError(OpenvinoExportError):
    """A program whose OpenVINO blobs the stock runtime frees while OpenVINO still reads them."""

    delegates: tuple[int, ...] = ()


def backend_config(config: ExecutorchBackendConfig | None = None) -> ExecutorchBackendConfig:
    """``config`` (ExecuTorch's defaults if None) with delegate data kept inline."""
    return dataclasses.replace(config or ExecutorchBackendConfig(), extract_delegate_segments=False)


def to_executorch(edge: EdgeProgramManager, config: ExecutorchBackendConfig | None = None) -> ExecutorchProgramManager:
    """``edge.to_executorch(config)`` with OpenVINO blobs inline: a program that runs from a file."""
    from flatbuffers.builder import BuilderSizeError  # ExecuTorch's serializer's

    try:
        program = edge.to_executorch(backend_config(config))
        size = len(program.buffer)  # serialized here
    except BuilderSizeError:
        size = None  # the serializer stopped at its limit
    if size is None or size > FLATBUFFER_LIMIT:
        how_big = "" if size is None else f" ({size:,} bytes)"
        raise ProgramLayoutError(
            f"the program{how_big} is over the 2 GiB a flatbuffer can hold with its OpenVINO blobs inline",
            why="OpenVINO reads its constants from the blob after import, so the blob must live as long as the\n"
            "program, and only inline data does; inline data counts against the flatbuffer's 2 GiB",
            fix="compress the weights (export-llm --weights int8|int4) or split the model into smaller programs",
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
    """Once per process, outside ``writing_inline``: say how the program must be written."""
    global _warned
    if _warned or _WRITING_INLINE.get():
        return
    _warned = True
    logger.warning(
        "OpenVINO reads constants from its blob after the runtime has freed it when the blob sits in a "
        "segment, ExecuTorch's default: write this program with openvino_backend.to_executorch(edge), or "
        "edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=False)), or it crashes (or "
        "computes wrong values) when loaded from a file"
    )


def segmented_delegates(buffer: bytes) -> tuple[int, ...]:
    """Indices (in the first plan that has any) of the OpenVINO delegates whose blob is in a segment."""
    if len(buffer) < 8 or buffer[4:6] != b"ET":
        raise ValueError("not an ExecuTorch program (no 'ET' file identifier)")
    found: list[int] = []
    index = 0
    try:
        program = flatbuffers.table.Table(buffer, _root(buffer))
        for plan in _vector(program, 1):  # Program.execution_plan
            for delegate in _vector(plan, 7):  # ExecutionPlan.delegates
                if _string(delegate, 0) == BACKEND_ID:  # BackendDelegate.id
                    processed = _child(delegate, 1)  # BackendDelegate.processed
                    if processed is not None and _byte(processed, 0) == 1:  # location == SEGMENT
                        found.append(index)
                index += 1
    except (struct.error, IndexError, UnicodeDecodeError) as error:
        raise ValueError(f"not a complete ExecuTorch program ({len(buffer):,} bytes; {error})") from error
    return tuple(found)


def check_program(buffer: bytes, source: str = "the program") -> None:
    """Raise ``ProgramLayoutError`` if ``buffer`` holds an OpenVINO blob in a segment."""
    segmented = segmented_delegates(buffer)
    if segmented:
        raise ProgramLayoutError(
            f"{source} keeps {len(segmented)} OpenVINO blob(s) in segments the runtime frees after loading them",
            why="OpenVINO reads constants (biases, embedding tables) from the blob after import; ExecuTorch\n"
            "unmaps or frees a segment right after the delegate's init, so the program crashes when loaded\n"
            "from a file, or computes with whatever memory the heap reuses there",
            fix="write it again with openvino_backend.to_executorch(edge), or with\n"
            "edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=False))",
            delegates=segmented,
        )


def check_program_file(path: Path) -> None:
    """``check_program`` of the file at ``path``, mapped rather than read (an LLM's is gigabytes)."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        check_program(mapped, str(path))


def write_program(program: ExecutorchProgramManager | bytes, path: Path) -> int:
    """Write a program that runs from ``path`` (checked first); the number of bytes written."""
    buffer = program if isinstance(program, bytes) else program.buffer
    check_program(buffer, str(path))
    path.write_bytes(buffer)
    return len(buffer)


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
