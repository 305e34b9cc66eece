"""MobileNetV2-224 as firmware: memory plan, portable C on the host (-O2) and on QEMU boards.

    .venv/bin/python benchmarks/bench_mv2_firmware.py [--inputs 3] [--targets cortex-m55 cortex-m4]
        [--host-repeats 5] [--kernels portable]

Prints the memory report (arena vs live-set lower bound vs TFLite Micro's 1,665,344 B), the host
inference time of the portable C (best of N, against TFLite Micro's reference kernels' ~0.22 s on
this machine), and for each QEMU target and input: byte equality with the Python reference,
instructions of the inference alone and the wall time of the emulator run.
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch

TFLM_ARENA_BYTES = 1_665_344
TFLM_HOST_S = 0.22


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mv2")
    ap.add_argument("--inputs", type=int, default=3)
    ap.add_argument("--targets", nargs="*", default=["cortex-m55", "cortex-m4"])
    ap.add_argument("--host-repeats", type=int, default=5)
    ap.add_argument("--kernels", default="portable")
    args = ap.parse_args()
    warnings.simplefilter("ignore")

    import corten
    from corten.zoo import get_model

    model, example = get_model(args.model)
    t0 = time.perf_counter()
    prog = corten.compile(model, example, target="cortex-m55", name="mv2")
    print(f"compiled {args.model} in {time.perf_counter() - t0:.1f} s\n")
    print(prog.memory_report())
    plan = prog.memory
    print(f"\narena / lower bound = {plan.arena_bytes / plan.lower_bound_bytes:.4f}; "
          f"arena / TFLite Micro's {TFLM_ARENA_BYTES:,} B = {plan.arena_bytes / TFLM_ARENA_BYTES:.3f}\n")

    g = torch.Generator().manual_seed(2024)
    inputs = [example[0]] + [torch.randn(example[0].shape, generator=g) for _ in range(args.inputs - 1)]
    expected = [prog.run_int8(x)[0] for x in inputs]

    best = float("inf")
    for i in range(args.host_repeats):
        got = prog.run_c(inputs[i % len(inputs)], on="host", kernels=args.kernels, int8=True)[0]
        assert torch.equal(got, expected[i % len(inputs)]), "host C output differs from the reference"
        best = min(best, prog.last_c_run.wall_s)
    print(f"host, {args.kernels} C at -O2: best of {args.host_repeats} = {best * 1e3:.1f} ms per inference "
          f"(TFLite Micro reference kernels ~{TFLM_HOST_S * 1e3:.0f} ms: ratio {best / TFLM_HOST_S:.2f}x); "
          "bytes equal to the reference: yes\n")

    print(f"{'target':<12} {'input':>5} {'bytes equal':>11} {'instructions':>15} {'QEMU wall s':>11}")
    runs: dict[str, list] = {}
    for target in args.targets:
        for i, x in enumerate(inputs):
            got = prog.run_c(x, on="qemu", target=target, kernels=args.kernels, int8=True)[0]
            run = prog.last_c_run
            same = torch.equal(got, expected[i])
            print(f"{target:<12} {i:>5} {'yes' if same else 'NO':>11} {run.instructions:>15,} {run.wall_s:>11.2f}")
            assert same
            runs.setdefault(target, []).append(run)
    # the README's rows (input 0 is the zoo example input, the one `make demo` runs)
    qemu = "; ".join(f"{t.replace('cortex-', '').upper()} {rs[0].instructions:,} instructions (input 0; "
                     f"{min(r.instructions for r in rs):,}-{max(r.instructions for r in rs):,} over the "
                     f"{len(rs)} inputs; {rs[0].wall_s:.1f} s wall)" for t, rs in runs.items())
    print("\nREADME rows:")
    print(f"| {args.kernels} C, host, -O2, one inference | {best * 1e3:.0f} ms; TFLite Micro reference kernels "
          f"~{TFLM_HOST_S * 1e3:.0f} ms | `python benchmarks/bench_mv2_firmware.py` |")
    print(f"| {args.kernels} C, QEMU, {len(inputs)} inputs, bytes identical | {qemu} | "
          "`python benchmarks/bench_mv2_firmware.py` |")


if __name__ == "__main__":
    main()
