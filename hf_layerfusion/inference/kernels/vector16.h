// Float vectors for the CPU kernels that run on several x86 instruction sets (decode_attention.cpp, layer_norm.cpp,
// mixture_log_probs.cpp, first_argmax.cpp): GCC's generic vectors of 16 floats (one AVX-512 register) or 8 (one AVX2
// register), the functions they use, and `run_with_widest_vectors`, which compiles a kernel for each instruction set
// and runs the widest one this CPU has within the cap (instruction_sets.h). (16-float vectors on AVX2 are two registers each, and GCC kept many of them on the
// stack: the kernels ran 2-6x slower there than with 8-float vectors.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "instruction_sets.h"

#define HLF_INLINE inline __attribute__((always_inline))

// 16 floats: GCC's generic vectors, lowered to the clone's instruction set (one AVX-512 register, two AVX2 ones)
typedef float Vec16 __attribute__((vector_size(64)));
typedef float Vec16Unaligned __attribute__((vector_size(64), aligned(4)));
typedef int32_t Int16 __attribute__((vector_size(64)));
// 8 floats: one AVX2 register, for kernels that pick their vector width per instruction set (decode_attention.cpp)
typedef float Vec8 __attribute__((vector_size(32)));
typedef float Vec8Unaligned __attribute__((vector_size(32), aligned(4)));
typedef int32_t Int8Lanes __attribute__((vector_size(32)));

constexpr int64_t kLanes = 16;

// the unaligned and the integer vector of a float vector type
template <class V> struct VectorTypes;
template <> struct VectorTypes<Vec16> { using Unaligned = Vec16Unaligned; using Int = Int16; };
template <> struct VectorTypes<Vec8> { using Unaligned = Vec8Unaligned; using Int = Int8Lanes; };

template <class V>
HLF_INLINE V load_vector(const float* p) { return *reinterpret_cast<const typename VectorTypes<V>::Unaligned*>(p); }
template <class V>
HLF_INLINE void store_vector(float* p, V v) { *reinterpret_cast<typename VectorTypes<V>::Unaligned*>(p) = v; }

template <class V>
constexpr int64_t kWidth = sizeof(V) / sizeof(float);  // floats per vector
template <class V>
HLF_INLINE V splat_vector(float a) { return V{} + a; }

// the sum of the 16 lanes, pairwise (a fixed order)
HLF_INLINE float lane_sum(Vec16 v) {
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}

// the sum of the 8 lanes, pairwise
HLF_INLINE float lane_sum(Vec8 v) {
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
  return v[0];
}

// the largest of the lanes
template <class V>
HLF_INLINE float lane_max(V v) {
  float maximum = v[0];
  for (int lane = 1; lane < kWidth<V>; ++lane) maximum = v[lane] > maximum ? v[lane] : maximum;
  return maximum;
}

// exp(x) for x <= 0 (scores minus their maximum): x = n ln2 + r, |r| <= ln2 / 2 (ln2 in two parts), exp(r) by
// Cephes' expf polynomial (about 1 ulp), times 2^n built in the exponent bits. Below -87 (exp < 2^-125) the result is
// 0, so that no subnormal arithmetic (slow on x86) follows.
// (for Vec16 and Vec8)
template <class V>
HLF_INLINE V exp_nonpositive(V x) {
  using Int = typename VectorTypes<V>::Int;
  const V lowest = V{} - 87.f;
  const auto underflow = x < lowest;
  x = underflow ? lowest : x;
  const V round_to_integer = V{} + 12582912.f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const V n = (x * 1.44269504f + round_to_integer) - round_to_integer;
  V r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const Int exponent = (__builtin_convertvector(n, Int) + 127) << 23;
  V power;
  std::memcpy(&power, &exponent, sizeof(power));
  return underflow ? V{} : p * power;
}

// log(x) for normal x > 0: x = 2^e m with m in [sqrt(1/2), sqrt(2)), log(m) by Cephes' logf polynomial in m - 1
// (about 1 ulp), plus e ln2 (ln2 in two parts)
template <class V>
HLF_INLINE V log_positive(V x) {
  using Int = typename VectorTypes<V>::Int;
  Int bits;
  std::memcpy(&bits, &x, sizeof(bits));
  Int exponent = ((bits >> 23) & 0xff) - 126;  // x = 2^exponent * m, m in [1/2, 1)
  bits = (bits & 0x807fffff) | 0x3f000000;
  V m;
  std::memcpy(&m, &bits, sizeof(m));
  const auto small = m < splat_vector<V>(0.707106781186547524f);  // m in [1/2, sqrt(1/2)): use 2m and exponent - 1
  exponent = small ? exponent - 1 : exponent;
  m = (small ? m + m : m) - 1.f;
  const V e = __builtin_convertvector(exponent, V);
  const V z = m * m;
  V y = m * 7.0376836292e-2f - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y = y + e * -2.12194440e-4f;
  y = y - z * 0.5f;
  return m + y + e * 0.693359375f;
}

// `Kernel::template run<V>(arguments...)` (an HLF_INLINE static member, so that it is compiled for its caller's
// instruction set) with V = Vec16 on AVX-512, Vec8 on AVX2 with FMA, else Vec16 in generic code
#if defined(__x86_64__) && defined(__GNUC__)
template <class Kernel, class... Arguments>
__attribute__((target("avx512f"))) void run_avx512(Arguments... arguments) {
  Kernel::template run<Vec16>(arguments...);
}
template <class Kernel, class... Arguments>
__attribute__((target("avx2,fma"))) void run_avx2(Arguments... arguments) {
  Kernel::template run<Vec8>(arguments...);
}
#endif

template <class Kernel, class... Arguments>
void run_with_widest_vectors(Arguments... arguments) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const int64_t cpu_instruction_set =
      __builtin_cpu_supports("avx512f") ? kAvx512Instructions
      : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? kAvx2Instructions
                                                                        : kGenericInstructions;
  const int64_t instruction_set = std::min(cpu_instruction_set, max_instruction_set());
  if (instruction_set == kAvx512Instructions) return run_avx512<Kernel>(arguments...);
  if (instruction_set == kAvx2Instructions) return run_avx2<Kernel>(arguments...);
#endif
  Kernel::template run<Vec16>(arguments...);
}
