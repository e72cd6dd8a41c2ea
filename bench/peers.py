"""``python -m bench --peers``: this backend against the alternatives on real architectures.

For each model of the zoo below (``transformers`` architectures built from
their configurations, random weights, nothing downloaded), in a process of
its own: median milliseconds per call of the same exported program

* lowered by this backend, through ``executorch.runtime``;
* lowered by ExecuTorch's XNNPACK backend, through ``executorch.runtime``;
* in OpenVINO alone: ``openvino.convert_model`` of the exported program
  (decomposed to core ATen where the frontend takes only that), compiled
  with no properties (as the ExecuTorch runtime compiles a blob), inputs
  and outputs bound once, then ``infer()``;

in f32 and, where both backends take it, INT8 (PT2E with ExecuTorch's
``XNNPACKQuantizer``; OpenVINO alone converts the same quantization with
its weights left as quantize / dequantize pairs, since its frontend passes
stored int8 weights through undequantized). The three run interleaved
(A B C A B C ...), and each result's max error (relative to its output's
largest magnitude) against eager (the quantized eager model for INT8) sits
beside its time.

``python -m bench.peers MODEL`` measures one model and prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from bench import answer_stream

REPS = 5
TARGET_SECONDS = 0.25  # per measurement: enough calls that the timer's resolution does not matter
MODEL_TIMEOUT = 900
CALIBRATION_DRAWS = 4


@dataclass(frozen=True)
class PeerModel:
    name: str
    build: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]


class _Output(torch.nn.Module):
    """A Hugging Face model returning one tensor: its logits, or its last hidden state."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(*inputs)
        for key in ("logits", "last_hidden_state"):
            if getattr(out, key, None) is not None:
                return getattr(out, key)
        return out[0]


def _hf(model_class: str, config_class: str, inputs: Callable[[torch.Generator], tuple], **config) -> Callable:
    def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        import transformers

        torch.manual_seed(0)
        if model_class.endswith("ForImageClassification"):
            config.setdefault("num_labels", 1000)  # ImageNet's head, as the published models have
        configuration = getattr(transformers, config_class)(**config)
        model = getattr(transformers, model_class)(configuration)
        draw = inputs(torch.Generator().manual_seed(0))
        return _settled(_Output(model), inputs), draw

    return build


def _settled(module: torch.nn.Module, draw: Callable[[torch.Generator], tuple]) -> torch.nn.Module:
    """``module`` in eval mode, its batch norms' statistics measured on random inputs as training
    would have: with the identity statistics of a fresh model, random weights shrink the signal
    layer by layer to nothing (and to denormal floats, which time differently)."""
    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None  # a plain average over the draws
        module.train()
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for _ in range(3):  # batches of 4: a norm after pooling sees more than one value
                module(*(torch.cat(xs) for xs in zip(*(draw(generator) for _ in range(4)), strict=True)))
    return module.eval()


def _image(size: int = 224) -> Callable[[torch.Generator], tuple]:
    return lambda g: (torch.randn(1, 3, size, size, generator=g),)


def _ids(length: int, vocab: int) -> Callable[[torch.Generator], tuple]:
    return lambda g: (torch.randint(0, vocab, (1, length), generator=g),)


def _whisper_encoder() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    torch.manual_seed(0)
    config = transformers.WhisperConfig(
        d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536, num_mel_bins=80
    )
    encoder = transformers.WhisperModel(config).eval().get_encoder()
    return _Output(encoder).eval(), (torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(0)),)


