// minicomp CUDA prelude: the few helpers generated kernels call (codegen/cuda.py, cuda_ops.py).
// Compiled by NVRTC, and by the host compiler under runtime/cuda_emu.h (which provides the CUDA
// types and intrinsics used here), so everything below is plain CUDA C++17.
#pragma once
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

#define MC_FN __device__ __forceinline__
#define MC_INF_F __int_as_float(0x7f800000)
#define MC_NAN_F __int_as_float(0x7fffffff)
#define MC_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define MC_NAN_D __longlong_as_double(0x7fffffffffffffffLL)
#define MC_NO_INDEX 0x7fffffffffffffffLL  // an argmax partial that has seen no element
#ifndef MC_IN
#define MC_IN(i, n) (i)  // every memory index, n = the buffer's extent; cuda_emu.h checks them
#endif

// a size expression's // and % (ir/sym.py) round toward minus infinity, as Python's do
MC_FN long long mc_fdiv(long long a, long long d) { return a / d - (a % d != 0 && (a < 0) != (d < 0)); }
MC_FN long long mc_fmod(long long a, long long d) { return a % d + (a % d != 0 && (a < 0) != (d < 0)) * d; }

// 16-byte (or smaller) vector access: V elements of T, aligned so one load/store moves them all
template <class T, int V> struct alignas(sizeof(T) * V) mc_vec { T v[V]; };

// f16/bf16 live in registers as float; an op that produces them rounds to their precision
MC_FN float mc_round_f16(float x) { return __half2float(__float2half_rn(x)); }
MC_FN float mc_round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// torch's maximum/minimum propagate NaN (fmaxf would drop it)
template <class T> MC_FN T mc_max(T a, T b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }
template <class T> MC_FN T mc_min(T a, T b) { return (a != a || b != b) ? a + b : (a < b ? a : b); }
template <class T> MC_FN bool mc_isnan(T x) { return x != x; }

// signed overflow wraps (as in torch), without C++'s undefined behaviour
typedef unsigned long long mc_u64;
template <class T> MC_FN T mc_wrap_add(T a, T b) { return (T)((mc_u64)a + (mc_u64)b); }
template <class T> MC_FN T mc_wrap_sub(T a, T b) { return (T)((mc_u64)a - (mc_u64)b); }
template <class T> MC_FN T mc_wrap_mul(T a, T b) { return (T)((mc_u64)a * (mc_u64)b); }

// torch's integer pow: exact square-and-multiply, wrapping (a double pow rounds past 2**53); a
// negative exponent gives 1 ** -n == 1, (-1) ** -n == +-1 and 0 for anything else
template <class T> MC_FN T mc_ipow(T x, T y) {
  if (y < (T)0) return x == (T)1 ? (T)1 : (x == (T)-1 ? ((y & 1) ? (T)-1 : (T)1) : (T)0);
  mc_u64 r = 1, b = (mc_u64)x, e = (mc_u64)y;
  for (; e; e >>= 1, b *= b)
    if (e & 1) r *= b;
  return (T)r;
}

// float -> integer as torch on the CPU (x86) converts: truncation through a 32-bit int (i8, i16, i32)
// or a 64-bit one (u8, i64), that int's minimum for NaN and anything out of range, then the low bits
MC_FN int mc_f2i32(float x) { return (x >= -2147483648.0f && x < 2147483648.0f) ? (int)x : (-2147483647 - 1); }
MC_FN int mc_f2i32(double x) { return (x > -2147483649.0 && x < 2147483648.0) ? (int)x : (-2147483647 - 1); }
MC_FN long long mc_f2i64(float x) {
  return (x >= -9223372036854775808.0f && x < 9223372036854775808.0f) ? (long long)x : (-9223372036854775807LL - 1);
}
MC_FN long long mc_f2i64(double x) {
  return (x >= -9223372036854775808.0 && x < 9223372036854775808.0) ? (long long)x : (-9223372036854775807LL - 1);
}

// integer division by zero: torch raises (CPU) or returns garbage (GPU); dividing by 1 cannot trap
template <class T> MC_FN T mc_safe(T y) { return y == 0 ? (T)1 : y; }
// the most negative value / -1 overflows: a GPU wraps, x86 traps (cuda_emu would die of SIGFPE), torch
// gives the wrapped quotient and remainder 0. By -1, signed division negates with wraparound.
template <class T> MC_FN bool mc_by_minus1(T y) { return (T)-1 < (T)0 && y == (T)-1; }
template <class T> MC_FN T mc_idiv(T x, T y) {
  return mc_by_minus1(y) ? (T)(0ULL - (unsigned long long)x) : x / mc_safe(y);
}
template <class T> MC_FN T mc_irem(T x, T y) { return mc_by_minus1(y) ? (T)0 : x % mc_safe(y); }

