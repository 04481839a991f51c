"""split_reductions: a big full reduction becomes P partial rows plus a reduction of the partials."""
import pytest
import torch

import minicomp
from minicomp.compiler.capture import make_context
from minicomp.compiler.passes import split_reductions
from minicomp.ir import parse
from minicomp.options import Options

from tests.helpers import assert_matches_eager

from .check import check_pass


def split(graph, _ctx=None):
    return split_reductions.run(graph, make_context(Options(backend="cpu"), "t", "cpu"))


def test_a_full_max_becomes_256_rows_then_one():
    check_pass(split, """
        graph g(%x: f32[512,256]) -> (f32[]) {
          %0: f32[512,256] = exp %x
          %1: f32[] = amax %0 [dims=(0, 1), keepdim=false]
          return %1
        }
    """, """
        graph g(%x: f32[512,256]) -> (f32[]) {
          %0: f32[512,256] = exp %x
          %1: f32[256,512] = reshape %0 [shape=(256, 512)]
          %2: f32[256] = amax %1 [dims=(1,), keepdim=false]
          %3: f32[] = amax %2 [dims=(0,), keepdim=false]
          return %3
        }
    """)


def test_keepdim_gets_its_shape_back_and_an_odd_count_takes_a_smaller_split():
    check_pass(split, """
        graph g(%x: i64[3,5,7,9,121]) -> (i64[1,1,1,1,1]) {
          %0: i64[1,1,1,1,1] = sum %x [dims=(0, 1, 2, 3, 4), keepdim=true]
          return %0
        }
    """, """
        graph g(%x: i64[3,5,7,9,121]) -> (i64[1,1,1,1,1]) {
          %0: i64[231,495] = reshape %x [shape=(231, 495)]
          %1: i64[231] = sum %0 [dims=(1,), keepdim=false]
          %2: i64[] = sum %1 [dims=(0,), keepdim=false]
          %3: i64[1,1,1,1,1] = reshape %2 [shape=(1, 1, 1, 1, 1)]
          return %3
        }
    """)


@pytest.mark.parametrize("text", [
    "graph g(%x: f32[256,255]) -> (f32[]) {\n  %0: f32[] = sum %x [dims=(0, 1), keepdim=false]\n  return %0\n}\n",
    "graph g(%x: f16[512,256]) -> (f16[]) {\n  %0: f16[] = sum %x [dims=(0, 1), keepdim=false]\n  return %0\n}\n",
    "graph g(%x: f32[512,256]) -> (f32[512]) {\n  %0: f32[512] = sum %x [dims=(1,), keepdim=false]\n  return %0\n}\n",
    "graph g(%x: f32[65537]) -> (f32[]) {\n  %0: f32[] = sum %x [dims=(0,), keepdim=false]\n  return %0\n}\n",
])
def test_left_alone_small_half_partial_or_prime(text):
    """65280 elements (under the minimum), f16 (partials would round), a row reduction, a prime count."""
    assert str(split(parse(text))) == text


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_full_reductions_match_eager_and_spread_over_rows(backend):
    x = torch.randn(1 << 17)
    x[12345] = float("nan")
    y = torch.randn(512, 300)

    def f(x, y):
        return torch.sin(x).sum(), x.amax(), (y * y).mean(dim=(0, 1), keepdim=True), y.amin()
    c = minicomp.compile(f, backend=backend)
    got, want = c(x, y), f(x, y)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-4, equal_nan=True)
    assert torch.isnan(got[1])
    sin = [k for k in c.report().kernels if "sin" in k.ops]
    # one kernel reads x once for 256 partial sums of sin(x) and 256 partial maxima of x
    assert [(k.ops, k.bytes_written) for k in sin] == [(["sin", "sum", "amax"], 2 * 256 * 4)]


def test_a_column_sum_to_few_columns_splits_its_rows():
    """dy.sum((0, 1)) of a computed value (a bias gradient): [R, K] -> [P, R/P, K] partials, then P."""
    check_pass(split, """
        graph g(%x: f32[8,128,256], %y: f32[8,128,256]) -> (f32[256]) {
          %0: f32[8,128,256] = mul %x %y
          %1: f32[256] = sum %0 [dims=(0, 1), keepdim=false]
          return %1
        }
    """, """
        graph g(%x: f32[8,128,256], %y: f32[8,128,256]) -> (f32[256]) {
          %0: f32[8,128,256] = mul %x %y
          %1: f32[64,16,256] = reshape %0 [shape=(64, 16, 256)]
          %2: f32[64,256] = sum %1 [dims=(1,), keepdim=false]
          %3: f32[256] = sum %2 [dims=(0,), keepdim=false]
          %4: f32[256] = reshape %3 [shape=(256,)]
          return %4
        }
    """)


