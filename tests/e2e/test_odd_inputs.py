"""Inputs that trip compilers: 0-d and size-1 dims, strided and stride-0 inputs, integers and bools,
NaN and Inf, empty tensors, mixed dtypes. Every case is compared with eager, on the reference
interpreter and on the CPU backend (where strides and dtypes meet generated code)."""
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_matches_eager


@pytest.fixture(params=["interpret", "cpu"])
def backend(request):
    return request.param


def _grad(*xs):
    return tuple(x.requires_grad_() for x in xs)


# ---- shapes: 0-d, size-1 dims ---------------------------------------------------------------------

def test_zero_dim_tensors(backend):
    def f(s, x):  # s: (), x: (4, 3)
        return s * x + s.exp(), (s * s).sum(), x.sum() / s, torch.where(s > 0, x, -x).amax()
    assert_matches_eager(f, *_grad(torch.tensor(0.7), torch.randn(4, 3)), backend=backend)


def test_zero_dim_reductions_and_views(backend):
    def f(s):
        return s.sum(0), s.amax(), s.unsqueeze(0).expand(3), s.reshape(1, 1), F.softmax(s, 0), s.argmax()
    assert_matches_eager(f, *_grad(torch.tensor(-1.5)), backend=backend)


def test_size_one_dims(backend):
    def f(x, y):  # x: (1, 5, 1), y: (3, 1, 1)
        z = x * y                                     # (3, 5, 1)
        return z.sum(dim=(0, 2)), x.squeeze(), z.mean(-1, keepdim=True), F.softmax(x, dim=0), x.var(dim=1)
    assert_matches_eager(f, *_grad(torch.randn(1, 5, 1), torch.randn(3, 1, 1)), backend=backend)


# ---- layouts: transposed, sliced, expanded ---------------------------------------------------------

def test_transposed_and_permuted_inputs(backend):
    x = torch.randn(5, 4).t()                          # (4, 5), strides (1, 4)
    y = torch.randn(4, 5, 3).permute(2, 0, 1)          # (3, 4, 5)
    assert not x.is_contiguous() and not y.is_contiguous()

    def f(x, y):
        return (x * 2 + y).sum(0), F.layer_norm(y, (5,)), x @ x.t()
    assert_matches_eager(f, *_grad(x, y), backend=backend)


def test_sliced_inputs(backend):
    base = torch.randn(6, 8)
    x = base[1::2, ::3]                                # (3, 3), strides (16, 3), offset 8
    assert not x.is_contiguous() and x.storage_offset() > 0
    assert_matches_eager(lambda x: (x.exp() * x).cumsum(1).sum(0) + x.amin(0), *_grad(x.detach()), backend=backend)


def test_expanded_stride_zero_inputs(backend):
    x = torch.randn(3, 1).expand(3, 4)                 # stride 0 along dim 1
    y = torch.randn(4).expand(2, 3, 4)                 # strides (0, 0, 1)
    assert 0 in x.stride() and y.stride()[:2] == (0, 0)
    assert_matches_eager(lambda x, y: (x * y).sum(-1) + x.sum(), x, y, backend=backend)


def test_views_into_matmuls_and_out(backend):
    """Chains of views between inputs, kernels and matmuls run as one as_strided each (static layouts):
    an input at a storage offset, a size-1 dim with an odd stride, an expanded batch, an empty batch,
    and outputs that are views of inputs, of an mm result and of a kernel's buffer."""
    x = torch.randn(40)[4:28].view(4, 6)                 # contiguous, storage offset 4
    w = torch.randn(6).as_strided((1, 6), (99, 1))       # contiguous: a size-1 dim's stride is free
    b = torch.randn(3, 6, 5)
    e = torch.randn(0, 4, 6)

    def f(x, w, b, e):
        h = x @ w.expand(4, 6).t()                       # (4, 4) from two views of inputs
        bb = torch.bmm(x.unsqueeze(0).expand(3, 4, 6), b)  # expanded batch, stride 0
        k = (h.exp() + 1).t()                            # a view of a kernel's buffer
        return h.t()[1:], bb.permute(2, 0, 1), k.reshape(16)[::3], torch.bmm(e, x.t().unsqueeze(0).expand(0, 6, 4)), x.t()
    c = assert_matches_eager(f, *_grad(x.detach().clone(), w.detach().clone(), b, e), backend=backend)
    with torch.no_grad():  # the odd layouts themselves (assert_matches_eager passes clones)
        for got, want in zip(c(x, w, b, e), f(x, w, b, e), strict=True):
            torch.testing.assert_close(got, want)


