"""Whatever Corten cannot compile ends in a CaptureError or an UnsupportedOpsError that names the op
(its count and source line) - never an AttributeError or a torch-internal exception.

Each case is a small model written the ordinary way; the test asserts the exception type, that the
message names the op and, for UnsupportedOpsError, that it gives the count and this file's line.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import corten
from corten.capture import CaptureError
from corten.program import UnsupportedOpsError


class Fn(nn.Module):
    def __init__(self, fn, **modules):
        super().__init__()
        self.fn = fn
        for k, v in modules.items():
            setattr(self, k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


def _while(s, x):
    from torch._higher_order_ops.while_loop import while_loop

    # (a loop whose trip count is constant is unrolled: tests/test_control_flow.py)
    return while_loop(lambda i, y: y.sum() < 100, lambda i, y: (i + 1, y * 2), (torch.tensor(0), x))[1]


def r(*shape):
    return (torch.randn(*shape),)


# name -> (forward, example inputs, expected exception, text the message must contain)
U, C = UnsupportedOpsError, CaptureError
CASES = {
    # data-dependent output shapes
    "nonzero": (lambda s, x: torch.nonzero(x).float(), r(1, 8), U, "aten.nonzero"),
    "where_one_arg": (lambda s, x: torch.where(x)[1].float(), r(1, 8), U, "aten.where"),
    "masked_select": (lambda s, x: torch.masked_select(x, x > 0), r(1, 8), U, "aten.masked_select"),
    "unique": (lambda s, x: torch.unique(x), r(1, 8), U, "aten._unique2"),
    "boolean_index": (lambda s, x: x[x > 0], r(1, 8), U, "aten.index"),
    # control flow
    "cond": (lambda s, x: torch.cond(x.sum() > 0, lambda y: y + 1, lambda y: y - 1, (x,)), r(1, 8), U,
             "higher_order.cond"),
    "while_loop": (_while, r(1, 8), U, "higher_order.while_loop"),
    # ops with no int8 lowering
    "lgamma": (lambda s, x: torch.lgamma(x), r(1, 8), U, "aten.lgamma"),
    "erfc": (lambda s, x: torch.erfc(x), r(1, 8), U, "aten.erfc"),
    "remainder": (lambda s, x: x % 2.0, r(1, 8), U, "aten.remainder"),
    "digamma": (lambda s, x: torch.digamma(x), r(1, 8), U, "aten.digamma"),
    "pow_tensor": (lambda s, x: (x.abs() + 1) ** x, r(1, 8), U, "aten.pow"),
    "atan2": (lambda s, x: torch.atan2(x, x), r(1, 8), U, "aten.atan2"),
    "cummax": (lambda s, x: torch.cummax(x, 1)[0], r(1, 8), U, "aten.cummax"),
    "cumprod": (lambda s, x: torch.cumprod(x, 1), r(1, 8), U, "aten.cumprod"),
    "sort": (lambda s, x: torch.sort(x)[0], r(1, 8), U, "aten.sort"),
    "topk": (lambda s, x: torch.topk(x, 2)[0], r(1, 8), U, "aten.topk"),
    "logcumsumexp": (lambda s, x: torch.logcumsumexp(x, 1), r(1, 8), U, "aten.logcumsumexp"),
    "kthvalue": (lambda s, x: torch.kthvalue(x, 2, 1)[0], r(1, 8), U, "aten.kthvalue"),
    "median": (lambda s, x: x.median(1)[0], r(1, 8), U, "aten.median"),
    "vector_norm_p3": (lambda s, x: x.norm(p=3, dim=1), r(1, 8), U, "aten.linalg_vector_norm"),
    "max_pool3d": (lambda s, x: F.max_pool3d(x, 2), r(1, 2, 4, 4, 4), U, "aten.max_pool3d"),
    "grid_sample": (lambda s, x: F.grid_sample(x, torch.zeros(1, 2, 2, 2), align_corners=False), r(1, 1, 4, 4), U,
                    "aten.grid_sampler"),
    "i0": (lambda s, x: torch.special.i0(x), r(1, 8), U, "aten.special_i0"),
    "conv_after_lgamma": (lambda s, x: s.conv(torch.lgamma(x)), r(1, 3, 6, 6), U, "aten.lgamma"),
    "weight_as_input": (lambda s, x, w: F.conv2d(x, w), (torch.randn(1, 2, 4, 4), torch.randn(3, 2, 1, 1)), U,
                        "aten.conv2d"),
    # a rank-5 broadcast the 4-loop elementwise kernels cannot walk (5 alternating broadcast dims)
    "rank5_scattered_broadcast": (lambda s, x, y: x + y, (torch.randn(2, 3, 4, 5, 6), torch.randn(1, 3, 1, 5, 1)), U,
                                  "aten.add"),
    # outputs and inputs Corten cannot take
    "returns_none": (lambda s, x: None, r(1, 8), C, "returns None"),
    "returns_int": (lambda s, x: (x * 2, 3), r(1, 8), C, "returns int"),
    "returns_int64_tensor": (lambda s, x: (x > 0).sum(), r(1, 8), C, "aten.sum"),
    "returns_index_arithmetic": (lambda s, x: torch.max(s.fc(x), 1)[1] + 1, r(1, 8), C, "torch.int64"),
    "int_input": (lambda s, x: s.emb(x), (torch.tensor([[1, 2]]),), C, "torch.int64"),
    "python_scalar_input": (lambda s, x, k: x * k, (torch.randn(1, 8), 2.0), C, "is a float"),
    "rank0_input": (lambda s, x: x * 2, (torch.tensor(1.0),), C, "rank 0"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refused_clearly(name):
    fn, inputs, exc, text = CASES[name]
    model = Fn(fn, conv=nn.Conv2d(3, 4, 3), fc=nn.Linear(8, 4), emb=nn.Embedding(4, 3)).eval()
    with pytest.raises(exc) as info:
        corten.compile(model, inputs)
    msg = str(info.value)
    assert text in msg, msg
    if exc is UnsupportedOpsError:
        op = text.split(".", 1)[1]
        assert any(n.op.startswith(text) or op in n.op for n in info.value.nodes), msg
        assert " x1" in msg or " x2" in msg, msg  # the op's count
        assert "test_refusals.py:" in msg, msg  # its source line in the user's code


def test_at_least_thirty_cases():
    assert len(CASES) >= 30