_TEXT = {"use_cache": False}
PEERS: dict[str, PeerModel] = {
    m.name: m
    for m in (
        PeerModel("mobilenet_v2", _hf("MobileNetV2ForImageClassification", "MobileNetV2Config", _image())),
        PeerModel("mobilenet_v1", _hf("MobileNetV1ForImageClassification", "MobileNetV1Config", _image())),
        PeerModel(
            "efficientnet_b0",
            _hf(
                "EfficientNetForImageClassification",
                "EfficientNetConfig",
                _image(),
                width_coefficient=1.0,
                depth_coefficient=1.0,
                hidden_dim=1280,
                image_size=224,
            ),
        ),
        PeerModel(
            "resnet18",
            _hf(
                "ResNetForImageClassification",
                "ResNetConfig",
                _image(),
                layer_type="basic",
                depths=[2, 2, 2, 2],
                hidden_sizes=[64, 128, 256, 512],
            ),
        ),
        PeerModel("resnet50", _hf("ResNetForImageClassification", "ResNetConfig", _image())),
        PeerModel(
            "convnext_atto",
            _hf(
                "ConvNextForImageClassification",
                "ConvNextConfig",
                _image(),
                depths=[2, 2, 6, 2],
                hidden_sizes=[40, 80, 160, 320],
            ),
        ),
        PeerModel(
            "regnet_y_400mf",
            _hf(
                "RegNetForImageClassification",
                "RegNetConfig",
                _image(),
                depths=[1, 3, 6, 6],
                hidden_sizes=[48, 104, 208, 440],
                groups_width=8,
                layer_type="y",
            ),
        ),
        PeerModel(
            "mobilevit_xxs",
            _hf(
                "MobileViTForImageClassification",
                "MobileViTConfig",
                _image(256),
                hidden_sizes=[64, 80, 96],
                neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320],
                expand_ratio=2.0,
            ),
        ),
        PeerModel("levit_128s", _hf("LevitForImageClassification", "LevitConfig", _image())),
        PeerModel(
            "deit_tiny",
            _hf(
                "DeiTForImageClassification",
                "DeiTConfig",
                _image(),
                hidden_size=192,
                num_attention_heads=3,
                intermediate_size=768,
            ),
        ),
        PeerModel(
            "vit_small",
            _hf(
                "ViTForImageClassification",
                "ViTConfig",
                _image(),
                hidden_size=384,
                num_attention_heads=6,
                intermediate_size=1536,
            ),
        ),
        PeerModel(
            "dinov2_small",
            _hf(
                "Dinov2Model",
                "Dinov2Config",
                _image(),
                hidden_size=384,
                num_attention_heads=6,
                image_size=224,
            ),
        ),
        PeerModel("swin_tiny", _hf("SwinForImageClassification", "SwinConfig", _image())),
        PeerModel("segformer_b0", _hf("SegformerForSemanticSegmentation", "SegformerConfig", _image(256))),
        PeerModel("whisper_tiny_encoder", _whisper_encoder),
        PeerModel(
            "gpt2_tiny",
            _hf("GPT2LMHeadModel", "GPT2Config", _ids(32, 1000), n_layer=2, n_embd=128, n_head=2, vocab_size=1000),
        ),
        PeerModel(
            "bert_tiny",
            _hf(
                "BertModel",
                "BertConfig",
                _ids(64, 30522),
                hidden_size=128,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=512,
            ),
        ),
        PeerModel("distilbert", _hf("DistilBertModel", "DistilBertConfig", _ids(128, 30522))),
        PeerModel("t5_small_encoder", _hf("T5EncoderModel", "T5Config", _ids(64, 32128), **_TEXT)),
        PeerModel(
            "qwen2_tiny",
            _hf(
                "Qwen2ForCausalLM",
                "Qwen2Config",
                _ids(64, 2048),
                hidden_size=256,
                intermediate_size=688,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=2048,
                **_TEXT,
            ),
        ),
        PeerModel(
            "wav2vec2_small",
            _hf(
                "Wav2Vec2Model",
                "Wav2Vec2Config",
                lambda g: (torch.randn(1, 16000, generator=g),),
                num_hidden_layers=4,
            ),
        ),
    )
}
QUICK = ("mobilenet_v2", "bert_tiny")


