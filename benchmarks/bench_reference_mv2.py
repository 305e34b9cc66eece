"""Time Corten's Python reference kernels on every op of MobileNetV2 (width 1.0, 224x224), one thread.

The layer list is derived from torchvision's architecture definition (the inverted residual
settings ``t, c, n, s``), not typed in: 52 convolutions (35 regular incl. 1x1, 17 depthwise),
10 residual adds, a 7x7 global average pool and a 1280 -> 1000 linear, plus the input quantize and
output dequantize.  Inputs, weights and quantization parameters are random but realistic (int8
values, per-channel Q31 multipliers from real scales).  Each op is timed as the best of
``--repeats`` runs after a warm-up, and the whole network as the best of ``--repeats`` runs.
Both wall-clock time and the process's CPU time are reported: on a loaded machine (other jobs on
the same cores) the wall clock includes waiting for a core, the CPU time does not.

Usage::

    .venv/bin/python benchmarks/bench_reference_mv2.py [--repeats 5] [--seed 0]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Callable

import torch

import corten.ops  # noqa: F401  (registers torch.ops.corten.*)
from corten.fixed_point import quantize_multiplier
from corten.ops.linear import kernel_sum

GOAL_S = 0.35
PEER_PYTHON_S = 0.70
TFLM_C_S = 0.22

# torchvision.models.mobilenetv2: expand ratio t, output channels c, repeats n, first stride s.
INVERTED_RESIDUAL_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                             (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
STEM_CHANNELS = 32
LAST_CHANNELS = 1280
NUM_CLASSES = 1000


@dataclass
class Layer:
    """One op of the network: its kind (for the table), a name and the call with bound arguments."""

    kind: str
    name: str
    run: Callable[[], torch.Tensor]


def _int8(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8)


def _activation(gen: torch.Generator, c: int, h: int, w: int) -> torch.Tensor:
    return _int8(gen, 1, c, h, w).contiguous(memory_format=torch.channels_last)


def _qparams(gen: torch.Generator, channels: int, fan_in: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel multipliers/shifts from scales that keep outputs in range for this fan-in."""
    base = 1.0 / (128.0 * max(1.0, fan_in ** 0.5) * 8.0)
    scales = base * torch.exp2(torch.rand(channels, generator=gen, dtype=torch.float64) * 2 - 1)
    pairs = [quantize_multiplier(float(s)) for s in scales]
    return (torch.tensor([m for m, _ in pairs], dtype=torch.int32),
            torch.tensor([s for _, s in pairs], dtype=torch.int32))


def _offset(gen: torch.Generator) -> int:
    return int(torch.randint(-127, 129, (1,), generator=gen))


def _conv(gen, kind, name, c_in, c_out, h, w, k, stride, relu6) -> tuple[Layer, int, int]:
    pad = k // 2
    x = _activation(gen, c_in, h, w)
    out_zp = -128 if relu6 else int(torch.randint(-20, 20, (1,), generator=gen))
    act = (out_zp, 127)
    bias = torch.randint(-(2**14), 2**14, (c_out,), generator=gen, dtype=torch.int32)
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    if kind == "depthwise":
        weight = _int8(gen, 1, k, k, c_out)
        mult, shift = _qparams(gen, c_out, k * k)
        args = (x, weight, bias, [stride, stride], [pad, pad], [1, 1], 1, _offset(gen), out_zp, mult, shift, *act)
        op = torch.ops.corten.quantized_depthwise_conv2d
    else:
        weight = _int8(gen, c_out, k, k, c_in)
        mult, shift = _qparams(gen, c_out, k * k * c_in)
        args = (x, weight, bias, [stride, stride], [pad, pad], [1, 1], _offset(gen), out_zp, mult, shift, *act)
        op = torch.ops.corten.quantized_conv2d
    return Layer(kind, name, lambda: op(*args)), ho, wo


def _add(gen, name, c, h, w) -> Layer:
    a, b = _activation(gen, c, h, w), _activation(gen, c, h, w)
    m1, s1 = quantize_multiplier(0.4)
    m2, s2 = quantize_multiplier(0.5)
    mo, so = quantize_multiplier(1.3 / (1 << 20))
    args = (a, b, _offset(gen), m1, s1, _offset(gen), m2, s2, 20, _offset(gen) - 1, mo, so, -128, 127)
    return Layer("add", name, lambda: torch.ops.corten.quantized_add(*args))


