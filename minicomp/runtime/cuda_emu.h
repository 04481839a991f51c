// cuda_emu.h: run the CUDA C that codegen/cuda.py emits on the CPU, compiled by the host g++.
//
// Every CUDA thread of a block is a fiber (a stack of its own and a saved context) on the launching OS
// thread, so barriers and shuffles really wait on each other: a thread at __syncthreads goes back to
// the scheduler, which runs the others until every live thread of the block is there, then lets them
// all on; a warp shuffle writes its value to a per-thread slot, waits for its warp the same way,
// reads its partner's slot, and waits again. Threads waiting at different barriers abort the process
// (a GPU would hang). Blocks of a launch run one after another (and launches one at a time), which
// makes `__shared__` (a function-local static here) private to the running block. On x86-64 a switch
// is a few instructions (elsewhere glibc's swapcontext); an OS thread per CUDA thread, as before,
// cost its start and a futex wake at every barrier: 20-37x the time a call of the GPU check's cases takes now.
// Still slow, and never approximate:
// half/bfloat16 conversions round to nearest even as CUDA's __float2half_rn/__float2bfloat16_rn do.
//
// Kernel translation units include this file as is: a light header (no <thread>), calling into the
// runtime below, which is compiled once into its own library with MC_EMU_RUNTIME defined.
// Anything the emulation does not provide fails to compile with a message naming it.
#pragma once
#if __cplusplus < 202002L
#error "cuda_emu.h needs C++20 (-std=c++20)"
#endif
#if !defined(__FLT16_MAX__)
#error "cuda_emu.h needs the compiler's _Float16 (exact IEEE half conversions)"
#endif
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#define MINICOMP_CUDA_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 { unsigned x, y, z; };
struct mc_emu_thread { dim3 tid, bid, bdim, gdim; };

extern "C" {
mc_emu_thread* mc_emu_self(void);
void mc_emu_syncthreads(void);
unsigned long long mc_emu_shfl_xor(unsigned long long bits, int lane_mask);
[[noreturn]] void mc_emu_fail(const char* what);
int mc_emu_launch(const unsigned* cfg, void (*run)(void**), void** args);
long long mc_emu_out_of_bounds(long long i, long long n);
const char* mc_emu_error(void);
}

// every memory index the generator emits goes through MC_IN (an identity on the GPU): an index
// outside its buffer is recorded, fails the launch, and reads element 0 instead of crashing
template <class I> inline I mc_emu_checked(I i, long long n) {
  return (i >= 0 && (long long)i < n) ? i : (I)mc_emu_out_of_bounds((long long)i, n);
}
#define MC_IN(i, n) mc_emu_checked((i), (n))

#define threadIdx (mc_emu_self()->tid)
#define blockIdx (mc_emu_self()->bid)
#define blockDim (mc_emu_self()->bdim)
#define gridDim (mc_emu_self()->gdim)

inline void __syncthreads() { mc_emu_syncthreads(); }

template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "cuda_emu: shuffles move at most 8 bytes");
  if (mask != 0xffffffffu || width != 32) mc_emu_fail("only full-warp shuffles (mask ~0u, width 32) are emulated");
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = mc_emu_shfl_xor(bits, lane_mask);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// ---- bit casts and the math CUDA has that libm does not ---------------------------------------------
template <class To, class From> inline To mc_emu_bits(From x) {
  static_assert(sizeof(To) == sizeof(From));
  To out;
  std::memcpy(&out, &x, sizeof(To));
  return out;
}
inline float __int_as_float(int x) { return mc_emu_bits<float>(x); }
inline int __float_as_int(float x) { return mc_emu_bits<int>(x); }
inline double __longlong_as_double(long long x) { return mc_emu_bits<double>(x); }
inline long long __double_as_longlong(double x) { return mc_emu_bits<long long>(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }

// ---- half and bfloat16: 16-bit storage, float arithmetic ---------------------------------------------
struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };

