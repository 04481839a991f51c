"""A compile worker: LLVM IR text in, O3-optimized object code out (runtime/jit_pool.py starts it).

Run as a script (`python llvm_worker.py`), never imported by minicomp: it imports llvmlite and
nothing of minicomp or torch, so it is ready about 50 ms after it starts. Requests come on stdin
and answers go to stdout, each one frame: an 8-byte little-endian length, then a pickle. A request
is (cpu name, cpu features, IR text); the answer is ("ok", object code) or ("error", message).
The worker compiles exactly as runtime/cpu.py does in process (one target machine at opt=3, the
new pass manager at speed level 3), so its object code is the same bytes. It exits when stdin
closes: when the process that started it exits or closes it.
"""
import pickle
import struct
import sys

import llvmlite.binding as llvm

HEADER = struct.Struct("<Q")


def read_frame(stream):
    """The next frame's object, or None at the end of the stream."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (n,) = HEADER.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)


def write_frame(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def compile_object(tm, ir_text: str) -> bytes:
    """Parse, verify, O3, machine code: the object file's bytes."""
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    pb = llvm.create_pass_builder(tm, llvm.PipelineTuningOptions(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_object(mod)


def main() -> int:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machines = {}
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        request = read_frame(stdin)
        if request is None:
            return 0
        cpu, features, ir_text = request
        try:
            if (cpu, features) not in machines:
                target = llvm.Target.from_triple(llvm.get_process_triple())
                machines[cpu, features] = target.create_target_machine(cpu=cpu, features=features, opt=3)
            answer = ("ok", compile_object(machines[cpu, features], ir_text))
        except Exception as e:  # a module LLVM rejects: the caller compiles it in process and reports that
            answer = ("error", f"{type(e).__name__}: {e}")
        write_frame(stdout, answer)


if __name__ == "__main__":
    sys.exit(main())
