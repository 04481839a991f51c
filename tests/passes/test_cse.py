from minicomp.compiler.passes import cse

from .check import check_pass


def test_merges_identical_nodes_and_rewrites_their_users():
    check_pass(cse.run, """
        graph g(%x: f32[4], %y: f32[4]) -> (f32[4], f32[4]) {
          %0: f32[4] = add %x %y
          %1: f32[4] = add %x %y
          %2: f32[4] = exp %0
          %3: f32[4] = exp %1
          %4: f32[4] = mul %2 %3
          return %4, %3
        }
    """, """
        graph g(%x: f32[4], %y: f32[4]) -> (f32[4], f32[4]) {
          %0: f32[4] = add %x %y
          %1: f32[4] = exp %0
          %2: f32[4] = mul %1 %1
          return %2, %1
        }
    """)


def test_different_attrs_operands_or_order_stay_apart():
    check_pass(cse.run, """
        graph g(%x: f32[4,4], %y: f32[4,4]) -> (f32[4,4]) {
          %0: f32[4] = sum %x [dims=(0,), keepdim=false]
          %1: f32[4] = sum %x [dims=(1,), keepdim=false]
          %2: f32[4,4] = sub %x %y
          %3: f32[4,4] = sub %y %x
          %4: f32[] = full [dtype=f32, shape=(), value=0.0]
          %5: f32[] = full [dtype=f32, shape=(), value=-0.0]
          %6: f32[4,4] = mul %2 %3
          %7: f32[4] = add %0 %1
          %8: f32[] = add %4 %5
          %9: f32[4,4] = add %6 %7
          %10: f32[4,4] = add %9 %8
          return %10
        }
    """, """
        graph g(%x: f32[4,4], %y: f32[4,4]) -> (f32[4,4]) {
          %0: f32[4] = sum %x [dims=(0,), keepdim=false]
          %1: f32[4] = sum %x [dims=(1,), keepdim=false]
          %2: f32[4,4] = sub %x %y
          %3: f32[4,4] = sub %y %x
          %4: f32[] = full [dtype=f32, shape=(), value=0.0]
          %5: f32[] = full [dtype=f32, shape=(), value=-0.0]
          %6: f32[4,4] = mul %2 %3
          %7: f32[4] = add %0 %1
          %8: f32[] = add %4 %5
          %9: f32[4,4] = add %6 %7
          %10: f32[4,4] = add %9 %8
          return %10
        }
    """)


def test_externs_are_never_merged_but_their_getitems_are():
    check_pass(cse.run, """
        graph g(%x: f32[4]) -> (f32[4], f32[4], f32[4]) {
          %0: f32[4] = extern %x [args=($0, 0), target="aten.cumsum.default"]
          %1: f32[4] = extern %x [args=($0, 0), target="aten.cumsum.default"]
          %2: (f32[4], i64[4]) = extern %x [args=($0, 0), target="aten.sort.default"]
          %3: f32[4] = getitem %2 [index=0]
          %4: f32[4] = getitem %2 [index=0]
          %5: f32[4] = add %3 %4
          return %0, %1, %5
        }
    """, """
        graph g(%x: f32[4]) -> (f32[4], f32[4], f32[4]) {
          %0: f32[4] = extern %x [args=($0, 0), target="aten.cumsum.default"]
          %1: f32[4] = extern %x [args=($0, 0), target="aten.cumsum.default"]
          %2: (f32[4], i64[4]) = extern %x [args=($0, 0), target="aten.sort.default"]
          %3: f32[4] = getitem %2 [index=0]
          %4: f32[4] = add %3 %3
          return %0, %1, %4
        }
    """)


def test_merges_creation_nodes_and_chains():
    check_pass(cse.run, """
        graph g(%x: f32[3]) -> (f32[3]) {
          %0: f32[] = full [dtype=f32, shape=(), value=nan]
          %1: f32[] = full [dtype=f32, shape=(), value=nan]
          %2: i64[3] = iota [dim=0, dtype=i64, shape=(3,), start=0, step=1]
          %3: i64[3] = iota [dim=0, dtype=i64, shape=(3,), start=0, step=1]
          %4: b8[3] = eq %2 %3
          %5: f32[3] = where %4 %x %0
          %6: f32[3] = where %4 %x %1
          %7: f32[3] = add %5 %6
          return %7
        }
    """, """
        graph g(%x: f32[3]) -> (f32[3]) {
          %0: f32[] = full [dtype=f32, shape=(), value=nan]
          %1: i64[3] = iota [dim=0, dtype=i64, shape=(3,), start=0, step=1]
          %2: b8[3] = eq %1 %1
          %3: f32[3] = where %2 %x %0
          %4: f32[3] = add %3 %3
          return %4
        }
    """)