# ---- integers and bools ------------------------------------------------------------------------------

def test_int_arithmetic(backend):
    a = torch.randint(-20, 20, (4, 5))
    b = torch.randint(1, 7, (4, 5))

    def f(a, b):
        return (a + b, a * b - 3, a // b, a % b, -a, a.abs(), torch.div(a, b, rounding_mode="trunc"),
                a.sum(), a.sum(0, dtype=torch.int32), a.amax(1), a.prod(1), a.argmin(0), a.pow(2), a.clamp(-5, 5))
    assert_matches_eager(f, a, b, backend=backend)


def test_int_true_division_and_narrow_ints(backend):
    a = torch.randint(-20, 20, (6,), dtype=torch.int32)
    b = torch.randint(1, 5, (6,), dtype=torch.int16)
    # true division of ints is float; i32 op i16 promotes to i32; i8 wraps around as eager's does
    c = torch.randint(-128, 127, (6,), dtype=torch.int8)
    assert_matches_eager(lambda a, b, c: (a / b, a + b, a * b, c * 3, (c + c).to(torch.int64)), a, b, c,
                         backend=backend)


def test_comparisons_and_bool_masks(backend):
    x = torch.randn(4, 6)
    i = torch.randint(0, 5, (4, 6))

    def f(x, i):
        m = (x > 0) & (i != 2)
        return (m, m.sum(), m.sum(1), (x <= 0.5).sum(dtype=torch.float32), torch.where(m, x, 0.0),
                x.masked_fill(~m, float("-inf")).amax(1), m.any(1), m.all(), m.float().mean(),
                m ^ (i > 3), ~m | (i == 0))
    assert_matches_eager(f, x, i, backend=backend)


def test_sum_of_bools_is_int64(backend):
    b = torch.rand(3, 7) > 0.5

    def f(b):
        return b.sum(), b.sum(-1), b.int().sum(0), b.long().cumsum(1), b.to(torch.float16).sum()
    out = assert_matches_eager(f, b, backend=backend)(b)
    assert out[0].dtype == torch.int64 and out[2].dtype == torch.int64


def test_bool_arithmetic(backend):
    a, b = torch.rand(5) > 0.5, torch.rand(5) > 0.3
    assert_matches_eager(lambda a, b: (a * b, a + b, torch.maximum(a, b), a.amax(), a.prod(), a.max(0)), a, b,
                         backend=backend)


# ---- NaN and Inf -------------------------------------------------------------------------------------

def test_max_min_with_nan(backend):
    x = torch.tensor([[1.0, float("nan"), 3.0], [2.0, -1.0, 0.5], [float("inf"), 1.0, float("-inf")]])
    y = torch.tensor([0.0, 5.0, float("nan")])

    def f(x, y):
        return (torch.maximum(x, y), torch.minimum(x, y), x.amax(1), x.amin(0), x.max(1), x.min(),
                x.argmax(1), torch.clamp(x, -1, 2), x.sum(1), F.relu(x))
    assert_matches_eager(f, x, y, backend=backend)


def test_softmax_of_all_minus_inf_row(backend):
    x = torch.randn(3, 4)
    x[1] = float("-inf")

    def f(x):
        return F.softmax(x, -1), F.log_softmax(x, -1), torch.logsumexp(x, -1), x.exp().sum(-1)
    assert_matches_eager(f, x, backend=backend)


def test_log_of_zero_and_negatives(backend):
    x = torch.tensor([0.0, -0.0, -1.0, 1e-45, 1.0, float("inf"), float("nan")])

    def f(x):
        return x.log(), x.log1p(), x.sqrt(), x.rsqrt(), 1 / x, x.log2(), torch.nan_to_num(x.log()), x.sign()
    assert_matches_eager(f, x, backend=backend)


# ---- empty tensors ------------------------------------------------------------------------------------

