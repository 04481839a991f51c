"""A compile worker: LLVM IR text in, O3-optimized object code out (runtime/jit_pool.py starts it).

Run as a script (`python -P llvm_worker.py`): it imports llvmlite and nothing of minicomp or torch,
so it is ready about 50 ms after it starts (jit_pool and runtime/llvm_jit.py import this file for its
frame format, `identity` and the one definition of how a module compiles). Frames on stdin and stdout: an 8-byte little-endian length, then a pickle. The
worker first writes identity() (its llvmlite and LLVM versions); then each request is (cpu name,
cpu features, IR text) and each answer ("ok", object code) or ("error", LLVM's message). It
compiles exactly as runtime/llvm_jit.py does in process (one target machine at opt=3, the new pass
manager at speed level 3), so its object code is the same bytes. It ignores Ctrl-C and exits when
its stdin ends (every process holding the pipe has closed it).
"""
import pickle
import signal
import struct
import sys

import llvmlite
import llvmlite.binding as llvm

HEADER = struct.Struct("<Q")


def identity() -> tuple:
    """What decides the object code besides its inputs: the llvmlite and LLVM versions."""
    return (llvmlite.__version__, tuple(llvm.llvm_version_info))


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


def optimized_module(tm, ir_text: str):
    """The module parsed, verified and optimized at O3 for target machine `tm`: how minicomp
    optimizes every CPU module, here or in process (runtime/llvm_jit.py)."""
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    pb = llvm.create_pass_builder(tm, llvm.PipelineTuningOptions(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    return mod


def compile_object(tm, ir_text: str) -> bytes:
    """Parse, verify, O3, machine code: the object file's bytes."""
    return tm.emit_object(optimized_module(tm, ir_text))


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the process that started us
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machines = {}
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    write_frame(stdout, identity())
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
