"""Banded (row-tile) schedules: asymmetric conv padding, in-place cat, the banding rewrite and the
budget-driven search (corten.memory.banding)."""
from __future__ import annotations

import os
import shutil

import pytest
import torch
from torch import nn

import corten  # noqa: F401  (registers the corten:: ops)


def _rand(shape, gen, lo=-128, hi=128, dtype=torch.int8):
    return torch.randint(lo, hi, shape, dtype=dtype, generator=gen)


@pytest.mark.parametrize("pad", [[0, 1, 2, 1], [2, 0, 0, 1], [1, 1, 1, 1], [0, 0, 1, 0]])
@pytest.mark.parametrize("stride", [1, 2])
def test_asymmetric_conv_padding_equals_explicitly_padded_input(pad, stride):
    """[top, left, bottom, right] padding == the input padded with its zero point, unpadded conv."""
    g = torch.Generator().manual_seed(sum(pad) * 7 + stride)
    cl = torch.channels_last
    x = _rand((1, 5, 9, 7), g).contiguous(memory_format=cl)
    w, wd = _rand((6, 3, 3, 5), g), _rand((1, 3, 3, 5), g)
    b = _rand((6,), g, -1000, 1000, torch.int32)
    m, sh = torch.full((6,), 1 << 30, dtype=torch.int32), torch.full((6,), -6, dtype=torch.int32)
    zp = -3  # input_offset 3
    xp = torch.nn.functional.pad(x.to(torch.int32), (pad[1], pad[3], pad[0], pad[2]), value=zp)
    xp = xp.to(torch.int8).contiguous(memory_format=cl)
    conv, dw = torch.ops.corten.quantized_conv2d, torch.ops.corten.quantized_depthwise_conv2d
    y = conv(x, w, b, [stride] * 2, pad, [1, 1], 3, -2, m, sh, -128, 127)
    assert torch.equal(y, conv(xp, w, b, [stride] * 2, [0, 0], [1, 1], 3, -2, m, sh, -128, 127))
    yd = dw(x, wd, b[:5], [stride] * 2, pad, [1, 1], 1, 3, -2, m[:5], sh[:5], -128, 127)
    assert torch.equal(yd, dw(xp, wd, b[:5], [stride] * 2, [0, 0], [1, 1], 1, 3, -2, m[:5], sh[:5], -128, 127))


# ============================================================================ banded programs
from corten.errors import BudgetError  # noqa: E402
from corten.memory import constant_tensor, plan_memory  # noqa: E402
from corten.memory.tensors import DEQUANTIZE, QUANTIZE  # noqa: E402
from corten.memory.views import RESHAPE, alias_offset, input_layout_reshape  # noqa: E402
from corten.ops.registry import op_name_of  # noqa: E402

from conftest import needs_cmsis_nn, needs_gcc, needs_qemu  # noqa: E402


def c_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's C bytes (NHWC for 4-D), independent of the planner."""
    t = t.permute(0, 2, 3, 1) if t.dim() == 4 else t
    return t.contiguous().reshape(-1).view(torch.int8) if t.dtype == torch.int8 else \
        t.contiguous().reshape(-1).to(torch.int8)