inline float __half2float(__half h) { return (float)mc_emu_bits<_Float16>(h.x); }
inline __half __float2half_rn(float f) { return {mc_emu_bits<unsigned short>((_Float16)f)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return mc_emu_bits<float>((unsigned)h.x << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned u = mc_emu_bits<unsigned>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fff};  // NaN: CUDA's canonical bfloat16 NaN
  u += 0x7fffu + ((u >> 16) & 1u);                       // round to nearest, ties to even
  return {(unsigned short)(u >> 16)};
}

// ---- what the emulation does not provide: a compile error that names it -------------------------------
template <class... A> inline constexpr bool mc_emu_missing = false;
#define MC_EMU_UNSUPPORTED(name)                                                   \
  template <class... A> inline void name(A...) {                                   \
    static_assert(mc_emu_missing<A...>, "cuda_emu: " #name " is not emulated");    \
  }
MC_EMU_UNSUPPORTED(atomicAdd)
MC_EMU_UNSUPPORTED(atomicMax)
MC_EMU_UNSUPPORTED(atomicMin)
MC_EMU_UNSUPPORTED(atomicCAS)
MC_EMU_UNSUPPORTED(atomicExch)
MC_EMU_UNSUPPORTED(__syncwarp)
MC_EMU_UNSUPPORTED(__shfl_sync)
MC_EMU_UNSUPPORTED(__shfl_up_sync)
MC_EMU_UNSUPPORTED(__shfl_down_sync)
MC_EMU_UNSUPPORTED(__ballot_sync)
MC_EMU_UNSUPPORTED(__any_sync)
MC_EMU_UNSUPPORTED(__all_sync)
MC_EMU_UNSUPPORTED(__threadfence)
MC_EMU_UNSUPPORTED(__ldg)
MC_EMU_UNSUPPORTED(__fdividef)
MC_EMU_UNSUPPORTED(clock64)

// ---- launching: cuda_emu.py appends one `mc_emu_launch_<kernel>` per kernel built on these --------------
// args[i] points at the i-th argument's value, as in cuLaunchKernel's kernelParams
template <class... P, std::size_t... I>
inline void mc_emu_call_(void (*f)(P...), void** args, std::index_sequence<I...>) { f(*static_cast<P*>(args[I])...); }
template <class... P> inline void mc_emu_call(void (*f)(P...), void** args) {
  mc_emu_call_(f, args, std::index_sequence_for<P...>{});
}

#ifdef MC_EMU_RUNTIME
#include <sys/mman.h>
#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace {
// Where a CUDA thread is: running (or ready to run), waiting at __syncthreads, waiting for its warp
// (a shuffle), or returned from the kernel.
enum State : unsigned char { READY, AT_BLOCK, AT_WARP, DONE };
struct Fiber {
  mc_emu_thread self;
  unsigned tid;
  State state;
#if defined(__x86_64__)
  void* sp;  // its saved stack pointer while it is not running
#else
  ucontext_t ctx;
#endif
};
constexpr std::size_t STACK = 256 << 10;  // a CUDA thread's stack; one page below it is a guard page
std::vector<Fiber> fibers;                // the running block's CUDA threads
char* stacks = nullptr;
std::size_t stack_count = 0;
Fiber* cur;
void (*run_kernel)(void**);
void** run_args;
unsigned long long slots[1024];  // one shuffle slot per thread
std::mutex one_launch_at_a_time;  // the fibers, stacks and error below are one launch's
char error[256];
bool failed;

#if defined(__x86_64__)
// The switch saves what the System V ABI has a callee keep (rbx, rbp, r12-r15, the SSE and x87 control
// words) on the running stack and resumes the other: a few nanoseconds, where glibc's swapcontext also
// makes a system call for the signal mask (that was most of an emulated reduction's time).
extern "C" void mc_emu_switch(void** save_sp, void* to_sp);
asm(R"(
.text
.globl mc_emu_switch
.hidden mc_emu_switch
.type mc_emu_switch, @function
mc_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size mc_emu_switch, .-mc_emu_switch
)");
void* scheduler_sp;

[[noreturn]] void fiber_main() {  // a CUDA thread's first switch returns here, on its own stack
  run_kernel(run_args);
  cur->state = DONE;
  void* gone;
  mc_emu_switch(&gone, scheduler_sp);
  __builtin_unreachable();
}

void start(Fiber& f, char* stack, std::size_t size) {
  unsigned mxcsr;
  unsigned short fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  auto* top = reinterpret_cast<unsigned long long*>(reinterpret_cast<std::uintptr_t>(stack + size) & ~15ull);
  // from the top: a return slot fiber_main never uses, fiber_main's address (at 16n, so fiber_main
  // starts at 16n + 8 as after a call), six zeroed registers, the control words
  unsigned long long* sp = top - 9;
  sp[8] = 0;
  sp[7] = reinterpret_cast<unsigned long long>(&fiber_main);
  for (int i = 1; i < 7; ++i) sp[i] = 0;
  sp[0] = mxcsr | (unsigned long long)fpucw << 32;
  f.sp = sp;
}
void resume(Fiber& f) { mc_emu_switch(&scheduler_sp, f.sp); }
void to_scheduler() { mc_emu_switch(&cur->sp, scheduler_sp); }
#else
ucontext_t scheduler;

void fiber_main() {  // returning resumes the scheduler (uc_link)
  run_kernel(run_args);
  cur->state = DONE;
}

void start(Fiber& f, char* stack, std::size_t size) {
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = stack;
  f.ctx.uc_stack.ss_size = size;
  f.ctx.uc_link = &scheduler;
  makecontext(&f.ctx, fiber_main, 0);
}
void resume(Fiber& f) { swapcontext(&scheduler, &f.ctx); }
void to_scheduler() { swapcontext(&cur->ctx, &scheduler); }
#endif

void wait_at(State why) {  // back to the scheduler until the barrier releases this thread
  cur->state = why;
  to_scheduler();
}

void ensure_stacks(std::size_t n) {
  if (n <= stack_count) return;
  if (stacks) munmap(stacks, stack_count * (STACK + 4096));
  stacks = static_cast<char*>(mmap(nullptr, n * (STACK + 4096), PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (stacks == MAP_FAILED) mc_emu_fail("could not map the CUDA threads' stacks");
  for (std::size_t i = 0; i < n; ++i) mprotect(stacks + i * (STACK + 4096), 4096, PROT_NONE);
  stack_count = n;
}

// Run one block: every thread until it waits or returns, then release the barrier everyone live
// waits at -- a warp whose live threads all wait for it, else __syncthreads once every live thread
// of the block is there. A thread that has returned holds up no barrier (as arrive_and_drop).
void run_block(unsigned n) {
  for (;;) {
    for (unsigned t = 0; t < n; ++t)
      if (fibers[t].state == READY) {
        cur = &fibers[t];
        resume(*cur);
      }
    bool released = false;
    for (unsigned w = 0; w * 32 < n; ++w) {
      const unsigned end = w * 32 + 32 < n ? w * 32 + 32 : n;
      unsigned live = 0, waiting = 0;
      for (unsigned t = w * 32; t < end; ++t) {
        live += fibers[t].state != DONE;
        waiting += fibers[t].state == AT_WARP;
      }
      if (live && waiting == live) {
        for (unsigned t = w * 32; t < end; ++t) fibers[t].state = READY;
        released = true;
      }
    }
    if (released) continue;
    unsigned live = 0, waiting = 0;
    for (unsigned t = 0; t < n; ++t) {
      live += fibers[t].state != DONE;
      waiting += fibers[t].state == AT_BLOCK;
    }
    if (live == 0) return;
    if (waiting != live) mc_emu_fail("threads of a block wait at different barriers (a deadlock on a GPU)");
    for (unsigned t = 0; t < n; ++t)
      if (fibers[t].state == AT_BLOCK) fibers[t].state = READY;
  }
}
}  // namespace

extern "C" long long mc_emu_out_of_bounds(long long i, long long n) {
  if (!failed) {
    const mc_emu_thread& self = cur->self;
    std::snprintf(error, sizeof error, "index %lld outside [0, %lld) in block (%u, %u, %u), thread (%u, %u, %u)", i, n,
                  self.bid.x, self.bid.y, self.bid.z, self.tid.x, self.tid.y, self.tid.z);
    failed = true;
  }
  return 0;
}

extern "C" const char* mc_emu_error(void) { return error; }

extern "C" mc_emu_thread* mc_emu_self(void) { return &cur->self; }
extern "C" void mc_emu_syncthreads(void) { wait_at(AT_BLOCK); }

extern "C" void mc_emu_fail(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s\n", what);
  std::abort();
}

extern "C" unsigned long long mc_emu_shfl_xor(unsigned long long bits, int lane_mask) {
  const unsigned tid = cur->tid, warp = tid / 32, partner = warp * 32 + ((tid % 32) ^ (unsigned)lane_mask);
  if (lane_mask < 0 || lane_mask >= 32 || partner >= fibers.size()) mc_emu_fail("shuffle partner outside the warp");
  slots[tid] = bits;
  wait_at(AT_WARP);
  const unsigned long long out = slots[partner];
  wait_at(AT_WARP);  // nobody overwrites a slot before its reader has read it
  return out;
}

// cfg: grid x, y, z, block x, y, z, dynamic shared bytes. Returns 0; 1 or 2 for a refused launch, 3 for
// an out-of-bounds index (mc_emu_error says which).
extern "C" int mc_emu_launch(const unsigned* cfg, void (*run)(void**), void** args) {
  const dim3 grid{cfg[0], cfg[1], cfg[2]}, bdim{cfg[3], cfg[4], cfg[5]};
  const unsigned n = bdim.x * bdim.y * bdim.z;
  if (cfg[6] != 0) return 1;  // dynamic shared memory is not emulated (the generator uses none)
  if (n == 0 || n > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) return 2;
  std::lock_guard<std::mutex> hold(one_launch_at_a_time);
  failed = false;
  error[0] = 0;
  ensure_stacks(n);
  fibers.resize(n);
  run_kernel = run;
  run_args = args;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        for (unsigned t = 0; t < n; ++t) {
          Fiber& f = fibers[t];
          f.self = {{t % bdim.x, t / bdim.x % bdim.y, t / (bdim.x * bdim.y)}, {bx, by, bz}, bdim, grid};
          f.tid = t;
          f.state = READY;
          start(f, stacks + t * (STACK + 4096) + 4096, STACK);
        }
        run_block(n);
      }
  return failed ? 3 : 0;
}
#endif