def mobilenet_v2_layers(seed: int = 0, resolution: int = 224) -> list[Layer]:
    """Every op of MobileNetV2 in execution order, with random int8 data bound to it."""
    gen = torch.Generator().manual_seed(seed)
    layers: list[Layer] = []
    image = torch.rand((1, 3, resolution, resolution), generator=gen) * 4 - 2
    layers.append(Layer("quantize", "input", lambda: torch.ops.corten.quantize_per_tensor(image, 0.0157, -3)))

    h = w = resolution
    layer, h, w = _conv(gen, "conv2d", "features.0 (3x3 s2 stem)", 3, STEM_CHANNELS, h, w, 3, 2, True)
    layers.append(layer)
    c_in = STEM_CHANNELS
    block = 1
    for t, c, n, s in INVERTED_RESIDUAL_SETTING:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            prefix = f"features.{block}"
            if t != 1:
                layer, _, _ = _conv(gen, "conv2d", f"{prefix} expand 1x1", c_in, hidden, h, w, 1, 1, True)
                layers.append(layer)
            layer, ho, wo = _conv(gen, "depthwise", f"{prefix} dw 3x3 s{stride}", hidden, hidden, h, w, 3, stride, True)
            layers.append(layer)
            layer, _, _ = _conv(gen, "conv2d", f"{prefix} project 1x1", hidden, c, ho, wo, 1, 1, False)
            layers.append(layer)
            if stride == 1 and c_in == c:
                layers.append(_add(gen, f"{prefix} residual add", c, ho, wo))
            c_in, h, w = c, ho, wo
            block += 1
    layer, _, _ = _conv(gen, "conv2d", f"features.{block} (1x1 to {LAST_CHANNELS})", c_in, LAST_CHANNELS, h, w, 1, 1, True)
    layers.append(layer)

    pooled_in = _activation(gen, LAST_CHANNELS, h, w)
    layers.append(Layer("avg_pool", f"global avg pool {h}x{w}", lambda: torch.ops.corten.quantized_avg_pool2d(
        pooled_in, [h, w], [1, 1], [0, 0], -128, 127)))

    feat = _int8(gen, 1, LAST_CHANNELS)
    fc_w = _int8(gen, NUM_CLASSES, LAST_CHANNELS)
    fc_off = _offset(gen)
    ksum = kernel_sum(fc_w, torch.randint(-(2**14), 2**14, (NUM_CLASSES,), generator=gen, dtype=torch.int32), fc_off)
    fc_m, fc_s = _qparams(gen, 1, LAST_CHANNELS)
    layers.append(Layer("linear", f"classifier {LAST_CHANNELS}->{NUM_CLASSES}", lambda: torch.ops.corten.quantized_linear(
        feat, fc_w, ksum, fc_off, 5, fc_m, fc_s, -128, 127)))
    logits = _int8(gen, 1, NUM_CLASSES)
    layers.append(Layer("dequantize", "output", lambda: torch.ops.corten.dequantize_per_tensor(logits, 0.1, 5)))
    return layers


@dataclass(frozen=True)
class Timing:
    wall: float  # seconds, time.perf_counter
    cpu: float   # seconds, time.process_time (this process only)

    def __add__(self, other: "Timing") -> "Timing":
        return Timing(self.wall + other.wall, self.cpu + other.cpu)


def best_of(fn: Callable[[], object], repeats: int) -> Timing:
    """Best wall and best CPU time of ``repeats`` runs after one warm-up run."""
    fn()
    wall = cpu = float("inf")
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - w0)
        cpu = min(cpu, time.process_time() - c0)
    return Timing(wall, cpu)


def _check_architecture(layers: list[Layer]) -> None:
    counts = {k: sum(1 for l in layers if l.kind == k) for k in ("conv2d", "depthwise", "add", "avg_pool", "linear")}
    expected = {"conv2d": 35, "depthwise": 17, "add": 10, "avg_pool": 1, "linear": 1}
    if counts != expected:
        raise SystemExit(f"bench_reference_mv2: derived layer counts {counts} differ from MobileNetV2's {expected}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-layer", action="store_true", help="also print every layer's time")
    opts = parser.parse_args(argv)

    torch.set_num_threads(1)
    layers = mobilenet_v2_layers(opts.seed)
    _check_architecture(layers)

    per_layer = [(layer, best_of(layer.run, opts.repeats)) for layer in layers]
    if opts.per_layer:
        for layer, t in per_layer:
            print(f"  {layer.kind:<10} {layer.name:<34} {t.wall * 1e3:8.2f} ms wall {t.cpu * 1e3:8.2f} ms cpu")

    kinds: dict[str, tuple[int, Timing]] = {}
    for layer, t in per_layer:
        n, total = kinds.get(layer.kind, (0, Timing(0.0, 0.0)))
        kinds[layer.kind] = (n + 1, total + t)
    conv_time = kinds["conv2d"][1] + kinds["depthwise"][1]

    def run_network():
        for layer in layers:
            layer.run()

    network = best_of(run_network, opts.repeats)

    print(f"MobileNetV2 1.0 @224, Corten reference kernels, torch {torch.__version__}, 1 thread, "
          f"best of {opts.repeats}")
    print(f"{'op kind':<12}{'count':>6}{'wall (ms)':>12}{'cpu (ms)':>12}")
    for kind, (n, total) in kinds.items():
        print(f"{kind:<12}{n:>6}{total.wall * 1e3:>12.1f}{total.cpu * 1e3:>12.1f}")
    print()
    print(f"{'':<38}{'clock':>6}{'time (s)':>10}{'/ goal':>8}{'/ peer Py':>10}{'/ TFLM C':>10}")
    for label, t in (("52 convolutions (sum of per-op best)", conv_time), ("whole network (best run)", network)):
        for clock, v in (("wall", t.wall), ("cpu", t.cpu)):
            print(f"{label:<38}{clock:>6}{v:>10.3f}{v / GOAL_S:>8.2f}{v / PEER_PYTHON_S:>10.2f}{v / TFLM_C_S:>10.2f}")
    print(f"goal {GOAL_S} s; peer Python reference {PEER_PYTHON_S} s; TFLite Micro C reference {TFLM_C_S} s")
    verdict = "meets" if max(conv_time.wall, network.wall) <= GOAL_S else "MISSES"
    print(f"=> wall clock {verdict} the {GOAL_S} s goal"
          + ("" if verdict == "meets" else " (compare the cpu rows if the machine is loaded)"))


if __name__ == "__main__":
    main()
