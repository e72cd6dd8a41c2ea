"""``python -m bench --peers``: this backend against the alternatives on real architectures.

For each model of ``PEERS`` (``transformers`` architectures built from their configurations, random
weights, nothing downloaded), in a process of its own: median ms per call of the same exported program

* lowered by this backend, through ``executorch.runtime``;
* lowered by ExecuTorch's XNNPACK backend, through ``executorch.runtime``;
* in OpenVINO alone (``harness.OpenvinoAlone``: compiled with no properties as the runtime compiles
  a blob, inputs and outputs bound once, then ``infer()``);

in f32 and, where both backends take it, INT8 (PT2E with ExecuTorch's ``XNNPACKQuantizer``; OpenVINO
alone converts the same quantization with its weights left as quantize / dequantize pairs, since its
frontend passes stored int8 weights through undequantized). The three run interleaved, and each
result's max error (relative to its output's largest magnitude) against eager (the quantized eager
model for INT8) sits beside its time. ``python -m bench.peers MODEL`` measures one model: one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch

from bench.harness import OpenvinoAlone, answer_stream, interleaved, max_error, median_ratio, run_child

REPS = 5
TARGET_SECONDS = 0.25  # per measurement: enough calls that the timer's resolution does not matter
MODEL_TIMEOUT = 900
CALIBRATION_DRAWS = 4
IMAGE, IMAGE_256 = (1, 3, 224, 224), (1, 3, 256, 256)
# name: (transformers model class, input shape, vocabulary of its token ids or None: random floats)
PEERS: dict[str, tuple[str, tuple[int, ...], int | None]] = {
    "mobilenet_v2": ("MobileNetV2ForImageClassification", IMAGE, None),
    "mobilenet_v1": ("MobileNetV1ForImageClassification", IMAGE, None),
    "efficientnet_b0": ("EfficientNetForImageClassification", IMAGE, None),
    "resnet18": ("ResNetForImageClassification", IMAGE, None),
    "resnet50": ("ResNetForImageClassification", IMAGE, None),
    "convnext_atto": ("ConvNextForImageClassification", IMAGE, None),
    "regnet_y_400mf": ("RegNetForImageClassification", IMAGE, None),
    "mobilevit_xxs": ("MobileViTForImageClassification", IMAGE_256, None),
    "levit_128s": ("LevitForImageClassification", IMAGE, None),
    "deit_tiny": ("DeiTForImageClassification", IMAGE, None),
    "vit_small": ("ViTForImageClassification", IMAGE, None),
    "dinov2_small": ("Dinov2Model", IMAGE, None),
    "swin_tiny": ("SwinForImageClassification", IMAGE, None),
    "segformer_b0": ("SegformerForSemanticSegmentation", IMAGE_256, None),
    "whisper_tiny_encoder": ("WhisperModel", (1, 80, 3000), None),  # its encoder alone
    "gpt2_tiny": ("GPT2LMHeadModel", (1, 32), 1000),
    "bert_tiny": ("BertModel", (1, 64), 30522),
    "distilbert": ("DistilBertModel", (1, 128), 30522),
    "t5_small_encoder": ("T5EncoderModel", (1, 64), 32128),
    "qwen2_tiny": ("Qwen2ForCausalLM", (1, 64), 2048),
    "wav2vec2_small": ("Wav2Vec2Model", (1, 16000), None),
}
WHISPER_TINY = dict(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536, num_mel_bins=80)
QWEN2_TINY = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4)
# Their configurations where a default is not the published model's size (random weights all).
CONFIGS = {
    "efficientnet_b0": dict(width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280, image_size=224),
    "resnet18": dict(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512]),
    "convnext_atto": dict(depths=[2, 2, 6, 2], hidden_sizes=[40, 80, 160, 320]),
    "regnet_y_400mf": dict(depths=[1, 3, 6, 6], hidden_sizes=[48, 104, 208, 440], groups_width=8, layer_type="y"),
    "mobilevit_xxs": dict(hidden_sizes=[64, 80, 96], neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320], expand_ratio=2.0),
    "deit_tiny": dict(hidden_size=192, num_attention_heads=3, intermediate_size=768),
    "vit_small": dict(hidden_size=384, num_attention_heads=6, intermediate_size=1536),
    "dinov2_small": dict(hidden_size=384, num_attention_heads=6, image_size=224),
    "whisper_tiny_encoder": WHISPER_TINY,
    "gpt2_tiny": dict(n_layer=2, n_embd=128, n_head=2, vocab_size=1000),
    "bert_tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "t5_small_encoder": dict(use_cache=False),
    "qwen2_tiny": dict(**QWEN2_TINY, num_key_value_heads=2, vocab_size=2048, use_cache=False),
    "wav2vec2_small": dict(num_hidden_layers=4),
}
QUICK = ("mobilenet_v2", "bert_tiny")
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


def _draw(name: str, generator: torch.Generator) -> tuple[torch.Tensor]:
    _, shape, vocab = PEERS[name]
    return (
        torch.randn(shape, generator=generator)
        if vocab is None
        else torch.randint(0, vocab, shape, generator=generator),
    )


def build(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    model_class, config = PEERS[name][0], CONFIGS.get(name, {})
    torch.manual_seed(0)
    if model_class.endswith("ForImageClassification"):
        config = {"num_labels": 1000, **config}  # ImageNet's head, as the published models have
    cls = getattr(transformers, model_class)
    model = cls(cls.config_class(**config))
    if model_class == "WhisperModel":
        model = model.eval().get_encoder()
    inputs = _draw(name, torch.Generator().manual_seed(0))
    return _settled(_Output(model), name), inputs


def _settled(module: torch.nn.Module, name: str) -> torch.nn.Module:
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
                module(torch.cat([_draw(name, generator)[0] for _ in range(4)]))
    return module.eval()


def _runners(exported, inputs: tuple, expected: list, for_openvino=None) -> tuple[dict, dict]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from openvino_backend.partition.partitioner import OpenvinoPartitioner
    from openvino_backend.tools.verify import LoadedMethod, lower_exported

    runners: dict[str, Callable] = {}
    errors: dict[str, str] = {}
    makers = {
        "ours": lambda: LoadedMethod(lower_exported(exported, partitioner=OpenvinoPartitioner()).buffer),
        "xnnpack": lambda: LoadedMethod(lower_exported(exported, partitioner=XnnpackPartitioner()).buffer),
        "openvino": lambda: OpenvinoAlone(for_openvino or exported, inputs, expected),
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
    calls: dict[str, Callable[[], object]] = {}
    iterations: dict[str, int] = {}
    for name, run in runners.items():
        try:
            error = max_error(run(inputs), expected, relative=True)
        except Exception as failure:  # a program that lowers but cannot run is a result too
            results[name] = {"failed": f"at run time: {_why(failure)}"}
            continue
        start = time.perf_counter()
        run(inputs)
        iterations[name] = max(3, int(TARGET_SECONDS / max(time.perf_counter() - start, 1e-6)))
        calls[name] = lambda run=run: run(inputs)
        results[name] = {"error": error}
    for name, ms in interleaved(calls, REPS, iterations, warm_up=0).items():  # ours, xnnpack, openvino, ours, ...
        results[name]["ms"] = ms
    return results


def measure(name: str, int8: bool = True) -> dict:
    """One model: {"f32": {backend: {"ms": [...], "error": e} | {"failed": why}}, "int8": ...}."""
    from openvino_backend.tools.quantize import quantize_int8
    from openvino_backend.tools.verify import flatten_outputs

    module, inputs = build(name)
    with torch.no_grad():
        expected = flatten_outputs(module(*inputs))
        exported = torch.export.export(module, inputs)
    runners, errors = _runners(exported, inputs, expected)
    report = {"f32": {**_measure(runners, list(inputs), expected), **{k: {"failed": v} for k, v in errors.items()}}}
    del runners
    if not int8:
        return report
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
    report["int8"] = {**_measure(runners, list(inputs), expected_q), **{k: {"failed": v} for k, v in errors.items()}}
    return report


def _redraw(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if x.is_floating_point():
        return torch.randn(x.shape, generator=generator, dtype=x.dtype)
    return torch.randint(0, int(x.max()) + 1, x.shape, generator=generator, dtype=x.dtype)


def call_cost_ms(calls: int = 2000) -> dict[str, float]:
    """Median ms of one call of a tiny program (an 8-wide linear layer), where the fixed cost of a
    call is all there is: ours and XNNPACK's through ``executorch.runtime``, and OpenVINO alone's
    ``infer()`` with its tensors bound once."""
    model, x = torch.nn.Linear(8, 8).eval(), torch.randn(1, 8)
    with torch.no_grad():
        runs, _ = _runners(torch.export.export(model, (x,)), (x,), [model(x)])
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


def call_cost_line(costs: dict[str, float]) -> str:
    return (
        f"One call of an 8-wide linear layer, ms: ours {costs['ours']:.4f}, XNNPACK {costs['xnnpack']:.4f}, "
        f"OpenVINO alone's infer() {costs['openvino']:.4f}"
    )


def rows_for(name: str, report: dict) -> list[tuple]:
    def cell(result: dict | None) -> str:
        if result is None:
            return "-"
        return result["failed"][:40] if "failed" in result else f"{statistics.median(result['ms']):.3f}"

    def ratio(a: dict | None, b: dict | None) -> str:
        value = median_ratio((a or {}).get("ms"), (b or {}).get("ms"))
        return "-" if value is None else f"{value:.2f}"

    rows = []
    for precision, results in report.items():
        ours, xnnpack, alone = (results.get(k) for k in ("ours", "xnnpack", "openvino"))
        if "quantize" in results or "run" in results:
            failure = (results.get("quantize") or results["run"])["failed"]
            rows.append((name, precision, failure[:40], "", "", "", "", ""))
            continue
        errors = " / ".join(f"{r['error']:.2g}" if r and "error" in r else "-" for r in (ours, xnnpack, alone))
        cells = (cell(ours), cell(xnnpack), cell(alone), ratio(ours, xnnpack), ratio(ours, alone), errors)
        rows.append((name, precision, *cells))
    return rows


def summary(reports: dict[str, dict]) -> list[str]:
    lines = []
    for precision in ("f32", "int8"):
        measured = [r[precision] for r in reports.values() if precision in r]
        pairs = {other: [] for other in ("xnnpack", "openvino")}
        for r in measured:
            for other, values in pairs.items():
                value = median_ratio((r.get("ours") or {}).get("ms"), (r.get(other) or {}).get("ms"))
                if value is not None:
                    values.append(value)
        x, ov = pairs["xnnpack"], pairs["openvino"]
        if x or ov:
            lines.append(
                f"{precision}: ahead of XNNPACK on {sum(v < 1 for v in x)} of {len(x)}; within 1.05x of OpenVINO "
                f"alone on {sum(v <= 1.05 for v in ov)} of {len(ov)}" + (f" (worst {max(ov):.2f}x)" if ov else "")
            )
    return lines


def run(names: list[str], int8: bool) -> None:
    """Each model measured in a fresh process; the table, a summary line per precision, the cost of a call."""
    from bench.harness import table

    rows, reports = [], {}
    for name in names:
        command = [sys.executable, "-m", "bench.peers", name, *([] if int8 else ["--no-int8"])]
        report = run_child(command, timeout=MODEL_TIMEOUT)
        if "error" in report:
            report = {"f32": {"run": {"failed": report["error"]}}}
        reports[name] = report
        rows += rows_for(name, report)
    title = "Ours vs XNNPACK vs OpenVINO alone: median ms per call, each model in its own process, interleaved"
    table(title, rows, HEADERS)
    print("\n" + "\n".join(summary(reports)))
    print(call_cost_line(call_cost_ms()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.peers")
    parser.add_argument("model", choices=sorted(PEERS))
    parser.add_argument("--no-int8", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    out = answer_stream()
    print(json.dumps(measure(args.model, int8=not args.no_int8)), file=out)
