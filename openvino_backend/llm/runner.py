"""ExecuTorch's own C++ LLM runner (``TextLLMRunner``, the code its apps embed) on an exported program.

The runner loads the ``.pte`` from its path and finds OpenVINO's C library by
``OPENVINO_LIB_PATH`` (its ``dlopen("libopenvino_c.so")`` finds nothing in a
pip install otherwise); ``openvino_c_library_path`` gives the installed one.

Its Python binding hands each new token's text to the callback as a ``str``,
made from the C++ ``std::string`` by ``PyUnicode_DecodeUTF8`` with no error
handler: strict UTF-8. A byte-level tokenizer's token can hold part of a
character (an emoji's or a CJK character's first bytes, its last byte alone),
and that decoding raised ``UnicodeDecodeError`` out of ``generate``, ending the
generation. Nothing else in the binding gives the bytes or the token ids, and
the text the C++ runner prints to stdout drops a token that is one byte outside
ASCII (``safe_printf``), which is the byte such characters end with. CPython
resolves a missing error handler through the codec registry's ``strict``,
though: while ``generate`` runs, ``strict`` is re-registered so that, on the
generating thread only, a UTF-8 decoding error keeps its bytes as
``surrogateescape`` does; each token's bytes come back exact and the text is
decoded from them, character by character.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from openvino_backend.blob_import import openvino_c_library_path
from openvino_backend.program import check_program_file

LIBRARY_VARIABLE = "OPENVINO_LIB_PATH"

logger = logging.getLogger(__name__)


def point_runtime_at_openvino() -> None:
    """Set ``OPENVINO_LIB_PATH`` to the installed OpenVINO unless the user set it."""
    if not os.environ.get(LIBRARY_VARIABLE) and (path := openvino_c_library_path()) is not None:
        os.environ[LIBRARY_VARIABLE] = path


class PartialCharacterError(RuntimeError):
    """The runner emitted a token holding part of a UTF-8 character, and this Python gave no way
    to keep its bytes (its strict decoding did not go through the codec registry)."""


@dataclass
class RunnerGeneration:
    """What one ``TextLLMRunner.generate`` produced: each new token's bytes and text, and its timing.

    ``token_bytes`` holds each token's bytes as the C++ tokenizer decoded them. ``pieces`` holds,
    per token, the characters that token completes: a token that is whole UTF-8 on its own is its
    text, one that holds only the start of a character is ``""`` and the token that ends it carries
    the character. Bytes that never form a character (invalid ones, or a character the generation
    stopped inside) become U+FFFD, as Hugging Face ``tokenizers`` decodes them; so ``text``, the
    pieces joined, is the bytes decoded at once.
    """

    pieces: list[str] = field(default_factory=list)
    token_bytes: list[bytes] = field(default_factory=list)
    prompt_tokens: int = 0
    prefill_ms: float = 0.0
    ms_per_token: float = 0.0

    @property
    def text(self) -> str:
        return "".join(self.pieces)


_STRICT = codecs.lookup_error("strict")
_SURROGATEESCAPE = codecs.lookup_error("surrogateescape")
_keeping = threading.local()  # .active: this thread is inside ExecutorchRunner.generate
_hook_lock = threading.Lock()
_hook_users = 0


def _strict_unless_generating(error: UnicodeError) -> tuple[str | bytes, int]:
    """``strict``, except for a UTF-8 decoding error on a thread inside ``generate`` (the
    binding's decoding of a token's text): there each byte that is no whole character becomes a
    lone surrogate, which ``encode("utf-8", "surrogateescape")`` turns back into that byte."""
    if getattr(_keeping, "active", False) and isinstance(error, UnicodeDecodeError) and error.encoding == "utf-8":
        return _SURROGATEESCAPE(error)
    return _STRICT(error)  # raises it, as strict does


@contextlib.contextmanager
def _token_bytes_kept() -> Iterator[bool]:
    """Inside, strict UTF-8 decoding on this thread keeps the bytes it cannot decode; on every
    other thread ``strict`` stays strict (it is one name for the whole process, so it is
    registered while some thread generates, and the original comes back after the last).
    Yields whether this Python honours it (CPython 3.6 to 3.13 do)."""
    global _hook_users
    with _hook_lock:
        if _hook_users == 0:
            codecs.register_error("strict", _strict_unless_generating)
        _hook_users += 1
    _keeping.active = True
    try:
        try:
            honoured = b"\x80".decode("utf-8") == "\udc80"  # decoded as the binding decodes: no handler named
        except UnicodeDecodeError:
            honoured = False
        yield honoured
    finally:
        _keeping.active = False
        with _hook_lock:
            _hook_users -= 1
            if _hook_users == 0:
                codecs.register_error("strict", _STRICT)


class ExecutorchRunner:
    """``TextLLMRunner`` over a program written by ``export-llm`` and its tokenizer."""

    def __init__(self, program: Path, tokenizer: Path) -> None:
        check_program_file(Path(program))
        point_runtime_at_openvino()
        from executorch.extension.llm.runner import TextLLMRunner

        self._runner = TextLLMRunner(str(program), str(tokenizer))

    def generate(self, prompt: str, max_new_tokens: int, *, bos: int = 1) -> RunnerGeneration:
        """Greedy generation from position 0 (the runner's cache is reset first)."""
        from executorch.extension.llm.runner import GenerationConfig

        run = RunnerGeneration()
        stats = []
        # errors="replace" ends an unfinished or invalid sequence as tokenizers' decode does (one
        # U+FFFD per maximal part), so the pieces join to the text all the ids decode to.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

        def on_token(piece: str) -> None:
            data = piece.encode("utf-8", "surrogateescape")
            run.token_bytes.append(data)
            run.pieces.append(decoder.decode(data))

        config = GenerationConfig(echo=False, max_new_tokens=max_new_tokens, temperature=0.0, num_bos=bos)
        self._runner.reset()
        with _token_bytes_kept() as kept:
            if not kept:
                logger.warning(
                    "this Python decodes strictly without the codec registry: a token holding part of "
                    "a character will end the generation"
                )
            try:
                self._runner.generate(prompt, config, token_callback=on_token, stats_callback=stats.append)
            except UnicodeDecodeError as error:
                raise PartialCharacterError(
                    f"ExecuTorch's TextLLMRunner emitted a token that holds part of a UTF-8 character "
                    f"({error.object[error.start : error.end]!r}), which its Python binding cannot pass on here"
                ) from error
        tail = decoder.decode(b"", final=True)
        if tail:  # the generation stopped inside a character
            run.pieces[-1] += tail
        if stats:
            s = stats[-1]
            run.prompt_tokens = s.num_prompt_tokens
            run.prefill_ms = float(s.prompt_eval_end_ms - s.inference_start_ms)
            if s.num_generated_tokens > 1:
                run.ms_per_token = (s.inference_end_ms - s.first_token_ms) / (s.num_generated_tokens - 1)
        return run
