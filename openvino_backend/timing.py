"""Where lowering spends its time, for tools that ask (``python -m bench``).

Stages of the pipeline are marked with ``timed``; inside ``recording()`` the
seconds each stage takes add up under its name, and outside it a marked call
costs one context-variable read. A generator stage (the partitioner's rules)
is timed while it produces items, not while its caller consumes them.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

F = TypeVar("F", bound=Callable)

_totals: ContextVar[dict[str, float] | None] = ContextVar("openvino_backend_timing", default=None)


@contextmanager
def recording() -> Iterator[dict[str, float]]:
    """Seconds per stage, for the calls made inside the ``with`` block."""
    totals: dict[str, float] = defaultdict(float)
    token = _totals.set(totals)
    try:
        yield totals
    finally:
        _totals.reset(token)


def timed(name: str) -> Callable[[F], F]:
    """Mark a function as the stage ``name``."""

    def mark(fn: F) -> F:
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def generator(*args, **kwargs):
                items = fn(*args, **kwargs)
                while True:
                    totals, start = _totals.get(), time.perf_counter()
                    try:
                        item = next(items)
                    except StopIteration:
                        return
                    finally:
                        if totals is not None:
                            totals[name] += time.perf_counter() - start
                    yield item

            return generator  # type: ignore[return-value]

        @functools.wraps(fn)
        def call(*args, **kwargs):
            totals = _totals.get()
            if totals is None:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] += time.perf_counter() - start

        return call  # type: ignore[return-value]

    return mark


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the ``with`` block as the stage ``name`` (a step inside a longer function)."""
    totals = _totals.get()
    if totals is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        totals[name] += time.perf_counter() - start
