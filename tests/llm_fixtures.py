"""What the LLM tests build: a small Hugging Face Llama with a tokenizer ExecuTorch's C++ runner reads,
the decoder families of ``transformers`` at a small size, an OpenVINO that computes in f32, and weights
compressed as ExecuTorch's ``export_llama --pt2e_quantize openvino_4wo`` compresses them.

``python -m tests.llm_fixtures FAMILY DIRECTORY`` prints one JSON line: ``greedy``'s answer (run by
``tests/test_families.py`` in a child whose OpenVINO computes in f32).
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import json
import os
import shutil
import sys
from pathlib import Path

TEXT = "once upon a time the little robot liked the sea and read books about a boat"


def write_tokenizer(directory: Path, *, vocab_size: int | None = None) -> int:
    """``directory/tokenizer.json``: a byte-level BPE whose every token is ASCII (each token's text
    stands on its own, as ``TextLLMRunner`` hands it to its callback), trained on ``TEXT``; padded with
    added ASCII tokens up to ``vocab_size`` if given (every id a model of that vocabulary emits then
    has a text). Its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = [c for c in pre_tokenizers.ByteLevel.alphabet() if c.isascii() and c.isprintable()] + ["Ġ"]
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=alphabet, limit_alphabet=len(alphabet)
    )
    tokenizer.train_from_iterator([TEXT] * 20, trainer)
    if vocab_size is not None and vocab_size > tokenizer.get_vocab_size():
        tokenizer.add_tokens([f"<t{i}>" for i in range(tokenizer.get_vocab_size(), vocab_size)])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def write_tiny_llama(
    directory: Path, *, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2, context: int = 64
) -> Path:
    """A Hugging Face Llama directory (config and tokenizer; the recipe draws random weights)."""
    import transformers

    vocab_size = write_tokenizer(directory)
    transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab_size,
        max_position_embeddings=context,
        bos_token_id=1,
        eos_token_id=2,
    ).save_pretrained(directory)
    return directory


# OpenVINO computing f32 models in f32 on any CPU, for a child process. On a CPU with AVX512-BF16 or AMX
# the CPU plugin computes f32 models in bf16 unless told otherwise, and the ExecuTorch runtime imports
# blobs with no properties: the one setting that reaches it is a plugins.xml beside libopenvino.so
# (docs/precision.md). The child runs with a copy of the installed package first on its path.
PLUGINS_XML = """<ie>
    <plugins>
        <plugin name="CPU" location="libopenvino_intel_cpu_plugin.so">
            <properties>
                <property key="INFERENCE_PRECISION_HINT" value="f32"/>
            </properties>
        </plugin>
    </plugins>
</ie>
"""


def f32_environment(directory: Path) -> dict[str, str]:
    """The environment of a child process whose OpenVINO computes f32 models in f32, with a copy
    of the installed ``openvino`` package in ``directory`` (made once)."""
    spec = importlib.util.find_spec("openvino")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("openvino is not installed")
    package = directory / "openvino"
    if not (package / "libs" / "plugins.xml").exists():
        shutil.copytree(spec.submodule_search_locations[0], package, dirs_exist_ok=True)
        (package / "libs" / "plugins.xml").write_text(PLUGINS_XML)
    c_libraries = sorted((package / "libs").glob("libopenvino_c.so*"))
    if not c_libraries:
        raise RuntimeError(f"no libopenvino_c.so in {package / 'libs'}: the openvino package is incomplete")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(directory), *filter(None, [env.get("PYTHONPATH")])])
    # ExecuTorch's runtime dlopens the C library this names (its Python binding sets it once,
    # from the openvino package it finds, unless it is set already: as it is in a parent that ran it).
    env["OPENVINO_LIB_PATH"] = str(c_libraries[0])
    return env


# One small size for every family (2 layers, hidden 64); each config takes what it knows of it.
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    # mixtures of experts
    "num_local_experts": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
}
CONTEXT = 64
PROMPT = 6
STEPS = 6


def write_family(family: str, directory: Path) -> Path:
    """``family``'s config at the small size, saved (no weights: the recipe draws random ones)."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[family]
    # Only what the family's config takes (or names another way): a key it does not know would
    # become a stray attribute (GPT-2 has no key/value heads of its own, Falcon computes head_dim).
    known = set(inspect.signature(config_class.__init__).parameters) | set(getattr(config_class, "attribute_map", {}))
    config_class(**{key: value for key, value in SMALL.items() if key in known}).save_pretrained(directory)
    return directory


def follow_eager(family: str, directory: Path) -> float:
    """Export ``family``, run it from its file against eager (a prompt in one call, then decode calls
    fed eager's tokens); the worst relative logits error. Raises ``AssertionError`` out of tolerance."""
    import torch

    from openvino_backend.llm.export import export_decoder
    from openvino_backend.llm.generate import Generator
    from openvino_backend.llm.models import load_decoder
    from openvino_backend.program import write_program
    from openvino_backend.runtime import Tolerance

    decoder = load_decoder(write_family(family, directory), max_context=CONTEXT)
    eager = copy.deepcopy(decoder.module)
    program = directory / "program.pte"
    write_program(export_decoder(decoder), program)
    generator = Generator(program)  # from its file, as deployments load it
    tokens = list(range(3, 3 + PROMPT))
    position, worst = 0, 0.0
    for step in range(STEPS + 1):
        with torch.no_grad():
            want = eager(torch.tensor([tokens]), torch.tensor([position]))[-1]
        got = generator(tokens)
        scale = want.abs().max().item()
        tolerance = Tolerance.for_output(torch.float32, terms=SMALL["hidden_size"], scale=scale, ops=8)
        error = (got - want).abs().max().item()
        assert tolerance.check(got, want), f"step {step}: logits off by {error:.3g} (tolerance {tolerance})"
        worst = max(worst, error / max(scale, 1e-12))
        position += len(tokens)
        tokens = [int(want.argmax())]
    return worst


def greedy(family: str, directory: Path, new_tokens: int = 2 * STEPS) -> dict[str, object]:
    """Greedy tokens of ``family``'s program, run from its file, and of ``transformers``' own
    ``generate(do_sample=False)`` on the same weights and prompt; each stops at its end-of-sequence
    token or after ``new_tokens``. With OpenVINO in f32 (``f32_environment``) they must be equal."""
    import torch

    from openvino_backend.llm.export import export_decoder
    from openvino_backend.llm.generate import Generator
    from openvino_backend.llm.models import load_decoder
    from openvino_backend.program import write_program
    from openvino_backend.runtime import inference_precision

    decoder = load_decoder(write_family(family, directory), max_context=CONTEXT)
    model = copy.deepcopy(decoder.module.cached.model)  # before export: what eager runs is untouched by it
    prompt = list(range(3, 3 + PROMPT))
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)
    eager = out[0, len(prompt) :].tolist()
    program = directory / "program.pte"
    write_program(export_decoder(decoder), program)
    ours = Generator(program).generate(prompt, new_tokens).tokens  # from its file, as deployments load it
    return {"family": family, "ours": ours, "eager": eager, "precision": str(inference_precision("CPU"))}


if __name__ == "__main__":
    family, directory = sys.argv[1], Path(sys.argv[2])
    print(json.dumps(greedy(family, directory / family)))
