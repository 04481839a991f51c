import pytest

from minicomp.compiler.passes import fold_constants
from minicomp.ir import interpret, parse

from .check import check_pass, ir


def test_folds_arithmetic_and_views_of_fulls():
    check_pass(fold_constants.run, """
        graph g(%x: f32[2,3]) -> (f32[2,3]) {
          %0: f32[] = full [dtype=f32, shape=(), value=2.0]
          %1: f32[] = full [dtype=f32, shape=(), value=0.5]
          %2: f32[] = mul %0 %1
          %3: f32[] = exp %2
          %4: f32[1,1] = reshape %3 [shape=(1, 1)]
          %5: f32[2,3] = expand %4 [shape=(2, 3)]
          %6: f32[2,3] = add %x %5
          return %6
        }
    """, """
        graph g(%x: f32[2,3]) -> (f32[2,3]) {
          %0: f32[] = full [dtype=f32, shape=(), value=2.0]
          %1: f32[] = full [dtype=f32, shape=(), value=0.5]
          %2: f32[] = full [dtype=f32, shape=(), value=1.0]
          %3: f32[] = full [dtype=f32, shape=(), value=2.7182817459106445]
          %4: f32[1,1] = full [dtype=f32, shape=(1, 1), value=2.7182817459106445]
          %5: f32[2,3] = full [dtype=f32, shape=(2, 3), value=2.7182817459106445]
          %6: f32[2,3] = add %x %5
          return %6
        }
    """)


def test_folds_to_inf_and_nan():
    check_pass(fold_constants.run, """
        graph g() -> (f32[], f32[], f32[], f16[]) {
          %0: f32[] = full [dtype=f32, shape=(), value=0.0]
          %1: f32[] = full [dtype=f32, shape=(), value=-1.0]
          %2: f32[] = log %0
          %3: f32[] = sqrt %1
          %4: f32[] = div %0 %0
          %5: f32[] = full [dtype=f32, shape=(), value=100000.0]
          %6: f16[] = cast %5 [dtype=f16]
          return %2, %3, %4, %6
        }
    """, """
        graph g() -> (f32[], f32[], f32[], f16[]) {
          %0: f32[] = full [dtype=f32, shape=(), value=0.0]
          %1: f32[] = full [dtype=f32, shape=(), value=-1.0]
          %2: f32[] = full [dtype=f32, shape=(), value=-inf]
          %3: f32[] = full [dtype=f32, shape=(), value=nan]
          %4: f32[] = full [dtype=f32, shape=(), value=nan]
          %5: f32[] = full [dtype=f32, shape=(), value=100000.0]
          %6: f16[] = full [dtype=f16, shape=(), value=inf]
          return %2, %3, %4, %6
        }
    """)


def test_folds_to_bool_and_int_results():
    check_pass(fold_constants.run, """
        graph g() -> (b8[2], b8[], i64[], i32[]) {
          %0: f32[] = full [dtype=f32, shape=(), value=nan]
          %1: b8[] = isnan %0
          %2: b8[2] = expand %1 [shape=(2,)]
          %3: f32[] = full [dtype=f32, shape=(), value=1.0]
          %4: b8[] = gt %3 %0
          %5: f32[] = full [dtype=f32, shape=(), value=-2.7]
          %6: i64[] = cast %5 [dtype=i64]
          %7: i32[] = full [dtype=i32, shape=(), value=7]
          %8: i32[] = full [dtype=i32, shape=(), value=-2]
          %9: i32[] = div_floor %7 %8
          return %2, %4, %6, %9
        }
    """, """
        graph g() -> (b8[2], b8[], i64[], i32[]) {
          %0: f32[] = full [dtype=f32, shape=(), value=nan]
          %1: b8[] = full [dtype=b8, shape=(), value=true]
          %2: b8[2] = full [dtype=b8, shape=(2,), value=true]
          %3: f32[] = full [dtype=f32, shape=(), value=1.0]
          %4: b8[] = full [dtype=b8, shape=(), value=false]
          %5: f32[] = full [dtype=f32, shape=(), value=-2.7]
          %6: i64[] = full [dtype=i64, shape=(), value=-2]
          %7: i32[] = full [dtype=i32, shape=(), value=7]
          %8: i32[] = full [dtype=i32, shape=(), value=-2]
          %9: i32[] = full [dtype=i32, shape=(), value=-4]
          return %2, %4, %6, %9
        }
    """)


NOT_FOLDED = """
    graph g(%x: f32[3]) -> (f32[3], f32[], f32[3]) {
      %0: f32[] = full [dtype=f32, shape=(), value=2.0]
      %1: f32[3] = mul %x %0
      %2: f32[3] = expand %0 [shape=(3,)]
      %3: f32[] = sum %2 [dims=(0,), keepdim=false]
      %4: i64[3] = iota [dim=0, dtype=i64, shape=(3,), start=0, step=1]
      %5: f32[3] = cast %4 [dtype=f32]
      return %1, %3, %5
    }
"""


def test_leaves_ops_with_a_non_constant_operand_reductions_and_iota():
    check_pass(fold_constants.run, NOT_FOLDED, NOT_FOLDED.replace(
        "%2: f32[3] = expand %0 [shape=(3,)]", "%2: f32[3] = full [dtype=f32, shape=(3,), value=2.0]"))


def test_integer_division_by_zero_is_left_to_run_time():
    text = """
        graph g() -> (i64[]) {
          %0: i64[] = full [dtype=i64, shape=(), value=1]
          %1: i64[] = full [dtype=i64, shape=(), value=0]
          %2: i64[] = div_floor %0 %1
          return %2
        }
    """
    out = fold_constants.run(parse(ir(text)))
    assert str(out) == ir(text)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        interpret(out)
