"""Refuse to run beside ExecuTorch's own OpenVINO backend.

ExecuTorch finds a backend's ahead-of-time half by class name among
``BackendDetails.__subclasses__()``, and its two look-ups disagree when two
classes share a name (one takes the first, the other the last). With
``executorch.backends.openvino`` imported too, our preprocess could be
silently replaced by the upstream one, which returns stale memory for copies
of inputs. So this is an error, never a fallback.
"""

from __future__ import annotations

from executorch.exir.backend.backend_details import BackendDetails

from openvino_backend.diagnostics import BackendConflictError

BACKEND_NAME = "OpenvinoBackend"


def ensure_sole_backend(ours: type[BackendDetails]) -> None:
    """Raise ``BackendConflictError`` if another ``OpenvinoBackend`` class is loaded."""
    others = [cls for cls in BackendDetails.__subclasses__() if cls.__name__ == BACKEND_NAME and cls is not ours]
    if not others:
        return
    where = ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls in others)
    raise BackendConflictError(
        summary=f"another BackendDetails class named {BACKEND_NAME} is loaded: {where}",
        why=(
            "ExecuTorch looks a backend up by class name and its look-ups disagree when two\n"
            "classes share one, so either preprocess may run; the other one returns stale\n"
            "memory for partitions that output a copy of an input."
        ),
        fix=(
            "keep executorch.backends.openvino out of the process that uses openvino_backend\n"
            "(run it in a separate process if you need to compare the two)."
        ),
    )