def test_empty_tensors(backend):
    x = torch.randn(0, 5)
    y = torch.randn(3, 5)

    def f(x, y):
        return (x + 1, x.sum(0), x.sum(), x.mean(0), x.amax(1), torch.cat([x, y]), x.t() @ x, y[:0] * 2,
                x.reshape(5, 0), F.softmax(x, -1))
    assert_matches_eager(f, x, y, backend=backend)


def test_empty_dim_gradients(backend):
    x, w = torch.randn(2, 0, 4), torch.randn(4, 3)
    assert_matches_eager(lambda x, w: (x @ w).relu() + 1, *_grad(x, w), backend=backend)


# ---- mixed dtypes -----------------------------------------------------------------------------------

def test_int_tensor_with_float_scalar(backend):
    i = torch.randint(-5, 5, (3, 4))
    assert_matches_eager(lambda i: (i + 0.5, i * 2.5, i / 2, i > 1.5, torch.where(i > 0, i, 0.25), i ** 0.5), i,
                         backend=backend)


def test_half_with_float(backend):
    h = torch.randn(4, 3, dtype=torch.float16)
    f = torch.randn(4, 3)
    out = assert_matches_eager(lambda h, f: (h + f, h * 2.0, h.float().sum(0) + f.sum(0), h + f.sum()), h, f,
                               backend=backend)(h, f)
    assert out[0].dtype == torch.float32 and out[1].dtype == torch.float16 and out[3].dtype == torch.float16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_reductions_accumulate_like_eager(dtype, backend):
    x = torch.randn(64, 256).to(dtype)
    assert_matches_eager(lambda x: (x.sum(-1), x.mean(0), F.softmax(x, -1), x.var(1), x.amax()), x,
                         backend=backend)


def test_bool_int_float_promotion(backend):
    b, i = torch.rand(5) > 0.5, torch.randint(0, 9, (5,), dtype=torch.int32)
    f = torch.randn(5, dtype=torch.float64)
    assert_matches_eager(lambda b, i, f: (b + i, i * f, b * f, i.to(torch.int64) + i, b & (i > 3)), b, i, f,
                         backend=backend)


# ---- indices out of range ----------------------------------------------------------------------------

def test_out_of_range_indices_raise_like_eager(backend):
    """Eager raises IndexError, for negative indices too; so does a compiled gather, naming the op and
    the line, and the next call with good indices runs normally (the kernel's flag is cleared)."""
    import minicomp
    x = torch.randn(6, 3)

    def f(x, i):
        rows = F.embedding(i, x) * 2
        return rows, torch.gather(x, 0, (i % 6).view(-1, 1).expand(-1, 3))
    c = minicomp.compile(f, backend=backend)
    good = torch.tensor([0, 5, 2])
    for bad in (torch.tensor([0, 6, 2]), torch.tensor([0, -1, 2])):
        with pytest.raises(IndexError) as info:
            c(x, bad)
        if backend == "cpu":  # the one site that read out of range, with its line
            assert str(info.value).startswith("minicomp: index out of range in index_select at test_odd_inputs.py:")
            assert "rows = F.embedding(i, x) * 2 (a dimension of size 6)" in str(info.value)
        torch.testing.assert_close(c(x, good), f(x, good))


@pytest.mark.parametrize("backend", ["interpret", "cpu", "cuda_emu"])
def test_index_add_copy_fill_take_indices_as_eager(backend):
    """index_add and index_copy raise on a negative index as eager does (their
    decompositions, an index_put, counted it from the end), and index_fill takes one as eager does;
    values and gradients match eager's."""
    import minicomp

    def f(x, i, src):
        return x.index_add(0, i, src * 2), x.index_copy(0, i, src.sin()), x.index_fill(1, i[1:], -1.5) * x
    x, src = torch.randn(5, 3), torch.randn(2, 3)
    assert_matches_eager(f, x.clone().requires_grad_(), torch.tensor([4, 1]), src.clone().requires_grad_(),
                         backend=backend)
    for op in (lambda x, i, s: x.index_add(0, i, s), lambda x, i, s: x.index_copy(0, i, s)):
        for bad in (torch.tensor([0, -1]), torch.tensor([0, 5])):
            with pytest.raises((IndexError, RuntimeError)) as want:  # which one depends on eager's kernel
                op(x, bad, src)
            with pytest.raises(want.type):
                minicomp.compile(op, backend=backend)(x, bad, src)
    fill = minicomp.compile(lambda x, i: x.index_fill(0, i, 3.0), backend=backend)
    torch.testing.assert_close(fill(x, torch.tensor([0, -1])), x.index_fill(0, torch.tensor([0, -1]), 3.0))