template <class T> MC_FN T mc_div_floor(T x, T y) {  // signed integers
  y = mc_safe(y);
  T q = mc_idiv(x, y), r = mc_irem(x, y);
  return (r != 0 && ((r < 0) != (y < 0))) ? q - 1 : q;
}
// torch's floor division of floats: through fmod, exact where floor(x / y) rounds the quotient first
#define MC_DIV_FLOOR_FLOAT(T, SUF)                                                 \
  MC_FN T mc_div_floor(T x, T y) {                                                  \
    if (y == (T)0) return x / y;                                                    \
    const T mod = fmod##SUF(x, y);                                                  \
    T div = (x - mod) / y;                                                          \
    if (mod != (T)0 && ((y < (T)0) != (mod < (T)0))) div -= (T)1;                   \
    if (div == (T)0) return copysign##SUF((T)0, x / y);                             \
    const T fl = floor##SUF(div);                                                   \
    return div - fl > (T)0.5 ? fl + (T)1 : fl;                                      \
  }
MC_DIV_FLOOR_FLOAT(float, f)
MC_DIV_FLOOR_FLOAT(double, )

template <class T> MC_FN T mc_remainder(T x, T y) {  // sign of the divisor
  y = mc_safe(y);
  T m = mc_irem(x, y);
  return (m != 0 && ((m < 0) != (y < 0))) ? m + y : m;
}
MC_FN float mc_remainder(float x, float y) {
  float m = fmodf(x, y);
  return (m != 0.0f && ((m < 0.0f) != (y < 0.0f))) ? m + y : m;
}
MC_FN double mc_remainder(double x, double y) {
  double m = fmod(x, y);
  return (m != 0.0 && ((m < 0.0) != (y < 0.0))) ? m + y : m;
}

// negative wraps; out of range clamps to stay in memory (the CPU backend raises IndexError there,
// a kernel on the GPU cannot: see the README, Known limits)
MC_FN long long mc_clamp_index(long long i, long long size) {
  i = i < 0 ? i + size : i;
  return i < 0 ? 0 : (i >= size ? size - 1 : i);
}

// argmax/argmin partials (value, index): a NaN is the extreme (the first NaN wins), ties go to the
// smaller index, and a partial that saw nothing (MC_NO_INDEX) loses to anything
template <bool IsMax, class T>
MC_FN void mc_arg_combine(T& v, long long& i, T v2, long long i2) {
  if (i2 == MC_NO_INDEX) return;
  bool take;
  if (i == MC_NO_INDEX) take = true;
  else if (mc_isnan(v) || mc_isnan(v2)) take = mc_isnan(v2) && (!mc_isnan(v) || i2 < i);
  else take = (IsMax ? v2 > v : v2 < v) || (v2 == v && i2 < i);
  if (take) { v = v2; i = i2; }
}

// cross-thread reductions: shuffles move 32-bit words at least
template <class T> MC_FN T mc_shfl_xor(T v, int m) {
  if constexpr (sizeof(T) < 4) return (T)__shfl_xor_sync(0xffffffffu, (int)v, m);
  else return __shfl_xor_sync(0xffffffffu, v, m);
}

struct mc_op_sum { template <class T> MC_FN T operator()(T a, T b) const { return a + b; } };
struct mc_op_prod { template <class T> MC_FN T operator()(T a, T b) const { return a * b; } };
struct mc_op_max { template <class T> MC_FN T operator()(T a, T b) const { return mc_max(a, b); } };
struct mc_op_min { template <class T> MC_FN T operator()(T a, T b) const { return mc_min(a, b); } };
struct mc_op_wrap_sum { template <class T> MC_FN T operator()(T a, T b) const { return mc_wrap_add(a, b); } };
struct mc_op_wrap_prod { template <class T> MC_FN T operator()(T a, T b) const { return mc_wrap_mul(a, b); } };
struct mc_op_or { MC_FN bool operator()(bool a, bool b) const { return a || b; } };
struct mc_op_and { MC_FN bool operator()(bool a, bool b) const { return a && b; } };

// butterfly: every lane ends with the warp's result
template <class T, class Op> MC_FN T mc_warp_reduce(T v, Op op) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = op(v, mc_shfl_xor(v, m));
  return v;
}

// every thread of the block ends with the result; `smem` holds one partial per warp (<= 32 warps).
// The leading barrier lets a second reduction reuse `smem` after the first one's reads.
template <class T, class Op> MC_FN T mc_block_reduce(T v, Op op, T identity, T* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = mc_warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  return mc_warp_reduce(lane < warps ? smem[lane] : identity, op);
}

template <bool IsMax, class T> MC_FN void mc_warp_arg_reduce(T& v, long long& i) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) mc_arg_combine<IsMax>(v, i, mc_shfl_xor(v, m), mc_shfl_xor(i, m));
}

template <bool IsMax, class T>
MC_FN void mc_block_arg_reduce(T& v, long long& i, T* smem_v, long long* smem_i) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  mc_warp_arg_reduce<IsMax>(v, i);
  __syncthreads();
  if (lane == 0) { smem_v[warp] = v; smem_i[warp] = i; }
  __syncthreads();
  v = smem_v[lane < warps ? lane : 0];
  i = lane < warps ? smem_i[lane] : MC_NO_INDEX;
  mc_warp_arg_reduce<IsMax>(v, i);
}