def replay_on_planned_bytes(ep, plan, x):
    """The independent checker of a plan (banded, in-place cats and adds included): run the program
    step by step on byte buffers filled with garbage (scratch re-filled at each step), every
    tensor read from and written to where the plan put it.  Every read must see exactly the bytes
    the reference computes for that tensor (so nothing live was overwritten), every view and
    every in-place cat must already hold its bytes where the plan says (a view, e.g. a band's rows
    of a tensor, only its own bytes: the rows earlier bands consumed may hold a segment output
    trailing them, ``plan.cats_over_inputs``), and the outputs match.
    With memory regions, each region's arena is a buffer of its own (of the region's planned bytes,
    within its capacity)."""
    gen = torch.Generator().manual_seed(5)
    garbage = lambda n: torch.randint(-128, 128, (n,), generator=gen, dtype=torch.int8)  # noqa: E731
    if plan.regions:
        assert sum(r.nbytes for r in plan.regions) == plan.arena_bytes
        assert all(r.capacity is None or r.nbytes <= r.capacity for r in plan.regions)
        bufs = {("arena", r.name): garbage(r.nbytes) for r in plan.regions}
    else:
        bufs = {("arena", ""): garbage(plan.arena_bytes)}
    for a in list(plan.tensors.values()) + list(plan.scratch.values()):  # every arena buffer inside its region
        if a.region == "arena":
            assert a.offset + a.nbytes <= bufs[("arena", a.memory)].numel(), a
    for a in plan.tensors.values():
        if a.region != "arena":
            k = (a.region, a.index)
            bufs[k] = garbage(max(a.nbytes + a.offset, bufs[k].numel() if k in bufs else 0))

    def at(name):
        a = plan.tensors[name]
        return bufs[(a.region, a.index if a.region != "arena" else a.memory)], a.offset, a.nbytes

    ref, placed = {}, set(plan.placed_cats)
    user_inputs = list(ep.graph_signature.user_inputs)
    outputs = []
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            c = constant_tensor(ep, n)
            ref[n.name] = c if c is not None else x[user_inputs.index(n.name)]
            continue
        if n.op == "output":
            outputs = [ref[a.name] for a in n.args[0]]
            continue
        args = [ref[a.name] if isinstance(a, torch.fx.Node) else
                [ref[b.name] for b in a] if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.fx.Node)
                else a for a in n.args]
        window = n.name in plan.tensors and alias_offset(n) is not None  # a view: it reads only its own bytes,
        for a in n.all_input_nodes:  # checked below; every other activation read sees its producer's bytes
            if a.name in plan.tensors and input_layout_reshape(a) is None and not window:
                buf, off, nb = at(a.name)
                assert torch.equal(buf[off:off + nb], c_bytes(ref[a.name])), (n.name, "reads", a.name)
        y = n.target(*args, **n.kwargs)
        ref[n.name] = y
        name = op_name_of(n.target)
        if n.name not in plan.tensors or name in (QUANTIZE, DEQUANTIZE):
            if name == QUANTIZE:  # the caller's input bytes (in the layout of its first reshape, if it has one)
                buf, off, nb = at(n.name)
                first = input_layout_reshape(n)
                buf[off:off + nb] = c_bytes(y if first is None else y.reshape(first.meta["val"].shape))
            continue
        buf, off, nb = at(n.name)
        view = (n.target == RESHAPE and alias_offset(n) is not None) or \
            (n.target != RESHAPE and alias_offset(n) is not None) or n.name in placed
        if view:
            assert torch.equal(buf[off:off + nb], c_bytes(y)), (n.name, "view / in-place cat bytes")
            continue
        if n.name in plan.scratch:
            s = plan.scratch[n.name]
            bufs[("arena", s.memory)][s.offset:s.offset + s.nbytes] = garbage(s.nbytes)
        if n.name in getattr(plan, "in_place_kernels", ()):  # in-place depthwise: channel by channel
            a = n.args[0]
            ibuf, ioff, inb = at(a.name)
            ch, want_in, got = int(a.meta["val"].shape[1]), c_bytes(ref[a.name]), c_bytes(y)
            assert ibuf is buf and ioff == off and nb <= inb and int(n.meta["val"].shape[1]) == ch, n.name
            assert op_name_of(n.target) == "quantized_depthwise_conv2d" and int(n.args[6]) == 1, n.name
            for c in range(ch):  # input channel c intact when its turn comes; output channel c over it
                assert torch.equal(buf[off + c:off + inb:ch], want_in[c::ch]), (n.name, "channel", c)
                buf[off + c:off + nb:ch] = got[c::ch]
            continue
        buf[off:off + nb] = c_bytes(y)
    return outputs


@pytest.fixture(scope="module")
def small_mv2():
    from corten.zoo import get_model

    model, example = get_model("mv2-0.35-96")
    return corten.compile(model, example, target="cortex-m55", name="mv2_small")


@pytest.fixture(scope="module")
def banded_small(small_mv2):
    return small_mv2.fit_budget(64 * 1024)


def test_no_budget_keeps_todays_plan(small_mv2):
    assert small_mv2.schedule is None
    assert small_mv2.fit_arena(small_mv2.memory.arena_bytes) is small_mv2  # fits: unchanged
    assert "quantized_cat" not in small_mv2.op_counts()


