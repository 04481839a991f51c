from minicomp.compiler.passes import dce

from .check import check_pass


def test_removes_nodes_no_output_needs():
    check_pass(dce.run, """
        graph g(%x: f32[4], %y: f32[4]) -> (f32[4]) {
          %0: f32[4] = exp %x
          %1: f32[4] = add %0 %y
          %2: f32[4] = mul %1 %1
          %3: f32[4] = sin %y
          return %1
        }
    """, """
        graph g(%x: f32[4], %y: f32[4]) -> (f32[4]) {
          %0: f32[4] = exp %x
          %1: f32[4] = add %0 %y
          return %1
        }
    """)


def test_keeps_an_extern_whose_getitem_is_used_and_none_outputs():
    check_pass(dce.run, """
        graph g(%x: f32[4]) -> (None, i64[4]) {
          %0: (f32[4], i64[4]) = extern %x [args=($0, 0), target="aten.sort.default"]
          %1: f32[4] = getitem %0 [index=0]
          %2: i64[4] = getitem %0 [index=1]
          %3: f32[4] = extern %x [args=($0, 0), target="aten.cumsum.default"]
          return None, %2
        }
    """, """
        graph g(%x: f32[4]) -> (None, i64[4]) {
          %0: (f32[4], i64[4]) = extern %x [args=($0, 0), target="aten.sort.default"]
          %1: i64[4] = getitem %0 [index=1]
          return None, %1
        }
    """)


def test_graph_that_returns_an_input():
    check_pass(dce.run, """
        graph g(%x: f32[4]) -> (f32[4]) {
          %0: f32[4] = exp %x
          return %x
        }
    """, """
        graph g(%x: f32[4]) -> (f32[4]) {
          return %x
        }
    """)