@pytest.mark.parametrize("text", [
    # the summed value is an input (stored anyway: torch's reduction streams it faster)
    "graph g(%x: f32[1024,256]) -> (f32[256]) {\n  %0: f32[256] = sum %x [dims=(0,), keepdim=false]\n  return %0\n}\n",
    # ... or a graph output
    "graph g(%x: f32[1024,256]) -> (f32[1024,256], f32[256]) {\n  %0: f32[1024,256] = exp %x\n"
    "  %1: f32[256] = sum %0 [dims=(0,), keepdim=false]\n  return %0, %1\n}\n",
    # ... or a matmul's operand through a view (a linear's bias gradient over [B, T, C]: dy.sum((0, 1))
    # beside dy.reshape(B*T, C) @ W)
    "graph g(%x: f32[8,128,256], %w: f32[256,64]) -> (f32[1024,64], f32[256]) {\n  %0: f32[8,128,256] = exp %x\n"
    "  %1: f32[256] = sum %0 [dims=(0, 1), keepdim=false]\n  %2: f32[1024,256] = reshape %0 [shape=(1024, 256)]\n"
    "  %3: f32[1024,64] = mm %2 %w\n  return %3, %1\n}\n",
    # ... or a graph output's view
    "graph g(%x: f32[8,128,256]) -> (f32[1024,256], f32[256]) {\n  %0: f32[8,128,256] = exp %x\n"
    "  %1: f32[256] = sum %0 [dims=(0, 1), keepdim=false]\n  %2: f32[1024,256] = reshape %0 [shape=(1024, 256)]\n"
    "  return %2, %1\n}\n",
    # many columns: parallel work enough
    "graph g(%x: f32[64,8192]) -> (f32[8192]) {\n  %0: f32[64,8192] = exp %x\n"
    "  %1: f32[8192] = sum %0 [dims=(0,), keepdim=false]\n  return %1\n}\n",
])
def test_column_sums_left_alone(text):
    assert str(split(parse(text))) == text


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_split_column_sum_fuses_with_its_producer_and_matches_eager(backend):
    x, y = torch.randn(8, 128, 256), torch.randn(8, 128, 256)

    def f(x, y):
        h = torch.sigmoid(x) * y
        return h * 2, h.sum((0, 1))  # the value stored and its column sum: one kernel
    c = minicomp.compile(f, backend=backend)
    for g, w in zip(c(x, y), f(x, y), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-4)
    big = [k for k in c.report().kernels if "sigmoid" in k.ops]
    assert len(big) == 1 and "sum" in big[0].ops and big[0].bytes_read == 2 * x.numel() * 4


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_bias_gradient_of_a_matmul_operand_sums_in_torch(backend):
    """The value a matmul reads through a reshape is stored anyway: its column sum is torch's (no split
    partials in our kernel), and the kernel that makes it computes it once."""
    x, y, w = torch.randn(8, 128, 256), torch.randn(8, 128, 256), torch.randn(256, 64)

    def f(x, y, w):
        h = torch.sigmoid(x) * y
        return h.reshape(-1, 256) @ w, h.sum((0, 1))
    c = minicomp.compile(f, backend=backend)
    for g, want in zip(c(x, y, w), f(x, y, w), strict=True):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-3)
    ks = c.report().kernels
    assert [k.ops for k in ks if "sigmoid" in k.ops] and not any("sum" in k.ops for k in ks), [k.ops for k in ks]


def test_a_reduction_keeping_a_middle_dim_splits_its_biggest_reduced_dim_and_moves_p_first():
    """A batch norm's mean over (N, H, W) of [N, C, H, W]: H (32 parts) is split, not N (8), and
    P goes first, so the partials are [P, C] with C, the dim kept, last (integers: the sums are exact)."""
    check_pass(split, """
        graph g(%x: i64[8,32,32,32]) -> (i64[1,32,1,1]) {
          %0: i64[8,32,32,32] = mul %x %x
          %1: i64[1,32,1,1] = sum %0 [dims=(0, 2, 3), keepdim=true]
          return %1
        }
    """, """
        graph g(%x: i64[8,32,32,32]) -> (i64[1,32,1,1]) {
          %0: i64[8,32,32,32] = mul %x %x
          %1: i64[8,32,32,1,32] = reshape %0 [shape=(8, 32, 32, 1, 32)]
          %2: i64[32,8,32,1,32] = permute %1 [dims=(2, 0, 1, 3, 4)]
          %3: i64[32,32] = sum %2 [dims=(1, 3, 4), keepdim=false]
          %4: i64[32] = sum %3 [dims=(0,), keepdim=false]
          %5: i64[1,32,1,1] = reshape %4 [shape=(1, 32, 1, 1)]
          return %5
        }
    """)


