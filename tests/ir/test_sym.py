"""Symbolic sizes (ir/sym.py): normal forms, printing and reading back, what the ranges settle,
what becomes a guard, evaluation, binding from shapes, Dynamo's sympy expressions."""
from __future__ import annotations

import pytest
import sympy

from minicomp.ir import sym, sym_read, sym_values
from minicomp.ir.index import Expr, Var, linear, unravel

s0, s1 = sym.symbol("s0"), sym.symbol("s1")


def test_arithmetic_normalizes_and_drops_to_int():
    assert (768 * s0) // 768 == s0
    assert (768 * s0) // 64 == 12 * s0
    assert (768 * s0) % 64 == 0
    assert s0 - s0 == 0 and isinstance(s0 - s0, int)
    assert (4 * s0) // (2 * s0) == 2
    assert (s0 * s1) // s1 == s0
    assert (2 * s0 + 1) // 2 == s0  # 1 // 2 == 0 whatever s0 is
    assert repr((s0 + 1) // 2) == "((s0+1)//2)"


@pytest.mark.parametrize("text", ["768*s0+1", "((s0+1)//2)", "3*((s0+1)//2)*s1", "s0-1", "-2*s0+s1",
                                  "((s0*s1)%4)", "s0*s0"])
def test_print_parse_round_trip(text):
    v = sym_read.parse(text)
    assert str(v) == text and sym_read.parse(str(v)) == v


def test_parse_rejects_names_that_are_not_sizes():
    with pytest.raises(ValueError):
        sym_read.parse("x+1")


def test_ranges_settle_without_guards():
    env = sym.SymEnv()
    with sym.using(env):
        assert not (s0 < 2) and s0 >= 2 and (768 * s0 > 0) and bool(s0)
        assert s0 * s1 > s0  # 2 + t0 + 2*t1 + t0*t1 > 0 after s = 2 + t
        assert sym.known(s0 - 1, "<", s0)
    assert env.guards == []


def test_a_floor_division_is_bounded_by_its_quotient():
    """n - n//2 >= 0 for every n: the ranges alone bound n and n//2 apart (0 - inf); read as
    n - (n - r)/2 with 0 <= r < 2 it is settled, times other sizes too (a tail slice's element count)."""
    s = sym.symbol("n")
    env = sym.SymEnv()
    with sym.scope({"n": (0, None, 6), "s0": (2, None, 8), "s1": (0, None, 3)}):
        assert sym.known(s - s // 2, ">=", 0) and not sym.known(s - s // 2, ">", 0)  # n = 0
        assert sym.known(s0 - s0 // 2, ">", 0)  # s0 >= 2
        assert sym.known(s * s1 - (s // 2) * s1, ">=", 0)
        assert sym.known(s - (s // 3) * 3, ">=", 0) and sym.known(2 * (s // 2), "<=", s)
        assert not sym.known(s // 2 - 1, ">=", 0)
    assert env.guards == []


def test_open_comparison_is_decided_on_hints_and_guarded():
    env = sym.SymEnv(hints={"s0": 5, "s1": 7})
    with sym.using(env):
        assert s0 < s1
        assert s0 < s1  # asked again: the same guard, not a second one
    assert [str(g) for g in env.guards] == ["s0 < s1"]
    assert env.guards[0].check({"s0": 3, "s1": 4}) and not env.guards[0].check({"s0": 9, "s1": 4})


def test_open_comparison_without_hints_names_it():
    with pytest.raises(sym.SymbolicError, match="s0 < s1"):
        bool(s0 < s1)


def test_equality_is_structural():
    env = sym.SymEnv(hints={"s0": 128})
    with sym.using(env):
        assert s0 != 128 and not (s0 == s1) and s0 == sym.symbol("s0")
    assert env.guards == []


def test_a_size_where_python_needs_an_int_is_a_type_error():
    with pytest.raises(TypeError, match="symbolic size s0"):
        range(s0)


def test_floats_never_mix_with_sizes_silently():
    """A float of a size at its hint would be right at one size only (a mean's 1/count was): mixing
    raises, and a cost estimate asks for the hint by name."""
    with sym.using(sym.SymEnv(hints={"s0": 10})):
        for bad in (lambda: s0 * 1.5, lambda: float(2 * s0), lambda: s0 + 0.5, lambda: 1.0 / s0):
            with pytest.raises(TypeError):
                bad()
        assert sym.hint(3 * s0) == 30
    f = sym_values.SizeFloat("/", s0, s0 - 1)  # batch norm's n / (n - 1)
    assert f.value({"s0": 5}) == 1.25 and sym_values.concrete({"c": f}, {"s0": 3}) == {"c": 1.5}


def test_evaluate_bind_and_concrete():
    assert sym.evaluate((s0 + 1) // 2 * s1, {"s0": 7, "s1": 3}) == 12
    values = sym_values.bind((s0, 768, 2 * s0), (5, 768, 10))
    assert values == {"s0": 5}
    with pytest.raises(ValueError, match="2\\*s0"):
        sym_values.bind((s0, 2 * s0), (5, 11))
    with pytest.raises(ValueError, match="inside"):
        sym_values.bind((2 * s1,), (4,))
    assert sym_values.concrete({"shape": (s0, 4 * s0), "n": [s0]}, {"s0": 3}) == {"shape": (3, 12), "n": [3]}


def test_from_sympy_reads_dynamos_expressions():
    from torch.utils._sympy.functions import FloorDiv, PythonMod
    a, b = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
    assert sym_read.from_sympy(768 * a * b + 3) == 768 * s0 * s1 + 3
    assert sym_read.from_sympy(FloorDiv(a + 1, 2)) == (s0 + 1) // 2
    assert sym_read.from_sympy(PythonMod(a, 4)) == s0 % 4
    assert sym_read.from_sympy(a ** 2) == s0 * s0


def test_min_and_max_from_sympy_pick_by_the_hints_and_guard_the_pick():
    """`buf[:T]` of a 128-row buffer is Min(128, T) when Dynamo does not specialize: minicomp takes the
    argument the hints choose and guards it (the guard Dynamo makes when it decides the slice itself)."""
    a = sympy.Symbol("s0", integer=True, nonnegative=True)
    env = sym.SymEnv(ranges={"s0": (0, None)}, hints={"s0": 7})
    with sym.using(env):
        assert sym_read.from_sympy(sympy.Min(128, a)) == s0
        assert sym_read.from_sympy(sympy.Max(1, a)) == s0
        assert sym_read.from_sympy(sympy.Max(9, a)) == 9
    assert [str(g) for g in env.guards] == ["s0 <= 128", "s0 >= 1", "9 >= s0"]
    with sym.using(sym.SymEnv(ranges={"s0": (0, 100)}, hints={"s0": 7})) as settled:
        assert sym_read.from_sympy(sympy.Min(128, a)) == s0  # the ranges decide it: no guard
    assert settled.guards == []


def test_index_expressions_over_symbolic_sizes_simplify_exactly():
    i, j = Var("i", s0), Var("j", s1)
    flat = linear([i, j], (s0, s1))
    assert str(flat) == "{s1}*i + j"
    back = unravel(flat, (s0, s1))
    assert back == [Expr.of(i), Expr.of(j)]  # (s1*i + j) // s1 == i since j < s1, for every size
    e = (Expr.of(i) * 768).floordiv(64)
    assert e == Expr.of(i) * 12
    with sym.using(sym.SymEnv()) as env:
        Expr.of(j).floordiv(s0)  # cannot be proved: stays a division, asks no guard
    assert env.guards == []