def test_an_error_inside_a_torch_module_names_the_module_not_minicomp():
    """A torch.nn module compiled directly leaves Dynamo no frame of the user's: the error names the
    module (and the submodule path), never minicomp's own entry code."""
    import minicomp
    for model, where in ((torch.nn.Embedding(5, 2), "torch.nn.modules.sparse.Embedding (the compiled module itself)"),
                         (torch.nn.Sequential(torch.nn.Identity(), torch.nn.Sequential(torch.nn.Embedding(5, 2))),
                          "torch.nn.modules.sparse.Embedding (submodule 1.0)")):
        with pytest.raises(IndexError) as info:
            minicomp.compile(model, backend="cpu")(torch.tensor([7]))
        assert f"index_select at {where}" in str(info.value)
        assert "api.py" not in str(info.value)


def test_a_gather_from_a_cat_of_scalars_checks_its_index(backend):
    """Found by the fuzzer (seed 100388, a segfault): each cat part is a 0-d input, so the index read
    from memory appears only in the parts' select conditions, which the kernel's check-site walk
    missed; the check then shifted by bit -1 into a flag word never allocated."""
    import minicomp

    def f(a, i):
        return torch.gather(torch.cat([a.reshape(1), a.reshape(1) * 2]), 0, i)
    c = minicomp.compile(f, backend=backend)
    a = torch.randn(())
    for i in (torch.tensor([0]), torch.tensor([1]), torch.tensor([1, 0, 1])):
        torch.testing.assert_close(c(a, i), f(a, i))
    with pytest.raises((IndexError, RuntimeError), match="out of (range|bounds)"):  # as eager's
        c(a, torch.tensor([2]))
    torch.testing.assert_close(c(a, torch.tensor([1])), f(a, torch.tensor([1])))


def test_out_of_range_index_in_a_threaded_gather():
    import minicomp
    x = torch.randn(4096, 512)
    i = torch.randint(0, 4096, (4096,))
    i[3000] = 4096  # in the second thread's half
    c = minicomp.compile(lambda x, i: torch.index_select(x, 0, i) + 1, backend="cpu")
    with pytest.raises(IndexError, match="index_select"):
        c(x, i)
    i[3000] = 7
    torch.testing.assert_close(c(x, i), torch.index_select(x, 0, i) + 1)


def test_a_gather_inside_a_cat_part_is_checked_only_where_selected(backend):
    """Fused, each cat part is evaluated at every position and masked: the flip's reversed index runs
    past its part there, which is no error (the prod backward in the zoo does this too)."""
    x = torch.randn(3, 4)
    assert_matches_eager(lambda x: torch.cat([torch.ones(3, 1), x.flip(1)], 1) * 2, *_grad(x), backend=backend)


def test_integer_division_by_zero_raises_like_eager(backend):
    """Eager raises RuntimeError("ZeroDivisionError"); the CPU kernel raises an error that is both a
    ZeroDivisionError and a RuntimeError, naming the op and the line. Division inside a cat part is
    checked only where the part is selected (its masked positions read the divisor's first element)."""
    import minicomp
    a, c = torch.randint(-50, 50, (8,)), torch.tensor([0, 1, 2, 3, -4, 5, -6, 7])

    def f(a, c):
        q = a[1:] // c[1:]
        return torch.cat([a[:1], q]), torch.cat([a[:1], a[1:] % c[1:]])
    comp = minicomp.compile(f, backend=backend)
    torch.testing.assert_close(comp(a, c), f(a, c))
    bad = c.clone()
    bad[3] = 0
    with pytest.raises(RuntimeError) as info:
        comp(a, bad)
    if backend == "cpu":
        assert isinstance(info.value, ZeroDivisionError)
        assert str(info.value).startswith("minicomp: integer division by zero in div_floor at test_odd_inputs.py:")
    torch.testing.assert_close(comp(a, c), f(a, c))


