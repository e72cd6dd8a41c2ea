"""The compiled blob, written by OpenVINO straight to a file and read back once the compiled model is gone.

``CompiledModel.export_model()`` builds the whole blob in memory while the compiled model, and the
converted model whose constants it shares, are alive: a Llama-3.2-3B int4 partition's preprocess held
the converted and compiled models (1.4 GB) and its 1.9 GB blob at once, on top of the program. OpenVINO's
model cache writes the same bytes to a file as it serializes them, after a header line. So preprocess
compiles with a cache directory of its own, lets the compiled model go, and reads the blob from the
file: the blob is never in memory beside the models.

That the cache file holds, after its header line, exactly what ``export_model`` returns is asked of the
installed OpenVINO (a small model compiled with the same device and properties both ways, once per
process), not assumed. Where it does not, where the disk has no room for the blob, or where the only
directories at hand are memory (a tmpfs), preprocess exports in memory as before.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from openvino_backend.runtime import openvino_core

logger = logging.getLogger(__name__)

CACHE_DIR = "CACHE_DIR"
# OpenVINO's cache header: one XML element on its own line, the blob right after it unless aligned.
_HEADER = re.compile(rb'^<\?xml [^\n]*<compiled_blob [^\n]*header_size_alignment="0"[^\n]*/>\n$')


def read_cached_blob(directory: Path) -> bytes:
    """The blob OpenVINO's cache wrote into ``directory``, without the cache's header line."""
    blobs = sorted(directory.glob("*.blob"))
    if len(blobs) != 1:
        raise RuntimeError(f"OpenVINO's cache in {directory} holds {len(blobs)} blobs, not one")
    # Unbuffered: a buffered reader would join what it read ahead with the rest, a second blob.
    with blobs[0].open("rb", buffering=0) as file:
        header = file.readline()
        if not _HEADER.match(header):
            raise RuntimeError(f"OpenVINO's cache header is not the one known here: {header[:120]!r}")
        return file.readall()


def has_cached_blob(directory: Path) -> bool:
    """True if OpenVINO's cache wrote one blob into ``directory`` (a compile it could not cache writes none)."""
    return len(list(directory.glob("*.blob"))) == 1


_ASKED: dict[tuple[str, tuple[tuple[str, str], ...]], bool] = {}


def cache_holds_export(device: str, properties: dict[str, object]) -> bool:
    """True if compiling for ``device`` with ``properties`` and a cache directory leaves there, after
    the cache's header line, exactly the bytes ``export_model`` gives for the compiled model."""
    if CACHE_DIR in properties:  # the caller's own cache: not ours to read or to redirect
        return False
    key = (device, tuple(sorted((name, str(value)) for name, value in properties.items())))
    if key not in _ASKED:
        _ASKED[key] = _ask(device, properties)
    return _ASKED[key]


def _ask(device: str, properties: dict[str, object]) -> bool:
    x = ops.parameter([-1, 16], np.float32, name="x")
    weight = np.random.default_rng(0).uniform(-1, 1, (8, 16)).astype(np.float32)
    model = ov.Model([ops.matmul(x, ops.constant(weight), False, True)], [x], "blob_export_probe")
    with tempfile.TemporaryDirectory(prefix="openvino_backend-probe-") as directory:
        try:
            compiled = openvino_core().compile_model(model, device, {**properties, CACHE_DIR: directory})
            holds = read_cached_blob(Path(directory)) == compiled.export_model().getvalue()
        except RuntimeError as error:
            logger.info("OpenVINO's model cache gives no blob here (%s): export_model it is", error)
            return False
    logger.info("OpenVINO's model cache %s export_model's blob", "holds" if holds else "does not hold")
    return holds


# File systems whose files are memory: a blob written there costs what it would in the process.
_IN_MEMORY = frozenset({"tmpfs", "ramfs"})


def blob_directory() -> Path | None:
    """Where preprocess has OpenVINO write blobs: the system's temporary directory, or the user's
    cache directory where that one is memory (a tmpfs ``/tmp``); None where both are."""
    candidates = [Path(tempfile.gettempdir()), Path.home() / ".cache" / "openvino_backend"]
    for candidate in candidates:
        try:
            candidate.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if _file_system(candidate) not in _IN_MEMORY:
            return candidate
    logger.info("no directory on disk for blobs (%s): exported in memory", ", ".join(map(str, candidates)))
    return None


def _file_system(path: Path) -> str | None:
    """The type of the file system ``path`` is on (Linux's mount table), None where unknown."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    resolved, best, kind = path.resolve(), -1, None
    for line in mounts:
        fields = line.split()
        if len(fields) >= 3 and resolved.is_relative_to(fields[1]) and len(fields[1]) > best:
            best, kind = len(fields[1]), fields[2]
    return kind


def room_for_blob(model: ov.Model, directory: Path) -> bool:
    """True if ``directory``'s disk has room for ``model``'s blob (its constants, twice over)."""
    constants = sum(op.get_byte_size() for op in model.get_ordered_ops() if op.get_type_name() == "Constant")
    free = shutil.disk_usage(directory).free
    if free < 2 * constants + (64 << 20):
        logger.info(
            "%.2f GB free in %s for a blob of about %.2f GB: exported in memory", free / 1e9, directory, constants / 1e9
        )
        return False
    return True
