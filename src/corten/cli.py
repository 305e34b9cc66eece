"""The ``corten`` command line: ``corten models``, ``corten compile``, ``corten run``, ``corten profile``."""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import warnings
from pathlib import Path

from corten.errors import CortenError
from corten.providers import provider_names

STAGE_FILES = {"exported": "01_exported.txt", "bn_fused": "02_bn_fused.txt",
               "quantized": "03_quantized.txt", "lowered": "04_lowered.txt"}


class CliError(CortenError, ValueError):
    """A bad command-line argument (model spec, input file)."""


def _precision_arg(text: str):
    """``--precision``: a name, or ``prefix=int16,prefix2=int8`` (module path prefixes; the rest int8)."""
    if "=" not in text:
        return text
    out = {"": "int8"}
    for part in text.split(","):
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip()
    return out


def load_model_spec(spec: str):
    """A zoo name, or ``path/to/file.py:factory`` where ``factory()`` returns ``(model, example_inputs)``."""
    from corten.frontends import model_format
    from corten.zoo import MODELS, get_model

    if model_format(spec) == "onnx":
        from corten.frontends.onnx import onnx_module

        model, example_inputs = onnx_module(spec)
        return model, example_inputs, Path(spec).stem
    if spec in MODELS:
        return (*get_model(spec), spec)
    if ":" not in spec:
        raise CliError(f"unknown model {spec!r}: give a zoo name ({', '.join(MODELS)}; see `corten models`) "
                       "or path/to/file.py:factory")
    path_s, func = spec.rsplit(":", 1)
    path = Path(path_s)
    if not path.is_file():
        raise CliError(f"{path}: no such file (MODEL is path/to/file.py:factory)")
    mod_spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        mod_spec.loader.exec_module(module)
    except SyntaxError as e:
        raise CliError(f"{path}:{e.lineno}: cannot load the model file: SyntaxError: {e.msg}") from e
    except Exception as e:  # noqa: BLE001 - the user's module: say which file and what it raised
        raise CliError(f"{path}: importing it raised {type(e).__name__}: {e}{_user_frame(e, path)}") from e
    finally:
        sys.path.pop(0)
    factory = getattr(module, func, None)
    if not callable(factory):
        raise CliError(f"{path}: has no function {func!r} (it must return (model, example_inputs))")
    try:
        result = factory()
    except Exception as e:  # noqa: BLE001 - the user's factory
        raise CliError(f"{path}:{func}() raised {type(e).__name__}: {e}{_user_frame(e, path)}; it must "
                       "return (model, example_inputs)") from e
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CliError(f"{path}:{func}() must return (model, example_inputs), got {type(result).__name__}")
    model, example_inputs = result
    from corten.validation import as_input_tuple

    return model, as_input_tuple(example_inputs, f"{path}:{func}()'s example_inputs"), path.stem


