"""Compile time of ``corten compile mv2`` vs the ExecuTorch Cortex-M peer's quantize + lower, one thread.

Corten's side does what ``corten compile mv2 --out DIR`` does after building the model: capture,
BatchNorm fusion, quantization with 8 calibration samples, lowering (``corten.compile``), then
``Program.save`` plus the stage graphs and the report (operator table and memory plan) into a
temporary directory.  Importing Corten and building the model are reported but not counted (the
peer's time does not count its imports either).  The peer's side
(only when ``executorch`` imports; see ``peer_executorch.py`` for how to install it) runs
``CortexMQuantizer`` + ``prepare_pt2e`` + calibration + ``convert_pt2e`` + export +
``to_edge_transform_and_lower`` with ``CortexMPassManager`` on a deep copy of the SAME model with
the SAME 8 calibration samples, in the same process, with the model made channels-last as the
peer's own AOT compiler does (without it the peer leaves all 52 convolutions in float;
``--peer-layout contiguous`` measures that flow anyway).  Corten runs first (it pays the
process's one-off warm-up costs; ``--peer-first`` swaps the order).

Wall clock and the process's CPU time are both reported: on a shared machine the wall clock
includes waiting for a core, the CPU time does not.

Then the whole ``corten compile MODEL --out DIR`` command is run once as its own process (imports,
compile, save, exit: what a user waits for), its wall and CPU time measured, and its stderr checked
for anything but Corten's own progress lines (torchao's import noise must not show).
``--write-readme README.md`` puts the measured ratio and CLI time into the README's table (between
the ``bench_compile_mv2`` markers), so the README quotes a run, not a memory.

Usage::

    python benchmarks/bench_compile_mv2.py [--model mv2] [--calib 8] [--seed 0] [--peer-first] [--repeat 3]
    python benchmarks/bench_compile_mv2.py --write-readme README.md
    python benchmarks/bench_compile_mv2.py --profile 30     # cProfile Corten's compile, top 30 entries
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import io
import os
import pstats
import re
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_executorch import (INSTALL_HINT, QUANTIZE_LOWER_STAGES, StageClock,  # noqa: E402
                             peer_available, peer_version)

PEER_PUBLISHED_S = 6.35  # the peer's quantize + lower on mv2, 8 samples, 1 thread, as measured for the issue
CORTEN_STAGES = ("capture", "quantize", "lower")


def corten_compile_and_save(model, example_inputs, calibration, out_dir: Path, target: str,
                            seed: int) -> tuple[StageClock, object]:
    """``corten compile``'s work: ``corten.compile`` then save program, stage graphs and report.

    Returns a clock with the compiler's own per-stage wall and CPU times (``prog.info["timings_s"]``,
    ``prog.info["cpu_timings_s"]``),
    the whole compile's wall and CPU time under ``"compile"``, the saving under ``"save"`` and the
    memory plan for the report under ``"memory plan"``.
    """
    from corten.cli import STAGE_FILES
    from corten.compiler import compile as corten_compile

    clock = StageClock()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = clock.time("compile", lambda: corten_compile(model, example_inputs, target=target,
                                                            calibration=calibration, seed=seed, name="mv2"))

    def save():
        prog.save(out_dir)
        graphs = out_dir / "graphs"
        graphs.mkdir(parents=True, exist_ok=True)
        for stage, fname in STAGE_FILES.items():
            (graphs / fname).write_text(prog.stages.get(stage, ""))
        (out_dir / "report.txt").write_text(prog.operator_table() + "\n")

    def memory_plan():
        # The CLI's report.txt carries the memory plan of a fully lowered program.
        if not prog.unlowered_ops() and hasattr(prog, "memory_report"):
            with (out_dir / "report.txt").open("a") as f:
                f.write("\n" + prog.memory_report() + "\n")

    clock.time("save", save)
    clock.time("memory plan", memory_plan)
    for stage, seconds in prog.info.get("timings_s", {}).items():
        clock.wall[stage] = seconds
    for stage, seconds in prog.info.get("cpu_timings_s", {}).items():
        clock.cpu[stage] = seconds
    return clock, prog


def print_stages(title: str, clock: StageClock, stages) -> None:
    print(title)
    print(f"  {'stage':<16}{'wall (s)':>10}{'cpu (s)':>10}")
    for s in stages:
        if s in clock.wall:
            cpu = f"{clock.cpu[s]:>10.2f}" if s in clock.cpu else f"{'-':>10}"
            print(f"  {s:<16}{clock.wall[s]:>10.2f}{cpu}")


def run_corten(model, example_inputs, calibration, opts) -> StageClock:
    with tempfile.TemporaryDirectory(prefix="corten-bench-") as tmp:
        clock, prog = corten_compile_and_save(model, example_inputs, calibration, Path(tmp), opts.target, opts.seed)
        counts = prog.op_counts()
        unlowered = len(prog.unlowered_ops())
    print_stages(f"Corten: corten.compile + save ({sum(counts.values())} Corten ops, {unlowered} unlowered)",
                 clock, (*CORTEN_STAGES, "compile", "save", "memory plan"))
    return clock


def _op_list(counts: dict[str, int]) -> str:
    return ", ".join(f"{k.split('.')[1] if '.' in k else k} x{v}" for k, v in sorted(counts.items()))


def run_peer(model, example_inputs, calibration, target: str, layout: str) -> StageClock:
    from peer_executorch import compile_with_peer

    result = compile_with_peer(model, example_inputs, calibration, target=target,
                               channels_last=layout == "channels-last")
    n_cm = sum(result.cortex_m_ops.values())
    print_stages(f"ExecuTorch {peer_version()} Cortex-M ({layout} model): quantize + lower\n"
                 f"  -> {n_cm} cortex_m ops ({_op_list(result.cortex_m_ops)})",
                 result.clock, (*QUANTIZE_LOWER_STAGES, "to_executorch"))
    left = result.float_compute_ops()
    if left:
        print(f"  WARNING: the peer left {sum(left.values())} float ATen compute ops unlowered ({_op_list(left)})"
              + ("; its convolutions need a channels-last model" if layout != "channels-last" else ""))
    return result.clock


def print_comparison(corten: StageClock, peer: StageClock | None) -> None:
    c_stages = ("compile", "save", "memory plan")
    rows = [("Corten compile + save", corten.total(c_stages), corten.total(c_stages, "cpu"))]
    if peer is not None:
        rows.append(("ExecuTorch quantize + lower", peer.total(QUANTIZE_LOWER_STAGES),
                     peer.total(QUANTIZE_LOWER_STAGES, "cpu")))
        if "to_executorch" in peer.wall:
            full = (*QUANTIZE_LOWER_STAGES, "to_executorch")
            rows.append(("ExecuTorch ... + to_executorch", peer.total(full), peer.total(full, "cpu")))
    print()
    print(f"{'':<32}{'wall (s)':>10}{'cpu (s)':>10}")
    for label, wall, cpu in rows:
        print(f"{label:<32}{wall:>10.2f}{cpu:>10.2f}")
    c_wall, c_cpu = rows[0][1], rows[0][2]
    if peer is not None:
        p_wall, p_cpu = rows[1][1], rows[1][2]
        print(f"{'ratio peer / Corten':<32}{p_wall / c_wall:>10.2f}{p_cpu / c_cpu:>10.2f}")
        faster = c_wall < p_wall
        print(f"(the issue's published peer time, {PEER_PUBLISHED_S} s, matches the contiguous-layout flow "
              "that leaves the convolutions unlowered; see --peer-layout)")
        print(f"=> Corten's whole compile + save is {'FASTER' if faster else 'SLOWER'} than the peer's "
              f"quantize + lower (wall {c_wall:.2f} s vs {p_wall:.2f} s; cpu {c_cpu:.2f} s vs {p_cpu:.2f} s)")
    else:
        print(f"{'peer (published, not measured)':<32}{PEER_PUBLISHED_S:>10.2f}")
        print(f"(published peer / measured Corten, wall: {PEER_PUBLISHED_S / c_wall:.2f}; meaningful on a quiet "
              "machine only: under load the wall clock includes waiting for a core)")
        print(f"ExecuTorch is not installed, so the peer was not measured; to compare in one run: {INSTALL_HINT}")


SRC = Path(__file__).resolve().parent.parent / "src"
README_BEGIN, README_END = "<!-- bench_compile_mv2: begin (generated) -->", "<!-- bench_compile_mv2: end -->"


def time_cli(opts) -> tuple[float, float, list[str]]:
    """(wall s, CPU s, foreign stderr lines) of one ``corten compile MODEL --out DIR`` process: the
    user's whole wait, imports and exit included."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="corten-bench-cli-") as tmp:
        cmd = [sys.executable, "-m", "corten.cli", "compile", opts.model, "--target", opts.target, "--out",
               str(Path(tmp) / "out"), "--calib", str(opts.calib), "--seed", str(opts.seed),
               "--threads", str(opts.threads)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    foreign = [ln for ln in done.stderr.replace("\r", "\n").splitlines()
               if ln.strip() and not ln.strip().startswith(("corten:", "calibrating"))]
    return wall, cpu, foreign


def readme_block(opts, corten: StageClock, peer: StageClock | None, cli: tuple[float, float, list[str]]) -> str:
    c_stages = ("compile", "save", "memory plan")
    c_wall, c_cpu = corten.total(c_stages), corten.total(c_stages, "cpu")
    if peer is not None:
        p_wall, p_cpu = peer.total(QUANTIZE_LOWER_STAGES), peer.total(QUANTIZE_LOWER_STAGES, "cpu")
        compare = (f"ExecuTorch {peer_version()} Cortex-M peer quantize + lower (all layers lowered) "
                   f"{p_cpu:.2f} s CPU ({p_wall:.2f} s wall): Corten / peer CPU = **{c_cpu / p_cpu:.2f}x** "
                   f"(goal <= 0.33x)")
    else:
        compare = f"peer not installed, not measured ({INSTALL_HINT})"
    stages = ", ".join(f"{s} {corten.cpu[s]:.2f}" for s in (*CORTEN_STAGES, "save") if s in corten.cpu)
    wall, cpu, foreign = cli
    quiet = "nothing but Corten's progress on stderr" if not foreign else f"{len(foreign)} foreign stderr line(s)"
    return ("| what | number | command |\n|---|---|---|\n"
            f"| `corten compile {opts.model}` compile + save, {opts.threads} thread, {opts.calib} calibration samples, "
            f"fastest of {opts.repeat} alternating rounds | "
            f"{c_cpu:.2f} s CPU ({c_wall:.2f} s wall; CPU by stage: {stages}); {compare} | "
            "`python benchmarks/bench_compile_mv2.py` |\n"
            f"| whole `corten compile {opts.model} --out DIR` process (imports, compile, save, exit), fastest of "
            f"{opts.repeat} | "
            f"{wall:.2f} s wall, {cpu:.2f} s CPU (goal <= 5 s wall on a quiet machine; this one had load "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores); {quiet} | same run |")


EARLIER_PEER = "(earlier run, the last one with the ExecuTorch peer installed) "


def write_readme(path: str, block: str) -> None:
    """Replace the README's block with ``block``.  Without the peer installed, the last row that
    compared with the peer (a whole row of that earlier run, marked as such) is kept below it."""
    text = Path(path).read_text()
    pattern = re.compile(re.escape(README_BEGIN) + r".*?" + re.escape(README_END), re.S)
    found = pattern.search(text)
    if not found:
        raise SystemExit(f"{path}: no {README_BEGIN} ... {README_END} block to replace")
    if "Corten / peer CPU" not in block:
        earlier = [ln for ln in found.group(0).splitlines() if "Corten / peer CPU" in ln]
        if earlier:
            row = earlier[0]
            block += "\n" + (row if EARLIER_PEER in row else row.replace("| ", "| " + EARLIER_PEER, 1))
    Path(path).write_text(pattern.sub(lambda _: f"{README_BEGIN}\n{block}\n{README_END}", text))
    print(f"wrote the measured rows into {path}")


# (label, file path suffix, function name): the pipeline steps the profile summary reports.
PROFILE_STEPS = (
    ("capture (torch.export + checks)", "corten/capture/__init__.py", "capture"),
    ("torch.export.export (all calls)", "torch/export/__init__.py", "export"),
    ("ExportedProgram.module()", "corten/compiler.py", "unguarded_module"),
    ("prepare_pt2e", "quantize_pt2e.py", "prepare_pt2e"),
    ("  ATen passes (BN fusion, ...)", "corten/quantizer/quantizer.py", "transform_for_annotation"),
    ("calibration", "corten/compiler.py", "_calibrate"),
    ("convert_pt2e", "quantize_pt2e.py", "convert_pt2e"),
    ("shape propagation", "corten/compiler.py", "propagate_shapes"),
    ("Corten lowering passes", "corten/lowering/pass_manager.py", "__call__"),
    ("stage graph texts", "corten/compiler.py", "graph_text"),
    ("GraphModule.recompile", "torch/fx/graph_module.py", "recompile"),
    ("copy.deepcopy", "copy.py", "deepcopy"),
    ("module imports during compile", "<frozen importlib._bootstrap>", "_find_and_load"),
    ("Program.save (torch.export.save)", "corten/program.py", "save"),
)


def profile_summary(stats: pstats.Stats) -> str:
    """Cumulative seconds of each :data:`PROFILE_STEPS` entry (largest when a name has several)."""
    lines = [f"  {'step':<36}{'cum (s)':>9}{'calls':>8}"]
    for label, path_suffix, func in PROFILE_STEPS:
        hits = [(ct, nc) for (path, _, name), (_, nc, _, ct, _) in stats.stats.items()
                if name == func and path.endswith(path_suffix)]
        if hits:
            ct, nc = max(hits)
            lines.append(f"  {label:<36}{ct:>9.2f}{nc:>8}")
    return "\n".join(lines)


def profile_corten(model, example_inputs, calibration, opts) -> None:
    """cProfile Corten's compile + save (cold, this process's first compile) and print the top entries."""
    prof = cProfile.Profile()
    with tempfile.TemporaryDirectory(prefix="corten-bench-") as tmp:
        prof.enable()
        clock, _ = corten_compile_and_save(model, example_inputs, calibration, Path(tmp), opts.target, opts.seed)
        prof.disable()
    print_stages("Corten under cProfile (times inflated by the profiler)", clock,
                 (*CORTEN_STAGES, "compile", "save", "memory plan"))
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    print("where the time goes (cumulative, nested entries overlap):")
    print(profile_summary(stats))
    if opts.profile > 0:
        stats.sort_stats("cumulative").print_stats(opts.profile)
        print(buf.getvalue())
    if opts.profile_out:
        prof.dump_stats(opts.profile_out)
        print(f"wrote {opts.profile_out} (load with pstats / snakeviz)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mv2", help="zoo model name (default mv2)")
    parser.add_argument("--target", default="cortex-m55")
    parser.add_argument("--calib", type=int, default=8, help="calibration samples (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--peer-first", action="store_true", help="run the peer before Corten")
    parser.add_argument("--no-peer", action="store_true", help="time Corten only")
    parser.add_argument("--peer-layout", choices=("channels-last", "contiguous"), default="channels-last",
                        help="channels-last (default) is what the peer's AOT compiler does and lowers every layer; "
                             "contiguous is its SKILL.md example, faster but it leaves the convolutions in float")
    parser.add_argument("--profile", type=int, default=None, metavar="N",
                        help="instead of comparing, cProfile Corten's compile and print the top N cumulative entries")
    parser.add_argument("--profile-out", default=None, help="with --profile: also dump the raw stats here")
    parser.add_argument("--no-cli", action="store_true", help="skip timing the whole `corten compile` process")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds of Corten + peer (alternating) and of the CLI process; the fastest of each "
                             "is reported (default 3: single runs vary by 30%% on a shared machine)")
    parser.add_argument("--write-readme", default=None, metavar="README.md",
                        help="write the measured rows into this README's bench_compile_mv2 block")
    opts = parser.parse_args(argv)

    torch.set_num_threads(opts.threads)
    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    import corten.compiler  # noqa: F401  (import cost reported, not timed as compile)
    from corten.compiler import default_calibration
    from corten.zoo import get_model
    imports_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    model, example_inputs = get_model(opts.model, seed=opts.seed)
    build_s = time.perf_counter() - t0
    calibration = default_calibration(example_inputs, opts.calib, opts.seed)
    peer_model = copy.deepcopy(model)
    use_peer = not opts.no_peer and opts.profile is None and peer_available()
    print(f"{opts.model}, {opts.calib} calibration samples, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s); importing Corten {imports_s:.2f} s, building the model "
          f"{build_s:.2f} s (neither counted below)")
    print()

    if opts.profile is not None:
        profile_corten(model, example_inputs, calibration, opts)
        return

    # --repeat rounds, the two alternating; each side's fastest round (least CPU) is compared
    corten_runs, peer_runs = [], []
    for r in range(opts.repeat):
        if opts.repeat > 1:
            print(f"--- round {r + 1} of {opts.repeat}")
        if use_peer and opts.peer_first:
            peer_runs.append(run_peer(copy.deepcopy(peer_model), example_inputs, calibration, opts.target,
                                      opts.peer_layout))
            print()
        corten_runs.append(run_corten(copy.deepcopy(model), example_inputs, calibration, opts))
        if use_peer and not opts.peer_first:
            print()
            peer_runs.append(run_peer(copy.deepcopy(peer_model), example_inputs, calibration, opts.target,
                                      opts.peer_layout))
        print()
    corten_clock = min(corten_runs, key=lambda c: c.total(("compile", "save", "memory plan"), "cpu"))
    peer_clock = min(peer_runs, key=lambda c: c.total(QUANTIZE_LOWER_STAGES, "cpu")) if peer_runs else None
    if opts.repeat > 1:
        print(f"fastest of {opts.repeat} rounds each:")
    print_comparison(corten_clock, peer_clock)
    if opts.no_cli:
        return
    cli = min((time_cli(opts) for _ in range(opts.repeat)), key=lambda c: c[0])
    print(f"\nwhole `corten compile {opts.model} --out DIR` process (fastest of {opts.repeat}): {cli[0]:.2f} s wall, {cli[1]:.2f} s CPU; "
          + ("stderr: only Corten's progress lines" if not cli[2] else "foreign stderr lines:\n  " + "\n  ".join(cli[2])))
    if opts.write_readme:
        write_readme(opts.write_readme, readme_block(opts, corten_clock, peer_clock, cli))


if __name__ == "__main__":
    main()
