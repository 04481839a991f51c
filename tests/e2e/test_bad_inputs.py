"""The bad-input catalogue: what a user can hand a compiled callable that it did not expect. Each case
gives eager's result (recompiled when needed) or a clear error naming what is wrong, and leaves the
callable working for the next call."""
from __future__ import annotations

import logging

import pytest
import torch

import minicomp
from minicomp.errors import UnsupportedOpError

BACKENDS = ["cpu", "cuda_emu"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def _quiet():
    logging.getLogger("minicomp").setLevel(logging.ERROR)


def test_new_rank_and_dtype_recompile(backend):
    def f(x):
        return (x * 2).sin().sum(-1)
    c = minicomp.compile(f, backend=backend)
    for x in (torch.randn(5), torch.randn(3, 5), torch.randn(2, 3, 5), torch.randn(3, 5, dtype=torch.float64),
              torch.randn(3, 5).half(), torch.arange(15).reshape(3, 5)):
        got = c(x)
        assert got.dtype == f(x).dtype and got.shape == f(x).shape
        torch.testing.assert_close(got, f(x), rtol=2e-3, atol=2e-3)
    assert len(c.report().graphs) == 6


def test_tensors_on_a_device_we_do_not_compile_run_in_torch(backend):
    """meta tensors (as mps or xpu ones would be) are not handed to CPU code (that read address 0 and
    crashed): the graph runs in torch, the report says so, CPU calls still compile."""
    _quiet()
    c = minicomp.compile(lambda x: x.sin() * 2, backend=backend)
    out = c(torch.randn(3, 4, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 4)
    assert any("meta tensors" in m and "runs in torch" in m for m in c.report().eager)
    x = torch.randn(3, 4)
    torch.testing.assert_close(c(x), x.sin() * 2)
    assert c.report().graphs


def test_mixed_devices_raise_like_eager(backend):
    _quiet()
    c = minicomp.compile(lambda a, b: a + b, backend=backend)
    with pytest.raises(RuntimeError, match="device"):
        torch.randn(3) + torch.randn(3, device="meta")  # eager's behaviour: an error
    with pytest.raises(RuntimeError, match="device"):
        c(torch.randn(3), torch.randn(3, device="meta"))
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(c(a, b), a + b)  # nothing left half-built


@pytest.mark.parametrize("how", ["same", "overlapping"])
def test_inputs_that_alias_each_other_and_are_mutated(backend, how):
    def f(a, b):
        a.mul_(2)
        return a + b
    c = minicomp.compile(f, backend=backend)
    x, y = torch.arange(6.), torch.arange(6.)
    args = (lambda t: (t, t)) if how == "same" else (lambda t: (t[:4], t[2:]))
    got, want = c(*args(x)), f(*args(y))
    assert torch.equal(got, want) and torch.equal(x, y)


def test_outputs_that_alias_inputs(backend):
    _quiet()
    x = torch.arange(8.)
    ident = minicomp.compile(lambda a: a, backend=backend)
    assert ident(x) is x
    view = minicomp.compile(lambda a: (a.view(2, 4), a * 2), backend=backend)
    v, d = view(x)
    assert v.data_ptr() == x.data_ptr() and v.shape == (2, 4)  # a view, as eager's is
    x[0] = 100.
    assert v[0, 0] == 100. and torch.equal(d, torch.arange(8.) * 2)


def test_in_place_mutation_of_inputs_through_a_view(backend):
    def g(a):
        b = a.view(2, 3)
        b.add_(1)
        return b.sum(1), a
    c = minicomp.compile(g, backend=backend)
    x, y = torch.arange(6.), torch.arange(6.)
    got, want = c(x), g(y)
    assert torch.equal(got[0], want[0]) and got[1] is x and torch.equal(x, y)


def test_module_buffers_mutated_in_forward(backend):
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(()))

        def forward(self, x):
            self.n += 1
            return x + self.n
    m = Counter()
    c = minicomp.compile(m, backend=backend)
    for i in range(1, 4):
        assert torch.equal(c(torch.zeros(2)), torch.full((2,), float(i)))
    assert m.n.item() == 3.0

    torch.manual_seed(0)
    bn, ref = torch.nn.BatchNorm1d(4), torch.nn.BatchNorm1d(4)
    cb = minicomp.compile(bn, backend=backend)
    for _ in range(3):
        x = torch.randn(8, 4)
        torch.testing.assert_close(cb(x), ref(x))
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    assert bn.num_batches_tracked.item() == ref.num_batches_tracked.item() == 3


def test_data_dependent_shapes_match_eager_and_are_named(backend):
    _quiet()
    def f(x):
        return x[x > 0] * 2, torch.nonzero(x), x.cos()
    c = minicomp.compile(f, backend=backend)
    x = torch.randn(10)
    for got, want in zip(c(x), f(x)):
        torch.testing.assert_close(got, want)  # cos: within an ulp of eager's
    assert any("nonzero" in m or "data" in m.lower() for m in c.report().eager), c.report().eager


def test_unsupported_op_under_strict_names_the_op_and_the_line(backend):
    def model(x):
        y = x + 1
        return torch.linalg.svd(y)[0]
    c = minicomp.compile(model, backend=backend, strict=True)
    with pytest.raises(UnsupportedOpError) as e:
        c(torch.randn(3, 3))
    assert "svd" in str(e.value) and "test_bad_inputs.py" in str(e.value) and "torch.linalg.svd(y)" in str(e.value)
    # without strict the same model runs, the op in torch
    x = torch.randn(3, 3)
    torch.testing.assert_close(minicomp.compile(model, backend=backend)(x), model(x))


def test_a_model_that_raises_inside_forward_keeps_working(backend):
    _quiet()
    class Picky(torch.nn.Module):
        def forward(self, x, fail: bool):
            y = x * 2
            if fail:
                raise ValueError("asked to fail")
            return y.sin()
    c = minicomp.compile(Picky(), backend=backend)
    x = torch.randn(4)
    torch.testing.assert_close(c(x, False), (x * 2).sin())
    with pytest.raises(ValueError, match="asked to fail"):
        c(x, True)
    torch.testing.assert_close(c(x, False), (x * 2).sin())
    with pytest.raises(ValueError, match="asked to fail"):
        c(x, True)

    def data_dependent(x):
        if x.sum() > 100:
            raise ValueError("too big")
        return x * 3
    d = minicomp.compile(data_dependent, backend=backend)
    with pytest.raises(ValueError, match="too big"):
        d(torch.full((3,), 100.))
    assert torch.equal(d(torch.ones(3)), torch.full((3,), 3.))


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (2, 0, 4)])
def test_empty_tensors_in_every_op_family(backend, shape):
    def f(x):
        return x.sin() + 1, x.sum(-1), x.amax(0) if x.shape[0] else x.sum(0), torch.cat([x, x * 2], -1), x.t() if x.ndim == 2 else x
    c = minicomp.compile(f, backend=backend)
    x = torch.randn(shape)
    for got, want in zip(c(x), f(x)):
        assert got.shape == want.shape and torch.equal(got, want)


def test_recompile_limit_warns_naming_the_limit_and_the_signature(backend, caplog):
    c = minicomp.compile(lambda x: x + 1, backend=backend, max_programs=2, dynamic=False)  # a program per size
    with caplog.at_level(logging.WARNING, logger="minicomp"):
        for n in (1, 2, 3, 4):
            x = torch.randn(n)
            assert torch.equal(c(x), x + 1)  # past the limit: eagerly, still right
    warned = [r.getMessage() for r in caplog.records if "max_programs" in r.getMessage()]
    assert len(warned) == 1, warned  # once, not once per call
    assert "max_programs=2" in warned[0] and "f32[3]" in warned[0]
    assert len(c.report().graphs) == 2
