"""Kernel -> LLVM IR (llvmlite): KernelCodegen adds one kernel's functions to a module
(llvm_module.py gathers a graph's kernels into modules).

Each kernel becomes `void <name>(ptr bufs, i64 start, i64 end)`: it loads its buffer pointers and
calls `<name>_body(ptr noalias b0, ..., i64 start, i64 end)`, which runs outer iterations
[start, end) of the first outer loop (the runtime splits that range across threads). `noalias`
lets LLVM vectorize without runtime alias checks; the innermost loop is contiguous after
collapse.py, so LLVM's loop vectorizer turns it into vector code (the tests check for vector ops).
Reductions keep accumulators in allocas (promoted to phis); float sums carry `reassoc` so they
vectorize; max/min track NaN separately so they stay vectorizable and still propagate NaN. A long
float sum adds blocks of elements from zero and those partials into its total (blocked_sums.py).

An innermost loop that calls our polynomial math (llvm_math.py) asks the vectorizer to interleave
MATH_INTERLEAVE vector iterations: each function is one long dependency chain, LLVM's own choice for
such a big body is 1, and with independent chains side by side the core overlaps them (measured on
AVX-512: cos 0.35 -> 0.25 ns/element, gelu 0.54 -> 0.42, exp 0.19 -> 0.16; a plain add unchanged).
A long innermost loop with a constant trip count (a row kernel's rows) is not unrolled: LLVM would
unroll a 1024-element row completely and keep the row's vectors across stages in stack spills
(layer_norm: 2.9 -> 2.1 ms a thread for 8192 rows of 1024, and less machine code to compile).
A loop around other loops is never unrolled: with constant trip counts LLVM turned a small transpose
(8x32x16, rows of 16 floats) into 256 inline 64-byte memcpys, 186 ms of O3 and machine code for a
0.6 us kernel; without, 11 ms and the same speed (a GPT block's backward: 624 -> 230 ms of LLVM).
A pointwise kernel whose stores choose between parts by comparing a loop variable with constants (a
cat, a pad) runs as one loop nest per range of that variable (pieces.py): the GPT block's backward
cat of q/k/v gradients went from 0.168 ms to under 0.012.
A reduction down columns (a layer_norm weight gradient) runs in column tiles (columns.py).
A row kernel's passes (row_passes.py): a store that reads none of the last stage's results is made
in an earlier stage's loop, and a costly value a later pass needs is kept in a row buffer on the
stack, not computed again.
A kernel over symbolic sizes (ir/sym.py) reads them at run time: its buffer table holds one more
pointer, to the program's array of size values, its body loads the symbols it uses once at entry and
computes every symbolic extent, coefficient and divisor from them (LLVM hoists what loops do not
change), so each program instance (one per call size, runtime/sized.py) brings a table of its own.
Kernels whose bodies print the same (body_key: the same layer repeated, buffers by position) share
one <name>_body and its entry (llvm_module.py names the others' entries as aliases of it):
optimizing and emitting machine code is most of a cold compile after tracing, and four GPT blocks
then cost it about once (codegen 682 -> 270 ms).
The body is out of line and the entry point `optnone` (_entry). Nothing else is generated per
kernel: running the whole range in one call, or chunks of it on torch's OpenMP team, goes through
the runtime's own entries (runtime/cpu.py), which take the kernel's entry, table and extent.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir import sym
from ..ir.index import Expr, Var
from ..ir.kernel import Kernel, KExpr, check_sites, kernel_symbols, site
from .blocked_sums import blocked_nest, sum_blocking
from .columns import columns, emit_columns
from .pieces import split
from . import row_passes
from ..ir.scalar import SCALAR
from ..ir.types import FLOATS
from .llvm_ops import LOWER, emit
from .llvm_values import I1, I64, Ops, const, emit_sym, mem_type, reg_type

PTR = ir.PointerType()
I32 = ir.IntType(32)
# A kernel's buffer table holds its buffers, then one more pointer: the 32-bit word where a kernel
# that checks (check_sites) sets bit j when check j failed. Each table has its own word, so calls
# running side by side (each with its own table) never see each other's failures.


MATH_INTERLEAVE = 4
MATH_INTERLEAVE_MIN_TRIPS = 256  # shorter loops would leave most iterations to the scalar remainder
NO_UNROLL_MIN_TRIPS = 128  # constant-trip loops this long are not unrolled (see the module docstring)
class KernelCodegen:
    def __init__(self, module: ir.Module, kernel: Kernel, whole: bool = False):
        """`whole`: the runtime always runs the kernel over its whole outer range (constant bounds)."""
        self.module, self.k, self.whole = module, kernel, whole
        self.vars: dict = {}
        self.scopes: list[dict] = []
        self.accs: dict = {}
        self.loops = 0  # loops emitted so far
        self.failed = None  # alloca: a run-time check failed (kernels that gather or divide integers)
        self.sites = check_sites(kernel)
        self.columns = columns(kernel)  # a reduction down columns (columns.py): no prestores there
        self.prestores, self.finish = ({}, set()) if self.columns else row_passes.prestores(kernel)
        self.symbols = kernel_symbols(kernel)  # sizes read at run time (ir/sym.py), in the sizes array's order
        self.sizes: dict = {}  # size expression (repr) -> its value, computed in the entry block
        self.kept = row_passes.RowBuffers()  # values later passes over a row load (planned per row kernel)
        self.early = row_passes.stores_by_pass(kernel)  # the inner stores each pass over a row makes

    def size(self, x):
        """An extent, coefficient or divisor: a constant, or computed once from the symbols."""
        if not isinstance(x, sym.Sym):
            return I64(x)
        key = repr(x)
        if key not in self.sizes:
            with self.b.goto_block(self.entry):
                self.sizes[key] = emit_sym(self.b, x, self.symvals)
        return self.sizes[key]

    # -- values ------------------------------------------------------------------------------------
    def lookup(self, e: KExpr):
        for scope in reversed(self.scopes):
            if id(e) in scope:
                return scope[id(e)]
        return None

    def index(self, e: Expr):
        b = self.b
        total = None
        for atom, c in e.terms:
            if isinstance(atom, Var):
                v = self.vars[atom.name]
            elif atom.kind == "data":
                v = self.value(atom.c)
                v = b.sext(v, I64) if v.type != I64 else v
            else:
                inner = self.index(atom.expr)
                d = self.size(atom.c)
                v = b.sdiv(inner, d) if atom.kind == "div" else b.srem(inner, d)
            term = v if isinstance(c, int) and c == 1 else b.mul(v, self.size(c))
            total = term if total is None else b.add(total, term)
        if total is None:
            return self.size(e.const)
        return b.add(total, self.size(e.const)) if not (isinstance(e.const, int) and e.const == 0) else total

    def value(self, e: KExpr):
        hit = self.lookup(e)
        if hit is not None:
            return hit
        args = [self.value(a) for a in e.args]
        if "where" in e.attrs and SCALAR[e.op].kind == "pointwise":  # an integer division: a zero divisor is an error
            b = self.b
            bad = b.icmp_signed("==", args[1], ir.Constant(args[1].type, 0))
            if e.attrs.get("guard") is not None:
                bad = b.and_(bad, self.value(e.attrs["guard"]))
            self.check(bad, e.op, e.attrs)
        out = emit(self.ops, e.op, args, e.dtype, e.attrs, [a.dtype for a in e.args])  # the table's recipe
        self.scopes[-1][id(e)] = out
        return out

    # -- loops -------------------------------------------------------------------------------------
    def loop(self, lo, hi, name: str, body, trips: int) -> None:
        """for name in [lo, hi): body()  -- emitted as a guarded bottom-tested loop."""
        b = self.b
        pre = b.block
        header = b.append_basic_block(name)
        done = b.append_basic_block(name + ".done")
        b.cbranch(b.icmp_signed("<", lo, hi), header, done)
        b.position_at_end(header)
        i = b.phi(I64, name)
        i.add_incoming(lo, pre)
        self.vars[name] = i
        self.scopes.append({})
        loops, calls = self.loops, self.ops.math_calls
        body()
        innermost = self.loops == loops
        self.loops += 1
        self.scopes.pop()
        nxt = b.add(i, I64(1))
        i.add_incoming(nxt, b.block)
        latch = b.cbranch(b.icmp_signed("<", nxt, hi), header, done)
        hints = []
        if innermost and self.ops.math_calls > calls and trips >= MATH_INTERLEAVE_MIN_TRIPS:
            hints.append(("llvm.loop.interleave.count", MATH_INTERLEAVE))
        if not innermost or isinstance(hi, ir.Constant) and trips >= NO_UNROLL_MIN_TRIPS:
            hints.append(("llvm.loop.unroll.disable", None))
        if hints:
            latch.set_metadata("llvm.loop", self.loop_md(hints))
        b.position_at_end(done)

    def piece(self, pc, start, end) -> None:
        """Piece pc's loop nest. Split on the first outer loop, whose range [start, end) the runtime
        hands out, the piece runs that range's overlap with its own [lo, hi), shifted to 0."""
        k = pc.kernel
        first = None
        if not self.whole:
            first = (start, end)
            if pc.pos == 0:
                b, lo, hi = self.b, self.size(pc.lo), self.size(pc.hi)
                s = b.select(b.icmp_signed(">", start, lo), start, lo)
                e = b.select(b.icmp_signed("<", end, hi), end, hi)
                first = (b.sub(s, lo), b.sub(e, lo))
        self.nest(list(k.outer), lambda: [self.store(s) for s in k.outer_stores], first_range=first)

    def loop_md(self, hints):
        """A loop ID (a node whose first operand is itself, as LLVM requires) carrying `hints`."""
        mds = [self.module.add_metadata([ir.MetaDataString(self.module, name)]
                                        + ([ir.Constant(ir.IntType(32), v)] if v is not None else []))
               for name, v in hints]
        loop_id = ir.values.MDValue(self.module, mds, name=str(len(self.module.metadata)))  # not cached: one per loop
        loop_id.operands = (loop_id, *mds)
        return loop_id

    def nest(self, vs, body, first_range=None) -> None:
        if not vs:
            self.scopes.append({})
            body()
            self.scopes.pop()
            return
        lo, hi = first_range or (I64(0), self.size(vs[0].size))
        self.loop(lo, hi, vs[0].name, lambda: self.nest(vs[1:], body), sym.hint(vs[0].size))

    # -- reductions --------------------------------------------------------------------------------
    def stage(self, reds, q: int = 0) -> None:
        """Reduction stage `reds`, pass `q` over the row (row_passes.py)."""
        b = self.b
        blocking = sum_blocking(self.k, reds)
        slots, partials = [], []
        for r in reds:
            vt = reg_type(r.value.dtype)
            acc = self.entry_alloca(vt)
            nan = self.entry_alloca(I1)
            idx = self.entry_alloca(I64)
            total = acc
            if blocking and r.op == "sum" and r.value.dtype in FLOATS:  # acc: the block's partial
                total = self.entry_alloca(vt)
                b.store(self.init_value(r), total)
                partials.append((r, acc, total))
            slots.append((r, acc, nan, idx, total))
            b.store(self.init_value(r), acc)
            b.store(I1(0), nan)
            b.store(I64(0), idx)

        def body():
            self.kept.load(self, q)
            for r, acc, nan, idx, _ in slots:
                x = self.value(r.value)
                self.combine(r, x, acc, nan, idx)
                for st in self.prestores.get(id(r), ()):  # softmax: keep exp(x - max) in the output
                    self.store_value(st.buf, st.index, x)
            for st in self.early.get(q, ()):
                self.store(st)
            self.kept.keep(self, q)
        if blocking:
            blocked_nest(self, list(self.k.inner), *blocking, body, partials)
        else:
            self.nest(list(self.k.inner), body)
        for r, _, nan, idx, total in slots:
            if r.op in ("argmax", "argmin"):
                self.accs[id(r)] = self.ops.cast(b.load(idx), "i64", r.dtype)
                continue
            self.accs[id(r)] = self.result(r, total, nan)

    def result(self, r, acc, nan):
        """Reduction r's value from its accumulator (a float max or min that saw NaN is NaN)."""
        v = self.b.load(acc)
        if r.value.dtype in FLOATS and r.op in ("amax", "amin"):
            v = self.b.select(self.b.load(nan), ir.Constant(v.type, float("nan")), v)
        return v

    def init_value(self, r):
        return const(r.value.dtype, SCALAR[r.op].identity(r.value.dtype))

    def combine(self, r, x, acc, nan, idx) -> None:
        """Fold x into reduction r's accumulator with the backend's recipe for r (llvm_ops._fold)."""
        b, dt = self.b, r.value.dtype
        cur = b.load(acc)
        if r.op not in ("argmax", "argmin"):
            b.store(LOWER[r.op](self.ops, [cur, x], dt, {}), acc)
            if dt in FLOATS and r.op in ("amax", "amin"):  # the fold ignores NaN (nnan): tracked here
                b.store(b.or_(b.load(nan), b.fcmp_unordered("uno", x, x)), nan)
            return
        # argmax / argmin: strictly better, or the first NaN (torch treats NaN as the extreme)
        pos = self.vars[self.k.inner[0].name] if self.k.inner else I64(0)
        better = LOWER[r.op](self.ops, [x, cur], dt, {})
        if dt in FLOATS:
            first_nan = b.and_(b.fcmp_unordered("uno", x, x), b.xor(b.load(nan), I1(1)))
            take = b.and_(b.or_(better, first_nan), b.xor(b.load(nan), I1(1)))
            b.store(b.or_(b.load(nan), b.fcmp_unordered("uno", x, x)), nan)
        else:
            take = b.or_(better, b.icmp_signed("==", pos, I64(0)))
        b.store(b.select(take, x, cur), acc)
        b.store(b.select(take, pos, b.load(idx)), idx)

    def check(self, bad, op: str, attrs: dict) -> None:
        """Report the run-time check of op (with attrs) as failed where `bad` holds."""
        self.note_failure(bad, site(op, attrs))

    def note_failure(self, bad, where) -> None:
        """Or `bad` into the site's bit of the kernel's flags (an or-reduction: the loop still
        vectorizes); the body ends by or-ing them into the flag word its buffer table points to,
        which the runtime checks after the call and turns into the site's exception (IndexError,
        ZeroDivisionError)."""
        if self.failed is None:
            self.failed = self.entry_alloca(I32)
            with self.b.goto_block(self.entry):
                self.b.store(I32(0), self.failed)
        if where in self.sites:
            bit = self.sites.index(where)
        else:  # past the 32 bits, the last bit's exception stands for the rest; else check_sites missed it
            assert len(self.sites) == 32, f"check site {where} not found by check_sites in {self.k.name}"
            bit = 31
        flag = self.b.shl(self.b.zext(bad, I32), I32(bit))
        self.b.store(self.b.or_(self.b.load(self.failed), flag), self.failed)

    def entry_alloca(self, ty, count: int = 1):
        with self.b.goto_block(self.entry):
            return self.b.alloca(ty, size=I64(count) if count > 1 else None)

    def store(self, st) -> None:
        if id(st) in self.finish:  # the reduced value is already in the buffer: scale it in place
            e = st.value
            dt = self.k.buffers[st.buf].dtype
            ptr = self.b.gep(self.ptrs[st.buf], [self.index(st.index)], source_etype=mem_type(dt))
            kept = self.ops.from_mem(dt, self.b.load(ptr, typ=mem_type(dt)))
            v = emit(self.ops, e.op, [kept, self.value(e.args[1])], e.dtype, e.attrs, [a.dtype for a in e.args])
            self.b.store(self.ops.to_mem(dt, v), ptr)
            return
        self.store_value(st.buf, st.index, self.value(st.value))

    def store_value(self, buf: int, index, value) -> None:
        dt = self.k.buffers[buf].dtype
        ptr = self.b.gep(self.ptrs[buf], [self.index(index)], source_etype=mem_type(dt))
        self.b.store(self.ops.to_mem(dt, value), ptr)

    # -- the function ------------------------------------------------------------------------------
    def generate(self) -> None:
        """The kernel's body and its one entry point, <name>(ptr table, i64 start, i64 end)."""
        k = self.k
        fn = self.body = self.generate_body()
        entry = _entry(ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), k.name))
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        table = entry.args[0]
        n = len(k.buffers) + 1 + bool(self.symbols)  # the buffers, the flag word, the sizes array
        ptrs = [b.load(b.gep(table, [I64(i)], source_etype=PTR), typ=PTR) for i in range(n)]
        b.call(fn, ptrs + [entry.args[1], entry.args[2]])
        b.ret_void()

    def generate_body(self):
        """<name>_body(ptr noalias b0, ..., ptr flags, i64 start, i64 end): the loop nest."""
        k = self.k
        nb = len(k.buffers)
        extra = bool(self.symbols)  # the sizes array, after the flag word
        body_ty = ir.FunctionType(ir.VoidType(), [PTR] * (nb + 1 + extra) + [I64, I64])  # buffers, flags, range
        fn = ir.Function(self.module, body_ty, k.name + "_body")
        fn.linkage = "internal"
        fn.attributes.add("noinline")  # optimized and emitted once, whichever entries call it
        for a in fn.args[:nb]:
            a.add_attribute("noalias")
        self.entry = fn.append_basic_block("entry")
        start_bb = fn.append_basic_block("start")
        self.b = ir.IRBuilder(start_bb)
        self.ops = Ops(self.b, self.module, self)
        self.ptrs = fn.args[:nb]
        flag_word, start, end = fn.args[nb], fn.args[nb + 1 + extra], fn.args[nb + 2 + extra]
        self.symvals = {}
        if extra:
            with self.b.goto_block(self.entry):
                for i, name in enumerate(self.symbols):
                    self.symvals[name] = self.b.load(self.b.gep(fn.args[nb + 1], [I64(i)], source_etype=I64),
                                                     typ=I64, name=name)
        outer = list(k.outer)

        def row():
            self.accs = {}
            for q, reds in enumerate(k.stages):
                self.stage(reds, q)
            if self.early.get(len(k.stages)):
                def stores():
                    self.kept.load(self, len(k.stages))
                    for s in self.early[len(k.stages)]:
                        self.store(s)
                self.nest(list(k.inner), stores)
            for s in k.outer_stores:
                self.store(s)
        pieces = split(k)
        if not pieces and not self.columns:
            self.kept = row_passes.RowBuffers(row_passes.plan(k, row_passes.elem_bytes, self.finish))
        if pieces:  # one loop nest per piece (pieces.py): a cat evaluates only its part
            for pc in pieces:
                self.piece(pc, start, end)
        elif self.columns:  # a reduction down columns: accumulators for a tile of columns
            emit_columns(self, None if self.whole else (start, end))
        elif outer:  # a kernel that always runs whole gets constant bounds: LLVM sees the trip count
            self.nest(outer, row, first_range=None if self.whole else (start, end))
        else:
            self.scopes.append({})
            row()
            self.scopes.pop()
        if self.failed is not None:  # chunks on other threads may set bits too: an atomic or
            bits = self.b.load(self.failed)
            with self.b.if_then(self.b.icmp_unsigned("!=", bits, I32(0))):
                self.b.atomic_rmw("or", flag_word, bits, "monotonic")
        self.b.ret_void()
        with self.b.goto_block(self.entry):
            self.b.branch(start_bb)
        return fn


def _entry(fn: ir.Function) -> ir.Function:
    """An entry point: a few loads and a call of the kernel's <name>_body, kept out of line. Inlined
    into each entry (kernels had three: <name>, and <name>_run or <name>_omp/_par), the body was
    optimized and emitted once per entry, and LLVM's O3 pipeline and instruction selection cost a
    few milliseconds per function whatever its size: `optnone` leaves the entries to the fast path
    (HF GPT-2's 15 kernels: 226 -> 138 ms of LLVM). Each function still costs LLVM about 0.3 ms
    even so, which is why a kernel now has one entry and one sharing a body has none (an alias)."""
    fn.attributes.add("noinline")
    fn.attributes.add("optnone")
    return fn