def _max_error(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> float:
    """The largest error relative to the largest magnitude of its output."""
    if len(actual) != len(expected):
        return float("inf")
    return max(
        ((a.double() - e.double()).abs().max() / e.double().abs().max().clamp_min(1e-30)).item()
        for a, e in zip(actual, expected, strict=True)
    )


class _OpenvinoAlone:
    """``convert_model`` of the exported program, bound like the ExecuTorch runtime binds a blob."""

    def __init__(self, exported: torch.export.ExportedProgram, inputs: tuple, expected: list[torch.Tensor]) -> None:
        import numpy as np
        import openvino as ov

        try:
            converted = ov.convert_model(exported)
        except Exception:  # the frontend takes some programs only in core ATen (a quantized linear)
            converted = ov.convert_model(exported.run_decompositions())
        compiled = ov.Core().compile_model(converted, "CPU")
        self.request = compiled.create_infer_request()
        self.outputs = [np.zeros(tuple(e.shape), dtype=e.numpy().dtype) for e in expected]
        for index, x in enumerate(inputs):
            self.request.set_input_tensor(index, ov.Tensor(x.numpy().copy(), shared_memory=False))
        for index, array in enumerate(self.outputs):
            self.request.set_output_tensor(index, ov.Tensor(array, shared_memory=True))

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        self.request.infer()
        return [torch.from_numpy(a.copy()) for a in self.outputs]


def _runners(
    exported: torch.export.ExportedProgram,
    inputs: tuple,
    expected: list,
    for_openvino: torch.export.ExportedProgram | None = None,
) -> tuple[dict, dict]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from openvino_backend.partition.partitioner import OpenvinoPartitioner
    from openvino_backend.tools.verify import LoadedMethod, lower_exported

    runners: dict[str, Callable] = {}
    errors: dict[str, str] = {}
    makers = {
        "ours": lambda: LoadedMethod(lower_exported(exported, partitioner=OpenvinoPartitioner()).buffer),
        "xnnpack": lambda: LoadedMethod(lower_exported(exported, partitioner=XnnpackPartitioner()).buffer),
        "openvino": lambda: _OpenvinoAlone(for_openvino or exported, inputs, expected),
    }
    for name, make in makers.items():
        try:
            runners[name] = make()
        except Exception as error:  # a backend refusing a model is a result, not the bench's failure
            errors[name] = _why(error)
    return runners, errors


def _why(error: Exception) -> str:
    from openvino_backend.lowering.convert import failed_op_names

    ops = failed_op_names(str(error))
    if ops:
        return f"no conversion for {', '.join(ops)}"
    lines = [line for line in str(error).splitlines() if line.strip()]
    # OpenVINO's run-time errors open with where they were raised and end with what went wrong.
    line = lines[-1] if lines and lines[0].startswith("Exception from") else lines[0] if lines else ""
    return f"{type(error).__name__}: {line[:80]}"


def _measure(runners: dict[str, Callable], inputs: list[torch.Tensor], expected: list) -> dict[str, dict]:
    results: dict[str, dict] = {}
    iterations: dict[str, int] = {}
    for name, run in list(runners.items()):
        try:
            error = _max_error(run(inputs), expected)
        except Exception as failure:  # a program that lowers but cannot run is a result too
            results[name] = {"failed": f"at run time: {_why(failure)}"}
            del runners[name]
            continue
        start = time.perf_counter()
        run(inputs)
        first = time.perf_counter() - start
        iterations[name] = max(3, int(TARGET_SECONDS / max(first, 1e-6)))
        results[name] = {"error": error, "ms": []}
    for _ in range(REPS):  # interleaved: ours, xnnpack, openvino, ours, ...
        for name, run in runners.items():
            start = time.perf_counter()
            for _ in range(iterations[name]):
                run(inputs)
            results[name]["ms"].append(1000 * (time.perf_counter() - start) / iterations[name])
    return results


def measure(name: str, int8: bool = True) -> dict:
    """One model: {"f32": {backend: {"ms": [...], "error": e} | {"failed": why}}, "int8": ...}."""
    from openvino_backend.tools.quantize import quantize_int8
    from openvino_backend.tools.verify import flatten_outputs

    module, inputs = PEERS[name].build()
    with torch.no_grad():
        expected = flatten_outputs(module(*inputs))
        exported = torch.export.export(module, inputs)
    report: dict[str, dict] = {}
    runners, errors = _runners(exported, inputs, expected)
    report["f32"] = {**_measure(runners, list(inputs), expected), **{k: {"failed": v} for k, v in errors.items()}}
    del runners
    if int8:
        generator = torch.Generator().manual_seed(1)
        draws = [tuple(_redraw(x, generator) for x in inputs) for _ in range(CALIBRATION_DRAWS)]
        try:
            quantized = quantize_int8(exported, inputs, draws)
            unfolded = quantize_int8(exported, inputs, draws, fold_quantize=False)
            with torch.no_grad():
                expected_q = flatten_outputs(quantized(*inputs))
                exported_q = torch.export.export(quantized, inputs)
                unfolded_q = torch.export.export(unfolded, inputs)
        except Exception as error:
            report["int8"] = {"quantize": {"failed": _why(error)}}
            return report
        runners, errors = _runners(exported_q, inputs, expected_q, for_openvino=unfolded_q)
        report["int8"] = {
            **_measure(runners, list(inputs), expected_q),
            **{k: {"failed": v} for k, v in errors.items()},
        }
    return report


def _redraw(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if x.is_floating_point():
        return torch.randn(x.shape, generator=generator, dtype=x.dtype)
    return torch.randint(0, int(x.max()) + 1, x.shape, generator=generator, dtype=x.dtype)


def call_cost_ms(calls: int = 2000) -> dict[str, float]:
    """Median ms of one call of a tiny program (an 8-wide linear layer), where the fixed cost of a
    call is all there is: ours and XNNPACK's through ``executorch.runtime``, and OpenVINO alone's
    ``infer()`` with its tensors bound once."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from openvino_backend.partition.partitioner import OpenvinoPartitioner
    from openvino_backend.tools.verify import LoadedMethod, lower_exported

    model, x = torch.nn.Linear(8, 8).eval(), torch.randn(1, 8)
    exported = torch.export.export(model, (x,))
    with torch.no_grad():
        expected = [model(x)]
    runs = {
        "ours": LoadedMethod(lower_exported(exported, partitioner=OpenvinoPartitioner()).buffer),
        "xnnpack": LoadedMethod(lower_exported(exported, partitioner=XnnpackPartitioner()).buffer),
        "openvino": _OpenvinoAlone(exported, (x,), expected),
    }
    costs = {}
    for name, run in runs.items():
        for _ in range(100):
            run([x])
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            run([x])
            times.append(1000 * (time.perf_counter() - start))
        costs[name] = statistics.median(times)
    return costs


HEADERS = (
    "model",
    "precision",
    "ours ms",
    "XNNPACK ms",
    "OpenVINO alone ms",
    "ours / XNNPACK",
    "ours / OpenVINO alone",
    "max rel error (ours / XNNPACK / OpenVINO)",
)


def _cell(result: dict | None) -> str:
    if result is None:
        return "-"
    if "failed" in result:
        return result["failed"][:40]
    return f"{statistics.median(result['ms']):.3f}"


def _ratio(a: dict | None, b: dict | None) -> float | None:
    if not a or not b or "ms" not in a or "ms" not in b:
        return None
    return statistics.median(x / y for x, y in zip(a["ms"], b["ms"], strict=True))


def rows_for(name: str, report: dict) -> list[tuple]:
    rows = []
    for precision, results in report.items():
        ours, xnnpack, alone = (results.get(k) for k in ("ours", "xnnpack", "openvino"))
        if "quantize" in results or "run" in results:
            failure = (results.get("quantize") or results["run"])["failed"]
            rows.append((name, precision, failure[:40], "", "", "", "", ""))
            continue
        vs_x, vs_ov = _ratio(ours, xnnpack), _ratio(ours, alone)
        errors = " / ".join(f"{r['error']:.2g}" if r and "error" in r else "-" for r in (ours, xnnpack, alone))
        rows.append(
            (
                name,
                precision,
                _cell(ours),
                _cell(xnnpack),
                _cell(alone),
                f"{vs_x:.2f}" if vs_x is not None else "-",
                f"{vs_ov:.2f}" if vs_ov is not None else "-",
                errors,
            )
        )
    return rows


def bench_peers(names: Sequence[str], int8: bool = True) -> tuple[list[tuple], list[str]]:
    """Each model measured in a fresh process; the table's rows and a summary line per precision."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    rows: list[tuple] = []
    reports: dict[str, dict] = {}
    for name in names:
        command = [sys.executable, "-m", "bench.peers", name] + ([] if int8 else ["--no-int8"])
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=MODEL_TIMEOUT, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            report = json.loads(lines[-1]) if lines else {"f32": {"run": {"failed": _last_line(done.stderr)}}}
        except subprocess.TimeoutExpired:
            report = {"f32": {"run": {"failed": f"timed out after {MODEL_TIMEOUT} s"}}}
        reports[name] = report
        rows += rows_for(name, report)
    return rows, summary(reports)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:80] if lines else "process failed"


def summary(reports: dict[str, dict]) -> list[str]:
    lines = []
    for precision in ("f32", "int8"):
        measured = [r[precision] for r in reports.values() if precision in r]
        compared_x = [v for r in measured if (v := _ratio(r.get("ours"), r.get("xnnpack"))) is not None]
        compared_ov = [v for r in measured if (v := _ratio(r.get("ours"), r.get("openvino"))) is not None]
        if not compared_x and not compared_ov:
            continue
        lines.append(
            f"{precision}: ahead of XNNPACK on {sum(v < 1 for v in compared_x)} of {len(compared_x)}; "
            f"within 1.05x of OpenVINO alone on {sum(v <= 1.05 for v in compared_ov)} of {len(compared_ov)}"
            + (f" (worst {max(compared_ov):.2f}x)" if compared_ov else "")
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers")
    parser.add_argument("model", choices=sorted(PEERS))
    parser.add_argument("--no-int8", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    out = answer_stream()
    print(json.dumps(measure(args.model, int8=not args.no_int8)), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
