"""The MLPerf Tiny int8 reference models, compiled from their .tflite files, against LiteRT's
reference interpreter (``BUILTIN_REF``: TFLite's reference kernels).

The four models are committed under tests/data/mlperf_tiny (the default folder; Apache-2.0, see
PROVENANCE.md there).  To fetch them yourself (mlcommons/tiny at commit 1afd2c9820f7)::

    mkdir -p mlperf-tiny && cd mlperf-tiny
    for f in anomaly_detection/trained_models/ad01_int8.tflite \\
             image_classification/trained_models/pretrainedResnet_quant.tflite \\
             keyword_spotting/trained_models/kws_ref_model.tflite \\
             visual_wake_words/trained_models/vww_96_int8.tflite; do
      curl -LO https://raw.githubusercontent.com/mlcommons/tiny/1afd2c9820f795965a6134facd0b4dfae41ef23f/benchmark/training/$f
    done

Then::

    python benchmarks/bench_tflite.py [mlperf-tiny] [--samples 100] [--qemu] [--qemu-samples 3]
    CMSIS_NN_PATH=/path/to/CMSIS-NN python benchmarks/bench_tflite.py mlperf-tiny --qemu   # + CMSIS-NN kernels

Per model it prints: bytes equal to LiteRT on N random int8 inputs (Python reference kernels and the
portable C library on the host; with --qemu also on QEMU Cortex-M4 and M55 for each kernel flavour),
the arena (portable and CMSIS-NN kernels) next to the arena TFLite Micro's MLPerf Tiny reference
submission allocates for the model (``kTensorArenaSize`` in
benchmark/reference_submissions/*/submitter_implemented.cpp of the same commit: an allocation, not
a measured need), the flash of the constants, and QEMU instructions per inference next to the
published MLPerf Tiny cycles (X-CUBE-AI 10.2 on STM32, see below).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

MODELS = {  # file -> (task, TFLM reference arena bytes, published X-CUBE-AI 10.2 cycles)
    "kws_ref_model.tflite": ("KWS", 200 * 1024, 5.21e6),
    "pretrainedResnet_quant.tflite": ("IC", 100 * 1024, 19.9e6),
    "vww_96_int8.tflite": ("VWW", 200 * 1024, 10.7e6),
    "ad01_int8.tflite": ("AD", 10 * 1024, 0.58e6),
}


def litert(path: Path):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    d, o = it.get_input_details()[0], it.get_output_details()[0]

    def run(q):
        it.set_tensor(d["index"], q)
        it.invoke()
        return it.get_tensor(o["index"]).copy()

    return run, tuple(int(s) for s in d["shape"])


def main(argv=None) -> int:
    import corten
    from corten.frontends.tflite import tflite_input, tflite_output

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", nargs="?", default=str(Path(__file__).resolve().parents[1] / "tests" / "data" /
                                                  "mlperf_tiny"),
                    help="folder with the four .tflite files (default: tests/data/mlperf_tiny)")
    ap.add_argument("--samples", type=int, default=100, help="random int8 inputs per model (Python and host C)")
    ap.add_argument("--qemu", action="store_true", help="also run on QEMU Cortex-M4 and M55")
    ap.add_argument("--qemu-samples", type=int, default=3, help="inputs per QEMU target and kernel flavour")
    ap.add_argument("--markdown", action="store_true", help="also print the results as a markdown table")
    args = ap.parse_args(argv)
    folder = Path(args.dir)
    flavours = ["portable"] + (["cmsis-nn"] if os.environ.get("CMSIS_NN_PATH") else [])
    rows = []
    for fname, (task, tflm_arena, cycles) in MODELS.items():
        path = folder / fname
        if not path.is_file():
            print(f"{fname}: missing in {folder} (see the fetch step in this script's docstring)", file=sys.stderr)
            continue
        ref, shape = litert(path)
        t0 = time.perf_counter()
        prog = corten.compile(str(path), target="cortex-m55")
        compile_s = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        qs = [rng.integers(-128, 128, shape, dtype=np.int8) for _ in range(args.samples)]
        refs = [ref(q) for q in qs]
        py = sum(np.array_equal(tflite_output(prog.run_int8(tflite_input(prog, q))[0]), r) for q, r in zip(qs, refs))
        host = sum(np.array_equal(tflite_output(prog.c_run(tflite_input(prog, q), on="host").outputs[0]), r)
                   for q, r in zip(qs, refs))
        row = {"model": f"{task} ({fname})", "compile_s": compile_s, "python": f"{py}/{len(qs)}",
               "host_c": f"{host}/{len(qs)}", "arena_portable": prog.memory_for("portable").arena_bytes,
               "arena_cmsis": prog.memory_for("cmsis-nn").arena_bytes, "tflm_arena": tflm_arena,
               "flash": prog.memory_for("portable").constant_bytes, "cycles": cycles, "qemu": {}}
        if args.qemu:
            for target in ("cortex-m4", "cortex-m55"):
                for kernels in flavours:
                    same, instr = 0, None
                    for q, r in list(zip(qs, refs))[:args.qemu_samples]:
                        run = prog.c_run(tflite_input(prog, q), on="qemu", target=target, kernels=kernels)
                        same += np.array_equal(tflite_output(run.outputs[0]), r)
                        instr = run.instructions
                    row["qemu"][(target, kernels)] = (f"{same}/{min(len(qs), args.qemu_samples)}", instr)
        rows.append(row)
        print(f"{row['model']}: LiteRT-equal python {row['python']}, host C {row['host_c']}; arena "
              f"{row['arena_portable']:,} B portable / {row['arena_cmsis']:,} B cmsis-nn vs TFLM reference "
              f"allocation {tflm_arena:,} B ({row['arena_cmsis'] / tflm_arena:.2f}x); flash {row['flash']:,} B; "
              f"compiled in {compile_s:.1f} s", flush=True)
        for (target, kernels), (same, instr) in row["qemu"].items():
            print(f"    QEMU {target:<10} {kernels:<8}: LiteRT-equal {same}, {instr / 1e6:.2f} M instructions "
                  f"(MLPerf Tiny X-CUBE-AI 10.2: {cycles / 1e6:.2f} M cycles; ratio {instr / cycles:.2f})"
                  if instr else f"    QEMU {target} {kernels}: {same}")
    if args.markdown and rows:
        print(markdown(rows, flavours))
    return 0


def markdown(rows, flavours) -> str:
    """The README table: one row per model."""
    qemu_cols = [(t, k) for t in ("cortex-m4", "cortex-m55") for k in flavours] if rows[0]["qemu"] else []
    head = ["model", "LiteRT-equal (Python / host C)", "arena portable / CMSIS-NN (B)", "TFLM ref. arena (B)",
            "flash (B)"] + [f"{t[7:].upper()} {k} (M instr.)" for t, k in qemu_cols] + ["X-CUBE-AI 10.2 (M cycles)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], f"{r['python']} / {r['host_c']}", f"{r['arena_portable']:,} / {r['arena_cmsis']:,}",
                 f"{r['tflm_arena']:,}", f"{r['flash']:,}"]
        for key in qemu_cols:
            same, instr = r["qemu"][key]
            cells.append(f"{instr / 1e6:.2f} ({same} equal)" if instr else same)
        cells.append(f"{r['cycles'] / 1e6:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    sys.exit(main())
