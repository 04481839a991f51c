// cuda_emu.h: run the CUDA C that codegen/cuda.py emits on the CPU, compiled by the host g++.
//
// Every CUDA thread of a block is an OS thread (std::thread), so barriers and shuffles really wait
// on each other: __syncthreads is a per-block std::barrier, and a warp shuffle writes its value to a
// per-thread slot, meets its warp at a barrier, reads its partner's slot, and meets it again.
// Blocks of a launch run one after another (and launches one at a time), which makes `__shared__`
// (a function-local static here) private to the running block. Slow on purpose, never approximate:
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
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace {
struct Block {
  explicit Block(unsigned n) : bar(n), slots(n), n(n) {
    for (unsigned w = 0; w * 32 < n; ++w) warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, n - 32 * w)));
  }
  std::barrier<> bar;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<unsigned long long> slots;  // one shuffle slot per thread
  unsigned n;
};
thread_local mc_emu_thread self;
thread_local Block* block;
thread_local unsigned tid;
std::mutex one_launch_at_a_time, error_lock;
char error[256];
bool failed;
}  // namespace

extern "C" long long mc_emu_out_of_bounds(long long i, long long n) {
  std::lock_guard<std::mutex> hold(error_lock);
  if (!failed) {
    std::snprintf(error, sizeof error, "index %lld outside [0, %lld) in block (%u, %u, %u), thread (%u, %u, %u)", i, n,
                  self.bid.x, self.bid.y, self.bid.z, self.tid.x, self.tid.y, self.tid.z);
    failed = true;
  }
  return 0;
}

extern "C" const char* mc_emu_error(void) { return error; }

extern "C" mc_emu_thread* mc_emu_self(void) { return &self; }
extern "C" void mc_emu_syncthreads(void) { block->bar.arrive_and_wait(); }

extern "C" void mc_emu_fail(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s\n", what);
  std::abort();
}

extern "C" unsigned long long mc_emu_shfl_xor(unsigned long long bits, int lane_mask) {
  Block& b = *block;
  const unsigned warp = tid / 32, partner = warp * 32 + ((tid % 32) ^ (unsigned)lane_mask);
  if (lane_mask < 0 || lane_mask >= 32 || partner >= b.n) mc_emu_fail("shuffle partner outside the warp");
  b.slots[tid] = bits;
  b.warps[warp]->arrive_and_wait();
  const unsigned long long out = b.slots[partner];
  b.warps[warp]->arrive_and_wait();  // nobody overwrites a slot before its reader has read it
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
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        Block b(n);
        std::vector<std::thread> threads;
        threads.reserve(n);
        for (unsigned t = 0; t < n; ++t) {
          try {
            threads.emplace_back([&, t] {
              self = {{t % bdim.x, t / bdim.x % bdim.y, t / (bdim.x * bdim.y)}, {bx, by, bz}, bdim, grid};
              block = &b;
              tid = t;
              run(args);
              b.bar.arrive_and_drop();  // an exited thread no longer holds up the others' barriers
              b.warps[t / 32]->arrive_and_drop();
            });
          } catch (...) {
            mc_emu_fail("could not start a thread for a CUDA thread");  // the started ones would wait forever
          }
        }
        for (auto& th : threads) th.join();
      }
  return failed ? 3 : 0;
}
#endif
