// What the kernel files share and callers do not see: runtime-dispatched hot loops and
// small element-wise helpers.
//
// Hot loops are branch-free so that GCC vectorises them, and are compiled for AVX-512,
// AVX2 and baseline x86-64 with runtime dispatch (target_clones).  Build without
// -ffast-math and with -ffp-contract=off: results must match the NumPy reference bit for
// bit.
#ifndef KVX_KERNEL_UTIL_H_
#define KVX_KERNEL_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "wire.h"

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__)) \
    && !defined(KVX_NO_CLONES)
#define KVX_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KVX_HOT
#endif
#define KVX_INLINE inline __attribute__((always_inline))

// Selections (element top-k's candidates, AdaComp's) have an AVX2 path written with
// intrinsics, chosen at run time by have_avx2(): GCC does not vectorise a loop that
// appends what it selects.  The baseline build (KVX_NO_CLONES) tests the portable path.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(KVX_NO_CLONES)
#define KVX_AVX2 1
#include <immintrin.h>
#endif

namespace kvx {

// acc[i] += values[i].
void add_into(float* acc, const float* values, int64_t n);

#ifdef KVX_AVX2
inline bool have_avx2() { return __builtin_cpu_supports("avx2"); }
// For each 8-bit mask, the lanes it sets in order, then zeros: the permutation
// (_mm256_permutevar8x32) that packs a register's selected lanes to its front, as
// AVX-512's compress would.
struct PackLanes {
  alignas(32) int32_t lanes[256][8];
  PackLanes();
};
extern const PackLanes kPackLanes;

// Room in `index` and `values` for 8 entries after the first `count`: an AVX2 selection
// stores a whole register at its count.
inline void room_for_eight(std::vector<int32_t>* index, std::vector<float>* values,
                           int64_t count) {
  if (count + 8 > static_cast<int64_t>(index->size())) {
    index->resize(2 * index->size() + 8);
    values->resize(index->size());
  }
}
#endif

inline void zero(float* x, int64_t n) {
  if (n > 0) std::memset(x, 0, static_cast<size_t>(n) * sizeof(float));
}

// A payload word holding part of an index: its integer if it is an exact float32 integer
// in [0, 2^24), else -1 (a NaN or garbage word never becomes an index).
inline int64_t index_word(float word) {
  const double v = word;
  return v >= 0.0 && v < static_cast<double>(kExactF32) && v == std::floor(v)
             ? static_cast<int64_t>(v) : -1;
}

}  // namespace kvx

#endif  // KVX_KERNEL_UTIL_H_