def test_budget_bands_mv2_small_byte_exact_and_checked(small_mv2, banded_small):
    budget = 64 * 1024
    banded = banded_small
    plan = banded.memory
    assert plan.arena_bytes <= budget < small_mv2.memory.arena_bytes
    sched = banded.schedule
    assert sched.segments and sched.extra_macs == 0  # halo rows carried between bands, none recomputed
    assert any(s.halo_rows > 0 and s.bands > 1 and len(s.nodes) > 1 for s in sched.segments)
    from corten.memory.banding import total_macs
    from corten.memory.tensors import analyse
    assert total_macs(analyse(banded.ep)) == total_macs(analyse(small_mv2.ep))  # every row computed once
    assert plan.placed_cats and len(plan.placed_cats) > len(sched.segments)  # + each band's halo and new rows
    report = plan.report()
    assert "banded segment" in report and "bands of" in report
    x = torch.randn(small_mv2.inputs[0].shape, generator=torch.Generator().manual_seed(3))
    want = small_mv2.run_int8(x)
    got = banded.run_int8(x)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    outs = replay_on_planned_bytes(banded.ep, plan, [x])
    assert torch.equal(outs[0], small_mv2.run(x))
    # the portable plan too (no scratch: a different packing)
    replay_on_planned_bytes(banded.ep, banded.memory_for("portable"), [x])