# ---- outputs that would alias what the caller gave -------------------------------------------------

@pytest.mark.parametrize("be", ["interpret", "cpu", "cuda_emu"])
def test_a_clone_of_an_input_or_buffer_is_a_new_tensor(be):
    """clone() is nothing in the IR (a value is a logical tensor): returned as is, it would be the
    caller's own tensor, and an in-place update of the result would change the input."""
    import minicomp

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.arange(4.0))

        def forward(self, x):
            return x.clone(), x.contiguous(), self.b.clone(), x.view(16)  # the view is an alias, as in eager
    m = minicomp.compile(M(), backend=be)
    x = torch.randn(4, 4)
    a, c, b, v = m(x)
    assert a.data_ptr() != x.data_ptr() and b.data_ptr() != m.b.data_ptr()
    assert v.data_ptr() == x.data_ptr()
    a.add_(1)
    b.add_(1)
    torch.testing.assert_close(a, x + 1)
    torch.testing.assert_close(m.b, torch.arange(4.0))
    assert c.data_ptr() == x.data_ptr() or torch.equal(c, x)  # contiguous() of a contiguous tensor may alias


def test_division_by_zero_infinite_and_denormal_divisors(backend):
    """g / sqrt(x) at x = 0 and inf (sqrt's own gradient at 0 is such a division), and a division by
    a denormal row sum: a multiply by a reciprocal would give NaN, NaN and inf here."""
    def f(g, x, y):
        return g / x.sqrt(), g * 0.5 / x.sqrt(), y / y.sum(-1, keepdim=True), x.sqrt()
    g = torch.ones(4)
    x = torch.tensor([0.0, float("inf"), 4.0, 1e-30])
    y = torch.full((2, 8), 1e-40)
    assert_matches_eager(f, g, x.requires_grad_(), y, backend=backend)


def test_division_edge_cases_on_cuda_emu():
    def f(g, x, y):
        return g / x.sqrt(), y / y.sum(-1, keepdim=True)
    assert_matches_eager(f, torch.ones(4), torch.tensor([0.0, float("inf"), 4.0, 1e-30]),
                         torch.full((2, 8), 1e-40), backend="cuda_emu")


@pytest.mark.parametrize("backend_name", ["cpu", "cuda_emu"])
def test_a_chain_of_hundreds_of_ops_splits_into_kernels(backend_name):
    """An unrolled loop of 500 pointwise ops (and one of composites: gelu's erf) compiles: a kernel
    inlines a bounded chain and stores where it stops (before, Python's recursion limit was hit)."""
    def chain(x):
        for _ in range(500):
            x = x.sin()
        return x

    def gelus(x):
        for _ in range(300):
            x = F.gelu(x) * 0.9 + 0.1
        return x
    for f in (chain, gelus):
        c = assert_matches_eager(f, torch.randn(4, 8), backend=backend_name)
        (g,) = c.report().graphs
        assert 2 <= g.detail["kernels"] <= 40

    def mixing(*xs):  # the chain meets inputs at every depth, past the bound too
        y = xs[0]
        for i in range(150):
            y = torch.sin(y) * xs[(i + 1) % len(xs)] if i % 2 else y + xs[(i + 1) % len(xs)]
        return y
    assert_matches_eager(mixing, *[torch.randn(4, 8) for _ in range(26)], backend=backend_name)