def _user_frame(exc: BaseException, path: Path) -> str:
    """`` (at file.py:LINE)``: the last frame of ``exc``'s traceback inside the user's ``path``."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    return f" (at {path}:{frames[-1].lineno})" if frames else ""


def cmd_models(args) -> int:
    from corten.zoo import list_models

    rows = list_models()
    w = max(len(n) for n, _ in rows)
    for name, desc in rows:
        print(f"{name:<{w}}  {desc}")
    return 0


def cmd_compile(args) -> int:
    import torch

    from corten.compiler import compile as corten_compile
    from corten.compiler import default_calibration
    from corten.outdir import check_destination, staged_dir

    from corten.frontends import model_format

    tflite = model_format(args.model) == "tflite"
    if tflite:  # an int8 TFLite model: its own quantization, nothing to calibrate
        if args.compare or args.calib_data:
            raise CliError(f"{args.model}: --compare and --calib-data apply to float models; a .tflite model "
                           "keeps its own int8 quantization")
        model, example_inputs, default_name = None, None, Path(args.model).stem
    else:
        model, example_inputs, default_name = load_model_spec(args.model)
    name = args.name or default_name.replace("-", "_").replace(".", "_")
    if not name.isidentifier() or not name.isascii():
        raise CliError(f"program name {name!r} is not a C identifier; pass --name NAME (letters, digits, _)")
    source = str(args.model)
    check_destination(Path(args.out), name, args.force, "--force", source)  # before minutes of compiling
    if tflite:
        calibration, calib_text = None, "its own int8 quantization (TFLite)"
    elif not args.calib_data and args.calib < 1:
        raise CliError(f"--calib {args.calib}: give at least 1 calibration sample (or --calib-data FILE.npy)")
    if tflite:
        pass
    elif args.calib_data:
        calibration, calib_text = _calibration_file(args.calib_data, example_inputs), f"{args.calib_data}"
    else:
        calibration = default_calibration(example_inputs, args.calib, args.seed)
        calib_text = f"{args.calib} random calibration samples"
        print(f"corten: warning: calibrating on {args.calib} random normal samples; pass real inputs with "
              "--calib-data FILE.npy for int8 ranges that match your data", file=sys.stderr)
    t0 = time.perf_counter()
    torch.set_num_threads(max(1, args.threads)) if args.threads else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if tflite:
            from corten.frontends.tflite import compile_tflite

            prog = compile_tflite(args.model, target=args.target, name=name)
        else:
            prog = corten_compile(model, example_inputs, target=args.target, calibration=calibration,
                                  seed=args.seed, name=name, progress=True, observer=args.observer,
                                  precision=_precision_arg(args.precision), input_scaling=args.input_scaling,
                                  weights=_precision_arg(args.weights), rounding=args.rounding,
                                  max_flash=args.max_flash if args.weights == "auto" else None)
        if args.memory or args.weights_section:  # the board's memory map (UsageError -> exit code 2)
            prog = prog.with_memory(args.memory, args.weights_section)
            if not prog.unlowered_ops():
                from corten.memory import check_budget

                check_budget(prog.memory_for(args.kernels), None, None)  # a region that does not fit -> exit code 2
        if (args.max_arena is not None or args.max_flash is not None) and not prog.unlowered_ops():
            # searches a banded schedule when the arena is over --max-arena; BudgetError -> exit code 2
            prog = prog.fit_budget(args.max_arena, args.max_flash, args.kernels)
        elapsed = time.perf_counter() - t0
        if args.compare:
            samples = calibration if isinstance(calibration, list) else [
                (calibration[i:i + 1],) for i in range(len(calibration))]
            compare_report = prog.compare(model, samples[:args.compare_samples], threshold_db=args.sqnr_threshold)
    _print_quantization_warnings(caught)
    out = Path(args.out)
    # Everything is written into a temporary directory beside --out, renamed into place only once
    # the program, its reports, the budget check and --emit-c all succeeded.
    prog.info["compiled_from"] = source
    with staged_dir(out, name, force=args.force, flag="--force", source=source) as tmp:
        prog._check_saveable()
        prog.write_files(tmp)
        graphs = tmp / "graphs"
        graphs.mkdir(parents=True, exist_ok=True)
        for stage, fname in STAGE_FILES.items():
            (graphs / fname).write_text(prog.stages.get(stage, ""))
        report = [f"Corten program {name!r} for {prog.target.name} ({prog.target.isa})",
                  f"compiled from {args.model} with {calib_text}, seed {args.seed}, observer {args.observer}"
                  + (f", precision {args.precision}" if args.precision != "int8" else ""), "",
                  prog.operator_table()]
        if args.precision == "auto":
            from corten.compiler import auto_report

            report += ["", auto_report(prog)]
        if not prog.unlowered_ops():
            report += ["", prog.memory_report(args.kernels), "", prog.fallback_report()]
            if args.kernels.startswith("generated"):
                report += ["", prog.choices_report(args.kernels)]
        text = "\n".join(report) + "\n"
        (tmp / "report.txt").write_text(text)
        print(text, end="")
        if args.compare:
            table = compare_report.table()
            (tmp / "compare.txt").write_text(table + "\n")
            print(table)
            if args.compare_plot:
                print(f"per-layer SQNR plot: {compare_report.plot(args.compare_plot)}")
        if args.max_arena is not None or args.max_flash is not None:
            from corten.memory import check_budget

            check_budget(prog.memory_for(args.kernels), args.max_arena, args.max_flash)  # BudgetError -> exit code 2
            plan = prog.memory_for(args.kernels)
            print(f"budget: fits (arena {plan.arena_bytes:,} B with {args.kernels} kernels, flash constants "
                  f"{plan.constant_bytes:,} B)")
        if args.plot and not prog.unlowered_ops():
            print(f"memory timeline plot: {prog.memory_for(args.kernels).plot(args.plot, budget=args.max_arena)}")
        if args.emit_c:
            lib = prog.emit_c(tmp / "c", kernels=args.kernels)
            print(f"C model library ({args.kernels} kernels): {out / 'c'}/ ({lib.name}.h, {lib.name}.c, "
                  f"{lib.constants.name}, Makefile, CMakeLists.txt)")
    t = prog.info.get("timings_s", {})
    print(f"compiled in {elapsed:.2f} s (capture {t.get('capture', 0):.2f} s, quantize+calibrate "
          f"{t.get('quantize', 0):.2f} s, lower {t.get('lower', 0):.2f} s); wrote {out}/ "
          f"(manifest.json, program.pt2, report.txt, graphs/)")
    return 0


def load_input_file(path: str, prog) -> "torch.Tensor":
    """A ``.npy`` file as the program's (first) input: real numbers, the program's input shape."""
    import numpy as np
    import torch

    p = Path(path)
    if not p.is_file():
        raise CliError(f"--input {path}: no such file")
    try:
        arr = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise CliError(f"--input {path}: not a .npy array file ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                       "save one with numpy.save") from None
    if not isinstance(arr, np.ndarray):
        raise CliError(f"--input {path}: holds several arrays (.npz); pass one .npy file")
    if arr.dtype.kind not in "fiu":
        kind = {"c": "complex", "O": "object", "U": "text", "S": "bytes", "V": "structured"}.get(arr.dtype.kind,
                                                                                                  str(arr.dtype))
        raise CliError(f"--input {path}: dtype {arr.dtype} ({kind}) is not a real number type; save a float32 array")
    shape = prog.inputs[0].shape
    if tuple(arr.shape) != shape:
        raise CliError(f"--input {path}: shape {tuple(arr.shape)} != the program's input {shape}")
    x = torch.from_numpy(np.ascontiguousarray(arr).astype(np.float32))
    if bool(torch.isnan(x).any()):
        raise CliError(f"--input {path}: holds {int(torch.isnan(x).sum())} NaN value(s); pass finite values")
    return x


def _calibration_file(path: str, example_inputs: tuple):
    """``--calib-data FILE.npy``: float samples stacked along dim 0 (one-input models)."""
    import numpy as np
    import torch

    if len(example_inputs) != 1:
        raise CliError("--calib-data takes one .npy of samples; this model has several inputs (calibrate from "
                       "Python with corten.compile(..., calibration=...))")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise CliError(f"{path}: cannot read as a .npy array ({e})") from None
    if not np.issubdtype(data.dtype, np.floating) and not np.issubdtype(data.dtype, np.integer):
        raise CliError(f"{path}: dtype {data.dtype} is not a real number type")
    ex = example_inputs[0]
    if data.ndim == ex.dim() - 1:
        data = data[None]
    if data.ndim != ex.dim() or tuple(data.shape[1:]) != tuple(ex.shape[1:]):
        raise CliError(f"{path}: shape {data.shape} does not hold samples of shape {tuple(ex.shape[1:])} "
                       "stacked along the first axis")
    return torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))


def _print_quantization_warnings(caught) -> None:
    from corten.errors import QuantizationWarning

    seen = set()
    for w in caught:
        msg = str(w.message)
        if issubclass(w.category, QuantizationWarning) and msg not in seen:
            seen.add(msg)
            print(f"corten: warning: {msg}", file=sys.stderr)


def _run_inputs(args, prog, doing: str) -> tuple[tuple, str]:
    """The inputs of ``corten run`` / ``profile`` (``--input`` or seeded random) and the target name;
    prints what is about to run."""
    import torch

    if args.input:
        if len(prog.inputs) != 1:
            raise CliError(f"{args.dir}: the program takes {len(prog.inputs)} inputs; --input gives one")
        xs = (load_input_file(args.input, prog),)
    else:
        g = torch.Generator().manual_seed(args.seed)
        xs = tuple(torch.randn(s.shape, generator=g) for s in prog.inputs)
    target = args.target or prog.target.name
    print(f"corten: {doing} {prog.name} ({args.kernels} kernels) on {args.on}"
          + (f" ({target})" if args.on == "qemu" else ""), flush=True)
    return xs, target


def cmd_run(args) -> int:
    import torch

    from corten.program import load

    prog = load(args.dir)
    xs, target = _run_inputs(args, prog, "running")
    expected = prog.run_int8(*xs)
    run = prog.c_run(*xs, on=args.on, kernels=args.kernels, target=target, progress=True, cflags=args.cflags or ())
    got = run.outputs
    same = all(torch.equal(e, g) for e, g in zip(expected, got))
    differing = sum(int((e != g).sum()) for e, g in zip(expected, got))
    print(f"output: {sum(g.numel() * g.element_size() for g in got)} bytes; byte-for-byte equal to the Python reference: "
          f"{'YES' if same else f'NO ({differing} bytes differ)'}")
    if prog.output_tree.keyed:  # outputs returned in a dict / NamedTuple: each with its C name and path
        for name, path, e, g in zip(prog.output_names, prog.output_tree.paths, expected, got):
            print(f"  {name:<16} {path:<28} shape {list(g.shape)}, {g.numel() * g.element_size()} bytes, "
                  f"{'equal' if torch.equal(e, g) else f'{int((e != g).sum())} differ'}")
    if run.instructions is not None:
        print(f"instructions (inference only, QEMU -icount): {run.instructions:,}")
    label = "inference wall time" if args.on == "host" else "QEMU run wall time"
    print(f"{label}: {run.wall_s:.3f} s")
    return 0 if same else 1


def cmd_profile(args) -> int:
    from corten.program import load

    prog = load(args.dir)
    cycles = args.mhz is not None or args.cycles
    if cycles and args.on != "qemu":
        raise CliError("--mhz/--cycles estimate the cycles of a QEMU run: use --on qemu")
    xs, target = _run_inputs(args, prog, "profiling")
    prof = prog.profile(*xs, on=args.on, target=target, kernels=args.kernels, progress=True,
                        baseline=not args.no_baseline, cycles=cycles)
    print(prof.table(mhz=args.mhz))
    if args.plot:
        print(f"profile plot: {prof.plot(args.plot)}")
    return 0 if prof.outputs_match else 1


KERNELS_HELP = ("a kernel provider, or a chain of them joined by '+' (generated+cmsis-nn: CMSIS-NN for the layers "
                "the generator does not take or yields); portable ends every chain")


def _kernels_arg(text: str) -> str:
    """``--kernels``: a provider name or a ``+``-joined chain of them."""
    names = provider_names()
    bad = [k for k in text.split("+") if k not in names]
    if bad or not text:
        raise argparse.ArgumentTypeError(f"unknown kernel provider {', '.join(bad) or text!r}: one of {names}, "
                                         "or several joined by '+'")
    return text


def build_parser() -> argparse.ArgumentParser:
    from corten.targets import TARGETS

    p = argparse.ArgumentParser(prog="corten", description="Compile PyTorch models to int8 C for Arm Cortex-M")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("models", help="list the built-in zoo models").set_defaults(func=cmd_models)
    c = sub.add_parser("compile", help="compile a model to a Corten program")
    c.add_argument("model", help="zoo name (see `corten models`), path/to/file.py:factory, an int8 model.tflite "
                                 "or a float model.onnx")
    c.add_argument("--target", default="cortex-m55", choices=list(TARGETS))
    c.add_argument("--out", required=True, help="output directory")
    c.add_argument("--calib", type=int, default=8, help="number of random calibration samples (default 8)")
    c.add_argument("--calib-data", default=None, metavar="FILE.npy",
                   help="real calibration samples stacked along axis 0 (instead of --calib random ones)")
    c.add_argument("--observer", default="histogram", choices=["histogram", "minmax", "percentile", "mse"],
                   help="activation range rule (program outputs always use min/max)")
    c.add_argument("--precision", default="int8", metavar="P",
                   help="int8 (default), int16 (TFLite's 16x8: int16 activations), auto, or module path "
                        "prefixes: 'encoder=int16,decoder.3=int8' (the rest int8)")
    c.add_argument("--input-scaling", default="per_tensor", choices=["per_tensor", "per_feature"],
                   help="per_feature: each feature of an input read by a Linear layer gets its own int8 range "
                        "(from --calib-data; folded into that layer)")
    c.add_argument("--weights", default="int8", metavar="W",
                   help="int8 (default), int4 (A8W4: int4 conv/depthwise/linear weights, packed two per byte), "
                        "auto (with --max-flash: the layers with the least int4 error per byte saved go int4 "
                        "until the constants fit) or module path prefixes: 'classifier=int4' (the rest int8)")
    c.add_argument("--rounding", default="nearest", choices=["nearest", "adaptive"],
                   help="adaptive: each conv/linear's int8 or int4 weights rounded up or down to minimise the "
                        "error of its output on the calibration samples (kept per output channel where it wins "
                        "on held-out samples)")
    c.add_argument("--compare", action="store_true",
                   help="print the per-layer int8-vs-float error (SQNR) on the calibration samples")
    c.add_argument("--compare-samples", type=int, default=16, metavar="N", help="samples --compare uses (16)")
    c.add_argument("--compare-plot", default=None, metavar="FILE.png", help="with --compare: SQNR bar chart")
    c.add_argument("--sqnr-threshold", type=float, default=10.0, metavar="DB",
                   help="with --compare: warn about layers whose accumulated SQNR is below DB (10)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--name", default=None, help="C identifier for the program (default: from MODEL)")
    c.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    c.add_argument("--emit-c", action="store_true", help="also write the C model library to DIR/c")
    c.add_argument("--kernels", default="portable", type=_kernels_arg, help=KERNELS_HELP)
    c.add_argument("--max-arena", type=int, default=None, metavar="BYTES",
                   help="arena budget: search a banded schedule (row tiles, recomputed halos) that fits; "
                        "fail naming the smallest arena found")
    c.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw the memory timeline (live bytes per step, lower bound, budget) as a PNG")
    c.add_argument("--memory", default=None, metavar="REGIONS",
                   help="the arena's RAM regions, fastest first: 'dtcm=32K,sram=rest' (NAME=SIZE[@SECTION][:MEMORY]); "
                        "scratch and small tensors go to the fastest; one C arena per region in its section")
    c.add_argument("--weights-section", default=None, metavar="SECTION",
                   help="linker section of the weights: '.ext_flash', or per module path prefix "
                        "'features=.ext_flash,classifier=.itcm_rodata' (with --emit-c: c/<name>_sections.ld)")
    c.add_argument("--max-flash", type=int, default=None, metavar="BYTES",
                   help="fail if the constants (weights etc.) are larger")
    c.add_argument("--force", action="store_true",
                   help="replace --out whole even if it holds another program or other files")
    c.set_defaults(func=cmd_compile)
    r = sub.add_parser("run", help="run a compiled program's C library on the host or QEMU and compare bytes")
    r.add_argument("dir", help="directory written by `corten compile --out DIR`")
    r.add_argument("--on", default="host", choices=["host", "qemu"])
    r.add_argument("--kernels", default="portable", type=_kernels_arg, help=KERNELS_HELP)
    r.add_argument("--target", default=None, help="QEMU target (default: the program's)")
    r.add_argument("--input", default=None, metavar="FILE.npy", help="float32 input (default: seeded random)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--cflags", default=None, metavar="FLAGS",
                   help="extra C compiler flags, e.g. --cflags='-O1 -g -fsanitize=address,undefined "
                        "-fno-sanitize-recover=all' (host)")
    r.set_defaults(func=cmd_run)
    pr = sub.add_parser("profile", help="per-step cost of a compiled program's C library (instructions on QEMU, "
                                        "time on the host)")
    pr.add_argument("dir", help="directory written by `corten compile --out DIR`")
    pr.add_argument("--on", default="qemu", choices=["host", "qemu"])
    pr.add_argument("--kernels", default="portable", type=_kernels_arg,
                    help=KERNELS_HELP + "; cmsis-nn needs CMSIS_NN_PATH (a CMSIS-NN source tree)")
    pr.add_argument("--target", default=None, help="QEMU target (default: the program's)")
    pr.add_argument("--input", default=None, metavar="FILE.npy", help="float32 input (default: seeded random)")
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("--plot", default=None, metavar="FILE.png", help="also draw the steps as a bar chart")
    pr.add_argument("--no-baseline", action="store_true",
                    help="skip the uninstrumented run the rows' sum is compared with")
    pr.add_argument("--cycles", action="store_true",
                    help="also estimate each step's cycles (QEMU: instruction mix x the core's timing table)")
    pr.add_argument("--mhz", type=float, default=None, metavar="MHZ",
                    help="estimate cycles (as --cycles) and print milliseconds at this clock, e.g. --mhz 120")
    pr.set_defaults(func=cmd_profile)
    return p


def main(argv: list[str] | None = None) -> int:
    """The ``corten`` command.  Called with ``argv=None`` (the ``corten`` console script,
    ``python -m corten.cli``) it ends the process itself once the command is done, see
    :func:`_exit_now`; called with a list (tests, other Python code) it returns the exit code."""
    code = _run(argv)
    if argv is None:
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """End the process without the interpreter's teardown.

    Everything the command wrote is closed by then; what is left is freeing hundreds of
    thousands of Python objects of torch, torchao and the compiled graphs, one by one, which costs
    about a second (measured: ``benchmarks/bench_compile_mv2.py``'s CLI row).  The ``atexit``
    handlers (temporary-directory finalizers, torch's own) and the logging handlers still run, and
    the standard streams are flushed, before ``os._exit``."""
    import atexit
    import logging
    import os

    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed pipe etc.: fall back to the normal exit
        sys.exit(code)
    os._exit(code)


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CortenError, FileNotFoundError, PermissionError, IsADirectoryError) as e:
        # Corten's own errors (and files the user named) explain themselves: message only.
        # Anything else is a bug in Corten and keeps its traceback.
        print(f"corten: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # another file system problem (read-only, disk full...), named by the OS
        print(f"corten: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
