from minicomp.compiler.passes import simplify_views

from .check import check_pass


def test_reshape_of_reshape_reads_the_source():
    check_pass(simplify_views.run, """
        graph g(%x: f32[2,3,4]) -> (f32[4,6]) {
          %0: f32[6,4] = reshape %x [shape=(6, 4)]
          %1: f32[4,6] = reshape %0 [shape=(4, 6)]
          return %1
        }
    """, """
        graph g(%x: f32[2,3,4]) -> (f32[4,6]) {
          %0: f32[6,4] = reshape %x [shape=(6, 4)]
          %1: f32[4,6] = reshape %x [shape=(4, 6)]
          return %1
        }
    """)


def test_reshape_round_trip_vanishes():
    check_pass(simplify_views.run, """
        graph g(%x: f32[2,3]) -> (f32[2,3]) {
          %0: f32[6] = reshape %x [shape=(6,)]
          %1: f32[2,3] = reshape %0 [shape=(2, 3)]
          %2: f32[2,3] = exp %1
          return %2
        }
    """, """
        graph g(%x: f32[2,3]) -> (f32[2,3]) {
          %0: f32[6] = reshape %x [shape=(6,)]
          %1: f32[2,3] = reshape %x [shape=(2, 3)]
          %2: f32[2,3] = exp %x
          return %2
        }
    """)


def test_permute_of_permute_to_identity_vanishes():
    check_pass(simplify_views.run, """
        graph g(%x: f32[2,3,4]) -> (f32[2,3,4]) {
          %0: f32[3,4,2] = permute %x [dims=(1, 2, 0)]
          %1: f32[2,3,4] = permute %0 [dims=(2, 0, 1)]
          %2: f32[2,3,4] = neg %1
          return %2
        }
    """, """
        graph g(%x: f32[2,3,4]) -> (f32[2,3,4]) {
          %0: f32[3,4,2] = permute %x [dims=(1, 2, 0)]
          %1: f32[2,3,4] = permute %x [dims=(0, 1, 2)]
          %2: f32[2,3,4] = neg %x
          return %2
        }
    """)


def test_permute_of_permute_composes():
    check_pass(simplify_views.run, """
        graph g(%x: f32[2,3,4]) -> (f32[4,3,2]) {
          %0: f32[3,4,2] = permute %x [dims=(1, 2, 0)]
          %1: f32[4,3,2] = permute %0 [dims=(1, 0, 2)]
          return %1
        }
    """, """
        graph g(%x: f32[2,3,4]) -> (f32[4,3,2]) {
          %0: f32[3,4,2] = permute %x [dims=(1, 2, 0)]
          %1: f32[4,3,2] = permute %x [dims=(2, 1, 0)]
          return %1
        }
    """)


def test_no_op_views_and_casts_vanish():
    check_pass(simplify_views.run, """
        graph g(%x: f32[3,4]) -> (f32[3,4]) {
          %0: f32[3,4] = expand %x [shape=(3, 4)]
          %1: f32[3,4] = slice %0 [dim=1, end=4, start=0, step=1]
          %2: f32[3,4] = cast %1 [dtype=f32]
          %3: f32[3,4] = reshape %2 [shape=(3, 4)]
          %4: f32[3,4] = permute %3 [dims=(0, 1)]
          %5: f32[3,4] = exp %4
          return %5
        }
    """, """
        graph g(%x: f32[3,4]) -> (f32[3,4]) {
          %0: f32[3,4] = expand %x [shape=(3, 4)]
          %1: f32[3,4] = slice %x [dim=1, end=4, start=0, step=1]
          %2: f32[3,4] = cast %x [dtype=f32]
          %3: f32[3,4] = reshape %x [shape=(3, 4)]
          %4: f32[3,4] = permute %x [dims=(0, 1)]
          %5: f32[3,4] = exp %x
          return %5
        }
    """)


def test_views_that_move_data_stay():
    text = """
        graph g(%x: f32[3,3], %y: f32[1,3]) -> (f32[3,3], f32[2,3], f32[3,3], i64[3,3]) {
          %0: f32[3,3] = permute %x [dims=(1, 0)]
          %1: f32[2,3] = slice %x [dim=0, end=3, start=1, step=1]
          %2: f32[3,3] = expand %y [shape=(3, 3)]
          %3: i64[3,3] = cast %x [dtype=i64]
          return %0, %1, %2, %3
        }
    """
    check_pass(simplify_views.run, text, text)


def test_expand_of_expand_reads_the_source():
    check_pass(simplify_views.run, """
        graph g(%x: f32[1,4]) -> (f32[2,3,4]) {
          %0: f32[3,4] = expand %x [shape=(3, 4)]
          %1: f32[2,3,4] = expand %0 [shape=(2, 3, 4)]
          return %1
        }
    """, """
        graph g(%x: f32[1,4]) -> (f32[2,3,4]) {
          %0: f32[3,4] = expand %x [shape=(3, 4)]
          %1: f32[2,3,4] = expand %x [shape=(2, 3, 4)]
          return %1
        }
    """)