@pytest.mark.parametrize("text", [
    # the first dim kept: its rows are the parallel work (a row reduction over the last dim)
    "graph g(%x: f32[64,4096]) -> (f32[64]) {\n  %0: f32[64,4096] = exp %x\n"
    "  %1: f32[64] = sum %0 [dims=(1,), keepdim=false]\n  return %1\n}\n",
    # ... and per (n, c) over (H, W): an instance norm's statistics
    "graph g(%x: f32[4,16,64,64]) -> (f32[4,16]) {\n  %0: f32[4,16,64,64] = exp %x\n"
    "  %1: f32[4,16] = sum %0 [dims=(2, 3), keepdim=false]\n  return %1\n}\n",
])
def test_reductions_keeping_the_first_dim_left_alone(text):
    assert str(split(parse(text))) == text


# a batch norm's mean and variance over channels-last data: [N, H, W, C] read as [N, C, H, W]
BN_STATS = """graph g(%x: f32[8,32,32,32]) -> (f32[1,32,1,1], f32[1,32,1,1]) {
  %0: f32[8,32,32,32] = permute %x [dims=(0, 3, 1, 2)]
  %1: f32[8,32,32,32] = exp %0
  %2: f32[1,32,1,1] = sum %1 [dims=(0, 2, 3), keepdim=true]
  %3: f32[] = full [dtype=f32, shape=(), value=8192.0]
  %4: f32[1,32,1,1] = div %2 %3
  %5: f32[8,32,32,32] = sub %1 %4
  %6: f32[8,32,32,32] = mul %5 %5
  %7: f32[1,32,1,1] = sum %6 [dims=(0, 2, 3), keepdim=true]
  return %4, %7
}
"""


def test_batch_norm_statistics_over_channels_last_data_run_down_the_columns_by_parts():
    """Both sums split into [P, C] partials whose kernels run down the channels (codegen/columns.py)
    with P the first outer variable (what the threads divide), then small kernels over P."""
    from minicomp.codegen.columns import columns
    from tests.passes.test_fuse import agree, compile_text
    fused, _ = compile_text(BN_STATS)
    agree(BN_STATS, fused)
    ks = [n.meta["kernel"] for n in fused.nodes if n.op == "kernel"]
    big = [k for k in ks if any(b.numel == 8 * 32 * 32 * 32 for b in k.buffers)]
    assert len(big) == 2 and all(columns(k) for k in big), [k.name for k in ks]
    assert all([v.size for v in k.outer] == [32, 32] for k in big)  # (P, C): 32 parts of H, 32 channels


@pytest.mark.parametrize("backend", ["cpu", "cuda_emu"])
def test_a_conv_batch_norm_relu_trains_like_eager_with_its_statistics_split(backend):
    """Training-mode batch norm after a convolution (channels-last on the CPU): its statistics and
    its backward's sums are split partials, in float64 (rounded once, as eager's statistics are);
    values and gradients match eager."""
    torch.manual_seed(0)
    # no conv bias: batch norm cancels it, so its true gradient is 0 and both sides' are rounding noise
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1, bias=False), torch.nn.BatchNorm2d(32),
                                torch.nn.ReLU())
    x = torch.randn(8, 3, 32, 32, requires_grad=True)
    compiled = assert_matches_eager(model, x, backend=backend, rtol=1e-4, atol=1e-4)
    sums = [k for k in compiled.report().kernels if "sum" in k.ops]
    assert any(k.bytes_written == 32 * 32 * 8 for k in sums), [(k.ops, k.bytes_written) for k in sums]  # [P, C] in f64


def test_a_float32_sum_keeping_a_middle_dim_sums_its_parts_in_float64():
    """Rounded once at the end, as one level (and eager's batch norm) rounds: float32 partials moved
    a ReLU input within a rounding of 0 to the other side in a ResNet's training step."""
    g = split(parse("graph g(%x: f32[8,32,32,32]) -> (f32[32]) {\n  %0: f32[8,32,32,32] = exp %x\n"
                    "  %1: f32[32] = sum %0 [dims=(0, 2, 3), keepdim=false]\n  return %1\n}\n"))
    ops = [(n.op, n.type.dtype) for n in g.nodes]
    assert ops[-5:] == [("cast", "f64"), ("sum", "f64"), ("sum", "f64"), ("cast", "f32"), ("reshape", "f32")], ops