@needs_gcc
def test_banded_mv2_small_host_c_byte_exact(small_mv2, banded_small, tmp_path):
    banded = banded_small
    x = torch.randn(small_mv2.inputs[0].shape, generator=torch.Generator().manual_seed(4))
    run = banded.c_run(x, kernels="portable")
    assert all(torch.equal(a, b) for a, b in zip(small_mv2.run_int8(x), run.outputs))
    banded.save(tmp_path / "p")
    again = corten.load(tmp_path / "p")  # the schedule survives save/load
    assert again.schedule is not None and again.memory.arena_bytes == banded.memory.arena_bytes
    png = banded.memory.plot(tmp_path / "timeline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_qemu
def test_banded_mv2_small_on_qemu_m4_portable_byte_exact(small_mv2, banded_small):
    x = torch.randn(small_mv2.inputs[0].shape, generator=torch.Generator().manual_seed(6))
    run = banded_small.c_run(x, on="qemu", kernels="portable", target="cortex-m4")
    assert all(torch.equal(a, b) for a, b in zip(small_mv2.run_int8(x), run.outputs))


@needs_cmsis_nn
def test_banded_mv2_small_host_cmsis_nn_byte_exact(small_mv2, banded_small):
    x = torch.randn(small_mv2.inputs[0].shape, generator=torch.Generator().manual_seed(7))
    run = banded_small.c_run(x, kernels="cmsis-nn")
    assert all(torch.equal(a, b) for a, b in zip(small_mv2.run_int8(x), run.outputs))


def test_segment_output_trails_its_consumed_input_byte_exact(small_mv2):
    """At 48 KiB a segment's output is placed over the rows of its input that no later band reads
    (plan.cats_over_inputs, shift <= 0 from the input's first byte): replayed on the planned bytes
    for both kernel flavours, on the host in C (portable, and CMSIS-NN when present)."""
    banded = small_mv2.fit_budget(48 * 1024)
    x = torch.randn(small_mv2.inputs[0].shape, generator=torch.Generator().manual_seed(8))
    want = small_mv2.run_int8(x)
    for kernels in ("cmsis-nn", "portable"):
        plan = banded.memory_for(kernels)
        assert plan.cats_over_inputs and set(plan.cats_over_inputs) <= set(plan.placed_cats)
        for cat, (src, shift) in plan.cats_over_inputs.items():
            assert shift <= 0 and shift % plan.alignment == 0
            assert plan.tensors[cat].offset == plan.tensors[src].offset + shift  # trailing it, in its bytes
            assert plan.lifetimes[src][1] < plan.lifetimes[cat][1]  # the input dies while the bands run
        assert torch.equal(replay_on_planned_bytes(banded.ep, plan, [x])[0], small_mv2.run(x))
    assert banded.memory.arena_bytes <= 48 * 1024
    if shutil.which("gcc"):
        assert all(torch.equal(a, b) for a, b in zip(want, banded.c_run(x, kernels="portable").outputs))
    if os.environ.get("CMSIS_NN_PATH"):
        assert all(torch.equal(a, b) for a, b in zip(want, banded.c_run(x, kernels="cmsis-nn").outputs))


def test_budget_error_names_smallest_arena_and_layer(small_mv2):
    with pytest.raises(BudgetError) as e:
        small_mv2.fit_budget(2048)
    msg = str(e.value)
    assert "smallest found is" in msg and "max_arena is 2,048 B" in msg and "The step that sets it" in msg
    assert "Raise max_arena" in msg


def test_flash_budget_still_refuses(small_mv2):
    with pytest.raises(BudgetError, match="flash"):
        small_mv2.fit_budget(None, max_flash=1000)


class _PoolNet(torch.nn.Module):
    """Conv, max pool, a residual block with an average pool, ReLU6, a strided depthwise conv, head."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.a = nn.Sequential(nn.Conv2d(16, 32, 1), nn.ReLU6(), nn.AvgPool2d(3, 1, 1, count_include_pad=False),
                               nn.Conv2d(32, 16, 1))
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 5, 2, 2, groups=16), nn.Hardswish(), nn.Conv2d(16, 24, 1))
        self.head = nn.Linear(24, 5)

    def forward(self, x):
        x = self.pool(self.stem(x))
        x = x + self.a(x)
        x = self.dw(x)
        return self.head(x.mean((2, 3)))


@needs_gcc
def test_any_cnn_with_pools_fits_a_budget_byte_exact(tmp_path):
    torch.manual_seed(0)
    model = _PoolNet().eval()
    example = (torch.randn(1, 3, 40, 36),)
    calib = [(torch.randn(1, 3, 40, 36),) for _ in range(4)]
    plain = corten.compile(model, example, calibration=calib, name="poolnet")
    before = plain.memory.arena_bytes
    budget = before * 3 // 4
    banded = corten.compile(model, example, calibration=calib, name="poolnet", max_arena=budget)
    plan = banded.memory
    assert plan.arena_bytes <= budget
    ops = {op for s in banded.schedule.segments for op in s.nodes}
    assert any("pool" in n for n in ops)  # the max pool runs in bands too
    x = torch.randn(example[0].shape, generator=torch.Generator().manual_seed(2))
    want = plain.run_int8(x)
    assert all(torch.equal(a, b) for a, b in zip(want, banded.run_int8(x)))
    replay_on_planned_bytes(banded.ep, plan, [x])
    replay_on_planned_bytes(banded.ep, banded.memory_for("portable", "cortex-m4"), [x])
    run = banded.c_run(x, kernels="portable")
    assert all(torch.equal(a, b) for a, b in zip(want, run.outputs))


def test_cli_max_arena_searches_and_plots(tmp_path, capsys):
    from corten.cli import main as cli_main

    net = tmp_path / "net.py"
    net.write_text("import torch, sys\nsys.path.insert(0, %r)\nfrom test_banding import _PoolNet\n\n"
                   "def make():\n    torch.manual_seed(0)\n    return _PoolNet().eval(), (torch.randn(1, 3, 40, 36),)\n"
                   % str(__import__("pathlib").Path(__file__).parent))
    out, png = tmp_path / "o", tmp_path / "t.png"
    rc = cli_main(["compile", f"{net}:make", "--out", str(out), "--calib", "2", "--max-arena", "21000",
                   "--max-flash", "100000", "--plot", str(png)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "budget: fits" in text and "banded segment" in (out / "report.txt").read_text()
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert corten.load(out).schedule is not None


@pytest.mark.slow
def test_mv2_fits_256_kib_byte_exact_on_the_host():
    """MobileNetV2-224 (1.5 MB layer by layer) in a 256 KiB arena, the same bytes as unbanded."""
    from corten.zoo import get_model

    model, example = get_model("mv2")
    plain = corten.compile(model, example, target="cortex-m55", name="mv2")
    banded = plain.fit_budget(256 * 1024)
    assert banded.memory.arena_bytes <= 256 * 1024 < plain.memory.arena_bytes
    assert banded.schedule.extra_macs_pct < 25
    x = torch.randn(example[0].shape, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(plain.run_int8(x), banded.run_int8(x)))
    replay_on_planned_bytes(banded.ep, banded.memory, [x])


def test_banded_program_is_built_without_a_second_export_and_equals_one(small_mv2, banded_small):
    """``banding.banded_program`` (no torch.export of the banded graph) gives the program a
    re-export of its module gives: the same ops, arguments and tensor types, the same plan."""
    from corten.memory import plan_memory

    ep = banded_small.ep
    again = torch.export.export(banded_small.module(), tuple(torch.zeros(s.shape) for s in small_mv2.inputs))
    a = [n for n in ep.graph.nodes if n.op == "call_function"]
    b = [n for n in again.graph.nodes if n.op == "call_function"]
    assert [n.target for n in a] == [n.target for n in b]
    pos_a = {n: i for i, n in enumerate(n for n in ep.graph.nodes if n.op != "placeholder")}
    pos_b = {n: i for i, n in enumerate(n for n in again.graph.nodes if n.op != "placeholder")}
    const_a = {n: ("const", tuple(n.meta["val"].shape)) for n in ep.graph.nodes if n.op == "placeholder"}
    const_b = {n: ("const", tuple(n.meta["val"].shape)) for n in again.graph.nodes if n.op == "placeholder"}
    for x, y in zip(a, b):
        vx, vy = x.meta["val"], y.meta["val"]
        assert (tuple(vx.shape), vx.dtype, vx.stride()) == (tuple(vy.shape), vy.dtype, vy.stride()), x.name
        ax = torch.fx.node.map_arg(x.args, lambda n: pos_a.get(n, const_a.get(n)))
        ay = torch.fx.node.map_arg(y.args, lambda n: pos_b.get(n, const_b.get(n)))
        assert ax == ay, x.name
    assert plan_memory(again, "cortex-m55", in_place_cats=True).arena_bytes == banded_small.memory.arena_bytes
    # band ops keep the source metadata of the op they compute rows of (node sources, C comments)
    sources = banded_small.info["node_sources"]
    convs = [n for n in a if "conv2d" in str(n.target)]
    assert len(convs) > len([n for n in small_mv2.ep.graph.nodes if n.op == "call_function" and "conv2d" in str(n.target)])
    assert all("stack_trace" in n.meta and sources[n.name]["module"] for n in convs)


@needs_gcc
def test_sequential_fits_a_budget_byte_exact(tmp_path):
    """``nn.Sequential``'s forward argument is named ``input`` (a builtin); the banded program's
    copy of the graph renames that placeholder, and its signature follows (it raised torch's
    SpecViolationError).  API, save/load and the CLI."""
    from corten.cli import main as cli_main

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)).eval()
    example = (torch.randn(1, 3, 32, 32),)
    plain = corten.compile(model, example, name="seq")
    banded = corten.compile(model, example, name="seq", max_arena=plain.memory.arena_bytes * 3 // 4)
    assert banded.schedule is not None and banded.memory.arena_bytes < plain.memory.arena_bytes
    x = torch.randn(example[0].shape, generator=torch.Generator().manual_seed(1))
    want = plain.run_int8(x)
    assert all(torch.equal(a, b) for a, b in zip(want, banded.run_int8(x)))
    assert all(torch.equal(a, b) for a, b in zip(want, banded.c_run(x, kernels="portable").outputs))
    banded.save(tmp_path / "p")
    assert all(torch.equal(a, b) for a, b in zip(want, corten.load(tmp_path / "p").run_int8(x)))

    net = tmp_path / "net.py"
    net.write_text("import torch\nfrom torch import nn\n\ndef make():\n    torch.manual_seed(0)\n"
                   "    return (nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))"
                   ".eval(), (torch.randn(1, 3, 32, 32),))\n")
    rc = cli_main(["compile", f"{net}:make", "--out", str(tmp_path / "o"), "--calib", "2",
                   "--max-arena", str(plain.memory.arena_bytes * 3 // 4)])
    assert rc == 0
    assert corten.load(tmp_path / "o").schedule is not None