@pytest.mark.parametrize("be", ["interpret", "cpu", "cuda_emu"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_the_most_negative_integer_divided_by_minus_one(be, dtype):
    """INT_MIN // -1 overflows: torch gives the wrapped quotient (INT_MIN) and remainder 0; x86's
    division traps, which killed a cuda_emu process with SIGFPE."""
    import minicomp
    lo = torch.iinfo(dtype).min
    x = torch.tensor([lo, 7, -7, 5, lo], dtype=dtype)
    y = torch.tensor([-1, -1, 2, -3, 3], dtype=dtype)

    def f(x, y):
        return x // y, x % y, torch.fmod(x, y), torch.remainder(x, y)
    assert_matches_eager(f, x, y, backend=be)
    trunc = minicomp.compile(lambda x, y: torch.div(x, y, rounding_mode="trunc"), backend=be)(x, y)
    assert trunc.tolist() == [lo, -7, -3, -1, -(-lo // 3)]  # eager's own trunc division traps here


def test_pow_by_a_number_computes_as_eager(backend):
    """A Python-number exponent: eager takes 0.5 and -0.5 as sqrt and rsqrt, whose values at -inf
    and -0 differ from pow's ((-inf) ** 0.5 is NaN, not inf); other exponents are pow."""
    x = torch.tensor([float("-inf"), -4.0, -0.0, 0.0, 0.25, 4.0, float("inf"), float("nan")])

    def f(x):
        return x ** 0.5, torch.pow(x, -0.5), x ** 2, x ** 1, x ** 3, x ** -1, x ** -2, x ** 1.5, x ** 0
    assert_matches_eager(f, x, backend=backend)
    assert_matches_eager(lambda a: (a ** 2, a ** 0.5, a ** 3), torch.tensor([-3, 0, 5]), backend=backend)


@pytest.mark.parametrize("be", ["cpu", "cuda_emu"])
def test_small_integer_powers_are_eagers_products_bit_for_bit(be):
    """Eager's float kernel computes x ** 3 as x*x*x, x ** -2 as 1/(x*x) and x ** -1 as 1/x, and any
    integer dtype's x ** 3 wraps as the product does: the same bits, not pow's (a GELU's tanh form
    is x ** 3)."""
    import minicomp
    f = lambda x: (x ** 3, x ** 3.0, x ** -2, x ** -1.0)  # noqa: E731
    for dt in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.cat([torch.randn(999) * 3, torch.tensor([0.0, -0.0, 1e-30, 3e12, float("inf"), float("nan")])]).to(dt)
        for got, want in zip(minicomp.compile(f, backend=be)(x), f(x)):
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()], want[~want.isnan()]), dt
    for dt in (torch.int32, torch.int64, torch.uint8):
        x = torch.randint(0 if dt == torch.uint8 else -3000, 3000, (500,)).to(dt)
        assert torch.equal(minicomp.compile(lambda x: x ** 3, backend=be)(x), x ** 3), dt
    # an exponent near 3 is pow (NaN for a negative base), and float16 computes pow as eager's half kernel
    x = torch.randn(999) * 3
    g = lambda x: (x ** 3.01, x ** -2.004)  # noqa: E731
    for got, want in zip(minicomp.compile(g, backend=be)(x.bfloat16()), g(x.bfloat16())):
        torch.testing.assert_close(got, want, equal_nan=True)
        assert torch.equal(got.isnan(), want.isnan())
    h = lambda x: (x ** 3, x ** -2, x ** 3.5)  # noqa: E731
    for got, want in zip(minicomp.compile(h, backend=be)(x.half()), h(x.half())):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_half_pow_by_a_half_is_pow_as_eager_computes_it(backend):
    """Eager's float16 kernel takes pow for ** 0.5 ((-inf) ** 0.5 is +inf there), its bfloat16
    and float32 ones sqrt (NaN)."""
    x = torch.tensor([float("-inf"), -0.0, 4.0])
    for dt in (torch.float16, torch.bfloat16):
        assert_matches_eager(lambda x: (x ** 0.5, x ** -0.5), x.to(dt), backend=backend)


def test_pow_by_a_number_computes_as_eager_on_cuda_emu():
    x = torch.tensor([float("-inf"), -4.0, -0.0, 0.25, 4.0, float("inf"), float("nan")])
    assert_matches_eager(lambda x: (x ** 0.5, x ** -0.5, x ** 1.5), x, backend="cuda_emu")


INVALID = {  # operands eager refuses: minicomp's kernels must not quietly compute something
    "bool minus a number": (lambda m: m - 0, torch.tensor([True, False]), "Subtraction"),
    "a number minus a bool": (lambda m: 1 - m, torch.tensor([True, False]), "Subtraction"),
    "integer to a negative power": (lambda a: a ** -1, torch.tensor([1, 2, -1]), "negative integer powers"),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_operands_eager_refuses_raise_its_error(name, backend):
    import minicomp
    fn, x, msg = INVALID[name]
    with pytest.raises(RuntimeError, match=msg):
        fn(x)
    with pytest.raises(RuntimeError, match=msg):
        minicomp.compile(fn, backend=backend)(x)
