// THC kernels; see thc.h and the spec python/kvx_ref/thc.py.
//
// Speed: a chunk is processed one Hadamard block at a time (at most `block` floats,
// 256 KiB by default, so a block's passes run in L2): the encoder reads grad and
// residual, scales and clamps in one pass, flips signs (a variable shift a lane),
// transforms (strides 1, 2 and 4 within vectors of 8, then three levels a pass, the levels
// below 4096 tile by tile in L1), quantises with a 32-bit counter hash (vectorises,
// unlike a 64-bit one on AVX2), then computes its own digits' levels * r and transforms
// back, updating the residual in the last pass.  Only the digits (uint16) of the whole
// chunk are kept, for the final packing (words may straddle blocks); the decoder
// unpacks each block's summed digits as it goes.  The uniform table keeps its own
// quantiser loop (no lookups: it vectorises); other tables look their interval up by
// floor(p).  Every schedule applies the same butterflies in the same order per element
// as the level-by-level loop of the spec, so results are bit for bit the same.
#include "codecs/thc.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernel_util.h"
#include "stats.h"
#include "wire.h"

namespace kvx {

namespace {

bool block_valid(int64_t block) {
  return block >= kThcMinBlock && block <= kThcMaxBlock && (block & (block - 1)) == 0;
}

// The size of the next Hadamard block when `rest` elements are left (thc.h).
int64_t next_block(int64_t rest, int64_t block) {
  if (rest >= block) return block;
  if (rest >= kThcMinBlock)
    return int64_t{1} << (63 - __builtin_clzll(static_cast<uint64_t>(rest)));
  int64_t size = 1;
  while (size < rest) size *= 2;
  return size;
}

// The Hadamard layout of a chunk: block sizes and the padded size d.  Every block but
// a tail below kThcMinBlock is a multiple of 256 elements, so every block starts at a
// multiple of 64 (apply_signs relies on it).
struct Layout {
  std::vector<int64_t> sizes;
  int64_t d = 0;
  bool valid = false;
  Layout(int64_t n, int64_t block) {
    if (n < 0 || !block_valid(block)) return;
    valid = true;
    for (int64_t rest = n; rest > 0;) {
      sizes.push_back(next_block(rest, block));
      d += sizes.back();
      rest -= std::min(sizes.back(), rest);
    }
  }
};

// Per block: the forward scale s = float32(min(sqrt(d) / (M sqrt(B)), FLT_MAX)) (0 if
// M = 0), the guard bound = float32(2 sqrt(d / B)), and the inverse scale
// r = float32(M / (sqrt(d) sqrt(B))).  The float64 expressions are the spec's.
struct Scales {
  float s = 0.0f, bound = 0.0f, r = 0.0f;
  Scales(int64_t d, int64_t size, float max_norm) {
    const double dd = static_cast<double>(d), bs = static_cast<double>(size);
    const double m = static_cast<double>(max_norm);
    if (max_norm > 0.0f)
      s = static_cast<float>(std::min(std::sqrt(dd) / (m * std::sqrt(bs)),
                                      static_cast<double>(FLT_MAX)));
    bound = static_cast<float>(2.0 * std::sqrt(dd / bs));
    r = static_cast<float>(m / (std::sqrt(dd) * std::sqrt(bs)));
  }
};

// Flips the sign of x[i] where the shared sign of padded position first + i is
// negative: bit (first + i) % 64 of mix64(key + (first + i) / 64).  `first` is a
// multiple of 64 (Layout), so each group of 64 takes one hash.  The sign bit of lane j
// is bit j of a 32-bit half shifted up to bit 31: a variable shift a lane, which
// vectorises (a table of masks per byte did not: its copies stalled on the stack).
KVX_INLINE void flip_signs32(float* x, uint32_t half) {
  for (int j = 0; j < 32; ++j) {
    uint32_t bits;
    std::memcpy(&bits, x + j, sizeof bits);
    bits ^= (half << (31 - j)) & 0x80000000u;
    std::memcpy(x + j, &bits, sizeof bits);
  }
}

KVX_HOT void apply_signs(float* x, int64_t size, uint64_t key, int64_t first) {
  const int64_t full = size - size % 64;
  for (int64_t i0 = 0; i0 < full; i0 += 64) {
    const uint64_t h = thc_mix64(key + static_cast<uint64_t>((first + i0) >> 6));
    flip_signs32(x + i0, static_cast<uint32_t>(h));
    flip_signs32(x + i0 + 32, static_cast<uint32_t>(h >> 32));
  }
  if (full < size) {  // a tail block below 64 elements
    const uint64_t h = thc_mix64(key + static_cast<uint64_t>((first + full) >> 6));
    for (int64_t j = 0; j < size - full; ++j) {
      uint32_t bits;
      std::memcpy(&bits, x + full + j, sizeof bits);
      bits ^= static_cast<uint32_t>((h >> j) & 1u) << 31;
      std::memcpy(x + full + j, &bits, sizeof bits);
    }
  }
}

// out[i] = clamp(float32(acc[i] * s), -bound, bound) for i < m (acc = grad + residual,
// or x when residual is null), 0 up to size.
KVX_HOT void load_scaled(const float* grad, const float* residual, int64_t m, int64_t size,
                         float s, float bound, float* out) {
  if (residual != nullptr) {
    for (int64_t i = 0; i < m; ++i)
      out[i] = std::min(std::max((grad[i] + residual[i]) * s, -bound), bound);
  } else {
    for (int64_t i = 0; i < m; ++i) out[i] = std::min(std::max(grad[i] * s, -bound), bound);
  }
  for (int64_t i = m; i < size; ++i) out[i] = 0.0f;
}

// ---- the Walsh-Hadamard butterflies -------------------------------------------------
//
// Every schedule below computes the same butterflies (a + b, a - b) on the same pairs in
// the same level order, so results are those of the plain level-by-level loop.

// One level of stride h.
KVX_HOT void fwht_radix2(float* x, int64_t size, int64_t h) {
  for (int64_t i = 0; i < size; i += 2 * h) {
    float* a = x + i;
    float* b = x + i + h;
    for (int64_t j = 0; j < h; ++j) {
      const float u = a[j], v = b[j];
      a[j] = u + v;
      b[j] = u - v;
    }
  }
}

// Levels h, 2h and 4h in one pass over memory.
KVX_HOT void fwht_radix8(float* x, int64_t size, int64_t h) {
  for (int64_t i = 0; i < size; i += 8 * h) {
    float* p0 = x + i;
    float* p1 = p0 + h;
    float* p2 = p1 + h;
    float* p3 = p2 + h;
    float* p4 = p3 + h;
    float* p5 = p4 + h;
    float* p6 = p5 + h;
    float* p7 = p6 + h;
#pragma GCC ivdep  // the eight rows are disjoint (more than the alias checks GCC emits)
    for (int64_t j = 0; j < h; ++j) {
      const float a0 = p0[j] + p1[j], a1 = p0[j] - p1[j];
      const float a2 = p2[j] + p3[j], a3 = p2[j] - p3[j];
      const float a4 = p4[j] + p5[j], a5 = p4[j] - p5[j];
      const float a6 = p6[j] + p7[j], a7 = p6[j] - p7[j];
      const float b0 = a0 + a2, b2 = a0 - a2, b1 = a1 + a3, b3 = a1 - a3;
      const float b4 = a4 + a6, b6 = a4 - a6, b5 = a5 + a7, b7 = a5 - a7;
      p0[j] = b0 + b4;
      p4[j] = b0 - b4;
      p1[j] = b1 + b5;
      p5[j] = b1 - b5;
      p2[j] = b2 + b6;
      p6[j] = b2 - b6;
      p3[j] = b3 + b7;
      p7[j] = b3 - b7;
    }
  }
}

// Levels 1, 2 and 4 on each group of 8 floats.  In a vector of 8: level h pairs lane i
// with lane i ^ h; the lower lane of a pair keeps a + b (= b + a, exactly), the upper
// takes a - b, read from the swapped copy.
#if defined(__GNUC__) && !defined(__clang__)
typedef float Float8 __attribute__((vector_size(32)));
typedef int32_t Int8 __attribute__((vector_size(32)));
KVX_HOT void fwht_first3(float* x, int64_t size) {
  const Int8 swap1 = {1, 0, 3, 2, 5, 4, 7, 6}, pick1 = {0, 9, 2, 11, 4, 13, 6, 15};
  const Int8 swap2 = {2, 3, 0, 1, 6, 7, 4, 5}, pick2 = {0, 1, 10, 11, 4, 5, 14, 15};
  const Int8 swap4 = {4, 5, 6, 7, 0, 1, 2, 3}, pick4 = {0, 1, 2, 3, 12, 13, 14, 15};
  for (int64_t i = 0; i < size; i += 8) {
    Float8 v, p;
    std::memcpy(&v, x + i, sizeof v);
    p = __builtin_shuffle(v, swap1);
    v = __builtin_shuffle(v + p, p - v, pick1);
    p = __builtin_shuffle(v, swap2);
    v = __builtin_shuffle(v + p, p - v, pick2);
    p = __builtin_shuffle(v, swap4);
    v = __builtin_shuffle(v + p, p - v, pick4);
    std::memcpy(x + i, &v, sizeof v);
  }
}
#else
KVX_HOT void fwht_first3(float* x, int64_t size) {
  for (int64_t i = 0; i < size; i += 8) {
    float* y = x + i;
    const float a0 = y[0] + y[1], a1 = y[0] - y[1], a2 = y[2] + y[3], a3 = y[2] - y[3];
    const float a4 = y[4] + y[5], a5 = y[4] - y[5], a6 = y[6] + y[7], a7 = y[6] - y[7];
    const float b0 = a0 + a2, b2 = a0 - a2, b1 = a1 + a3, b3 = a1 - a3;
    const float b4 = a4 + a6, b6 = a4 - a6, b5 = a5 + a7, b7 = a5 - a7;
    y[0] = b0 + b4; y[4] = b0 - b4; y[1] = b1 + b5; y[5] = b1 - b5;
    y[2] = b2 + b6; y[6] = b2 - b6; y[3] = b3 + b7; y[7] = b3 - b7;
  }
}
#endif

// ---- dither, quantiser, packing ---------------------------------------------------------

// A 32-bit counter hash (Chris Wellons' "lowbias32" mixer, public domain): 24 bits of
// hash32(k + i) are the dither of position i.  Two 32-bit multiplies: 8 lanes on AVX2.
KVX_INLINE uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The 32-bit dither key of stream `key`.
uint32_t dither_key(uint64_t key) { return static_cast<uint32_t>(key ^ (key >> 32)); }

// The 24-bit uniform of padded position first + i.
KVX_INLINE float dither_at(uint32_t key, uint32_t first, int64_t i) {
  const uint32_t h = hash32(key + first + static_cast<uint32_t>(i));
  return static_cast<float>(static_cast<int32_t>(h >> 8)) * 0x1p-24f;
}

// The uniform table: digits[i] of z[i], padded position first + i: clamp to [-t, t],
// p = (z + t) * inv capped at top = g, digit = floor(p) + (u < p - floor(p)).
KVX_HOT void quantize_block(const float* z, int64_t size, float t, float inv, float top,
                            uint32_t key, uint32_t first, uint16_t* digits) {
  for (int64_t i = 0; i < size; ++i) {
    const float u = dither_at(key, first, i);
    const float zc = std::min(std::max(z[i], -t), t);
    const float p = std::min((zc + t) * inv, top);
    const int32_t lo = static_cast<int32_t>(p);  // p >= 0: floor
    const int32_t up = u < p - static_cast<float>(lo) ? 1 : 0;
    digits[i] = static_cast<uint16_t>(lo + up);
  }
}

// A non-uniform table's interval of every integer f in [0, g]: the entry below, t[j]
// (the largest with t[j] <= f, j <= q - 2), and the width t[j+1] - t[j]; p in [f, f + 1)
// lies in [t[j], t[j+1]] (entries are integers).  Empty for the uniform table, which
// quantize_block rounds without lookups.
struct Intervals {
  std::vector<float> below, width;
  bool uniform() const { return below.empty(); }
  explicit Intervals(const ThcParams& p) {
    if (p.table == kThcTableUniform) return;
    const int64_t g = thc_grid(p);
    below.resize(static_cast<size_t>(g + 1));
    width.resize(static_cast<size_t>(g + 1));
    int64_t j = 0;
    for (int64_t f = 0; f <= g; ++f) {
      while (j + 2 < p.levels && thc_table_value(p, j + 1) <= f) ++j;
      below[f] = static_cast<float>(thc_table_value(p, j));
      width[f] = static_cast<float>(thc_table_value(p, j + 1) - thc_table_value(p, j));
    }
  }
};

// Any table: digits[i] of z[i]: p as above (top = g), t[j] <= p <= t[j+1] from floor(p),
// digit = t[j] + w (u < (p - t[j]) / w), w = t[j+1] - t[j]: E[digit] = p.  p - t[j] is
// exact in float32 (t[j] = 0, or p <= t[j] + w <= 2 t[j] for the tables here: Sterbenz).
KVX_HOT void quantize_block_table(const float* z, int64_t size, float t, float inv, float top,
                                  const Intervals& table, uint32_t key, uint32_t first,
                                  uint16_t* digits) {
  const float* below = table.below.data();
  const float* width = table.width.data();
  for (int64_t i = 0; i < size; ++i) {
    const float u = dither_at(key, first, i);
    const float zc = std::min(std::max(z[i], -t), t);
    const float p = std::min((zc + t) * inv, top);
    const int32_t f = static_cast<int32_t>(p);  // p >= 0: floor
    const float lo = below[f], w = width[f];
    const float up = (u < (p - lo) / w) ? w : 0.0f;
    digits[i] = static_cast<uint16_t>(static_cast<int32_t>(lo + up));
  }
}

// words[w] = sum_j digits[w*D + j] * base^j (padding digits 0); D known at compile time.
template <int kDigits>
KVX_HOT void pack_words(const uint16_t* digits, int64_t d, int32_t base, float* words) {
  int32_t power[kDigits];
  for (int j = 0, v = 1; j < kDigits; ++j, v *= base) power[j] = v;
  const int64_t full = d / kDigits;
  for (int64_t w = 0; w < full; ++w) {
    int32_t word = 0;
    for (int j = 0; j < kDigits; ++j)
      word += static_cast<int32_t>(digits[w * kDigits + j]) * power[j];
    words[w] = static_cast<float>(word);
  }
  if (full * kDigits < d) {
    int32_t word = 0;
    for (int64_t j = 0; j < d - full * kDigits; ++j)
      word += static_cast<int32_t>(digits[full * kDigits + j]) * power[j];
    words[full] = static_cast<float>(word);
  }
}

void pack_any(const uint16_t* digits, int64_t d, int per_word, int32_t base, float* words) {
  switch (per_word) {
#define KVX_THC_PACK(D) case D: pack_words<D>(digits, d, base, words); break;
    KVX_THC_PACK(1) KVX_THC_PACK(2) KVX_THC_PACK(3) KVX_THC_PACK(4) KVX_THC_PACK(5)
    KVX_THC_PACK(6) KVX_THC_PACK(7) KVX_THC_PACK(8) KVX_THC_PACK(9) KVX_THC_PACK(10)
    KVX_THC_PACK(11) KVX_THC_PACK(12) KVX_THC_PACK(13) KVX_THC_PACK(14) KVX_THC_PACK(15)
    KVX_THC_PACK(16) KVX_THC_PACK(17) KVX_THC_PACK(18) KVX_THC_PACK(19) KVX_THC_PACK(20)
    KVX_THC_PACK(21) KVX_THC_PACK(22) KVX_THC_PACK(23) KVX_THC_PACK(24)
#undef KVX_THC_PACK
    default: break;  // base >= 2: at most 24 digits
  }
}

// Exact floor(x / p) for x < 2^24, 1 <= p < 2^24, by one multiply and shift
// (Granlund-Montgomery): with s = 24 + ceil(log2 p) and m = floor(2^s / p) + 1,
// x * m / 2^s = x / p + e, 0 < e < x / 2^s < 2^24 / 2^s <= 1 / p, and x / p is at least
// 1 / p below the next integer, so the floor is unchanged.
struct Divider {
  uint32_t mul = 0;  // < 2^25
  int shift = 0;
  explicit Divider(uint64_t p) {
    int log2p = 0;
    while ((uint64_t{1} << log2p) < p) ++log2p;
    shift = kMantissaF32 + log2p;
    mul = static_cast<uint32_t>((uint64_t{1} << shift) / p + 1);
  }
  uint32_t operator()(uint32_t x) const {
    return static_cast<uint32_t>((static_cast<uint64_t>(x) * mul) >> shift);
  }
};

// digits[w*D + j] = digit j of words[w] (base `div`'s divisor) for the d positions of
// the words; D known at compile time, so that words unpack side by side in vectors.
template <int kDigits>
KVX_HOT void unpack_words(const float* words, int64_t d, uint32_t base, Divider div,
                          uint32_t* digits) {
  const int64_t full = d / kDigits;
  for (int64_t w = 0; w < full; ++w) {
    uint32_t x = static_cast<uint32_t>(words[w]);
    for (int j = 0; j < kDigits; ++j) {
      const uint32_t q = div(x);
      digits[w * kDigits + j] = x - q * base;
      x = q;
    }
  }
  uint32_t x = full * kDigits < d ? static_cast<uint32_t>(words[full]) : 0;
  for (int64_t i = full * kDigits; i < d; ++i) {
    const uint32_t q = div(x);
    digits[i] = x - q * base;
    x = q;
  }
}

void unpack_any(const float* words, int64_t d, int per_word, uint32_t base, uint32_t* digits) {
  const Divider div(base);
  switch (per_word) {
#define KVX_THC_UNPACK(D) case D: unpack_words<D>(words, d, base, div, digits); break;
    KVX_THC_UNPACK(1) KVX_THC_UNPACK(2) KVX_THC_UNPACK(3) KVX_THC_UNPACK(4) KVX_THC_UNPACK(5)
    KVX_THC_UNPACK(6) KVX_THC_UNPACK(7) KVX_THC_UNPACK(8) KVX_THC_UNPACK(9) KVX_THC_UNPACK(10)
    KVX_THC_UNPACK(11) KVX_THC_UNPACK(12) KVX_THC_UNPACK(13) KVX_THC_UNPACK(14)
    KVX_THC_UNPACK(15) KVX_THC_UNPACK(16) KVX_THC_UNPACK(17) KVX_THC_UNPACK(18)
    KVX_THC_UNPACK(19) KVX_THC_UNPACK(20) KVX_THC_UNPACK(21) KVX_THC_UNPACK(22)
    KVX_THC_UNPACK(23) KVX_THC_UNPACK(24)
#undef KVX_THC_UNPACK
    default: break;  // base >= 2: at most 24 digits
  }
}

// Every word an integer in [0, limit): range test first, so that the conversion is
// defined (NaN fails it).
KVX_HOT bool words_are_digits(const float* words, int64_t count, float limit) {
  int32_t bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float v = words[i];
    const bool in_range = v >= 0.0f && v < limit;
    const float c = in_range ? v : 0.0f;
    bad |= static_cast<int32_t>(!in_range) |
           static_cast<int32_t>(static_cast<float>(static_cast<int32_t>(c)) != v);
  }
  return bad == 0;
}

// The float32 value of a sum S of `summed` digits: S * 2T / g - summed * T, computed in
// float64 (thc.h).
struct Levels {
  double delta, offset;
  Levels(const ThcParams& p, int64_t summed) {
    const double t = static_cast<double>(static_cast<float>(p.clamp));
    delta = 2.0 * t / static_cast<double>(thc_grid(p));
    offset = static_cast<double>(summed) * t;
  }
  float operator()(uint32_t s) const {
    return static_cast<float>(static_cast<double>(s) * delta - offset);
  }
};

// out[i] = float32(level(digits[i]) * r), Levels' arithmetic computed (it vectorises;
// a lookup would be a gather).
template <class Digit>
KVX_HOT void scale_levels(const Digit* digits, int64_t size, double delta, double offset,
                          float r, float* out) {
  for (int64_t i = 0; i < size; ++i)
    out[i] = static_cast<float>(static_cast<double>(digits[i]) * delta - offset) * r;
}

// The inverse transform of one block held in buf (already level * r): transform, signs.
void inverse_block(float* buf, int64_t size, uint64_t sign_key, int64_t first) {
  thc_fwht(buf, size);
  apply_signs(buf, size, sign_key, first);
}

KVX_HOT void finish_residual(const float* grad, float* residual, const float* own, int64_t m) {
  for (int64_t i = 0; i < m; ++i) residual[i] = (grad[i] + residual[i]) - own[i];
}

bool step_valid(int64_t step) { return step >= 0 && step < kThcMaxStep; }

// True if a norm is NaN: a worker's gradient was non-finite, the step is void.
bool void_norms(const float* norms, int64_t count) {
  for (int64_t w = 0; w < count; ++w)
    if (std::isnan(norms[w])) return true;
  return false;
}

void fill_nan(float* x, int64_t n) {
  std::fill(x, x + n, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace

// ---- layout and parameters -----------------------------------------------------------

int64_t thc_grid(const ThcParams& p) {
  if (p.levels < 2 || p.levels > kThcMaxLevels) return 0;
  if (p.table == kThcTableUniform) return p.levels - 1;
  if (p.table == kThcTableThc && p.levels == kThcTableThcLevels) return kThcTableThcGrid;
  return 0;
}

int64_t thc_table_value(const ThcParams& p, int64_t k) {
  if (thc_grid(p) == 0 || k < 0 || k >= p.levels) return -1;
  return p.table == kThcTableThc ? kThcTableThcValues[k] : k;
}

int64_t thc_sum_base(const ThcParams& p, int64_t num_workers) {
  const int64_t g = thc_grid(p);
  return g > 0 ? num_workers * g + 1 : 0;
}

bool thc_params_valid(const ThcParams& p, int64_t num_workers) {
  if (num_workers < 1 || num_workers > kThcMaxWorkers || thc_grid(p) == 0 ||
      !block_valid(p.block))
    return false;
  if (thc_sum_base(p, num_workers) > kExactF32) return false;
  const float t = static_cast<float>(p.clamp);
  return std::isfinite(p.clamp) && t > 0.0f && p.clamp <= kThcMaxClamp;
}

int64_t thc_blocks(int64_t n, int64_t block, int64_t* sizes, int64_t max_blocks) {
  const Layout layout(n, block);
  const int64_t count = static_cast<int64_t>(layout.sizes.size());
  if (!layout.valid) return 0;
  for (int64_t b = 0; b < std::min(count, max_blocks); ++b) sizes[b] = layout.sizes[b];
  return count;
}

int64_t thc_padded_size(int64_t n, int64_t block) {
  const Layout layout(n, block);
  return layout.valid ? layout.d : 0;
}

int64_t thc_packed_words(int64_t d, const ThcParams& p, int64_t num_workers) {
  if (d < 0 || thc_grid(p) == 0 || num_workers < 1 || num_workers > kThcMaxWorkers) return 0;
  const int digits = digits_per_word(thc_sum_base(p, num_workers), kMantissaF32);
  return digits > 0 ? ceil_div(d, digits) : 0;
}

int64_t thc_sum_words(int64_t n, const ThcParams& p, int64_t num_workers) {
  if (!thc_params_valid(p, num_workers)) return 0;
  return thc_packed_words(thc_padded_size(n, p.block), p, num_workers);
}

bool thc_max_norm(const float* norms, int64_t count, float* m) {
  float best = 0.0f;
  for (int64_t w = 0; w < count; ++w) {
    const float v = norms[w];
    if (!(v >= 0.0f) || !std::isfinite(v)) return false;  // NaN fails the first test
    best = std::max(best, v);
  }
  *m = best;
  return count >= 1;
}

// ---- randomness ----------------------------------------------------------------------

uint64_t thc_mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t thc_stream(uint64_t seed, uint64_t step, uint64_t who) {
  return thc_mix64(thc_mix64(thc_mix64(seed) ^ step) ^ who);
}

// ---- the transform -------------------------------------------------------------------

// Levels h, 2h, ... below `stop` of every `size`-float span of x (h a power of two).
static void fwht_levels(float* x, int64_t size, int64_t h, int64_t stop) {
  if (h == 1 && stop >= 8) {
    fwht_first3(x, size);
    h = 8;
  }
  for (; 8 * h <= stop; h *= 8) fwht_radix8(x, size, h);
  for (; h < stop; h *= 2) fwht_radix2(x, size, h);
}

// The levels below kFwhtTile run tile by tile, in L1; the rest over the whole block.
// Each element sees its butterflies in the same order as level by level.
constexpr int64_t kFwhtTile = 4096;

void thc_fwht(float* x, int64_t size) {
  const int64_t tile = std::min(size, kFwhtTile);
  for (int64_t i = 0; i < size; i += tile) fwht_levels(x + i, tile, 1, tile);
  fwht_levels(x, size, tile, size);
}

int thc_norm(const float* grad, const float* residual, int64_t n, float* norm) {
  *norm = 0.0f;
  if (n < 0) return kBadParam;
  if (!acc_all_finite(grad, residual, n)) {
    *norm = std::numeric_limits<float>::quiet_NaN();  // voids every worker's norm round
    return kNonFinite;
  }
  double squares = 0.0;
  if (n > 0) acc_filter_scores(grad, residual, 1, n, &squares);
  *norm = static_cast<float>(std::min(std::sqrt(squares), static_cast<double>(FLT_MAX)));
  return kOk;
}

static bool rotate_args_valid(int64_t n, float max_norm, int64_t step) {
  return n >= 0 && std::isfinite(max_norm) && max_norm >= 0.0f && step_valid(step);
}

int thc_rotate(const float* x, int64_t n, float max_norm, uint64_t seed, int64_t step,
               int64_t block, float* z) {
  const Layout layout(n, block);
  if (!layout.valid) return kBadParam;  // d unknown: nothing to zero
  if (!rotate_args_valid(n, max_norm, step)) {
    zero(z, layout.d);
    return kBadParam;
  }
  const uint64_t key = thc_stream(seed, static_cast<uint64_t>(step), 0);
  int64_t offset = 0;
  for (int64_t size : layout.sizes) {
    const Scales sc(layout.d, size, max_norm);
    load_scaled(x + offset, nullptr, std::min(size, n - offset), size, sc.s, sc.bound,
                z + offset);
    apply_signs(z + offset, size, key, offset);
    thc_fwht(z + offset, size);
    offset += size;
  }
  return kOk;
}

int thc_unrotate(const float* z, int64_t n, float max_norm, uint64_t seed, int64_t step,
                 int64_t block, float* out) {
  const Layout layout(n, block);
  if (n < 0) return kBadParam;
  if (!rotate_args_valid(n, max_norm, step) || !layout.valid) {
    zero(out, n);
    return kBadParam;
  }
  const uint64_t key = thc_stream(seed, static_cast<uint64_t>(step), 0);
  std::vector<float> buf;
  int64_t offset = 0;
  for (int64_t size : layout.sizes) {
    const Scales sc(layout.d, size, max_norm);
    buf.resize(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i) buf[i] = z[offset + i] * sc.r;
    inverse_block(buf.data(), size, key, offset);
    std::memcpy(out + offset, buf.data(),
                static_cast<size_t>(std::min(size, n - offset)) * sizeof(float));
    offset += size;
  }
  return kOk;
}

// ---- quantisation and packing ----------------------------------------------------------

// Digits of z[0, size) at padded positions first, first + 1, ... (`table`: Intervals(p)).
static void quantize_digits(const float* z, int64_t size, const ThcParams& p,
                            const Intervals& table, uint32_t key, int64_t first,
                            uint16_t* digits) {
  const float t = static_cast<float>(p.clamp);
  const int64_t g = thc_grid(p);
  const float inv = static_cast<float>(static_cast<double>(g) / (2.0 * static_cast<double>(t)));
  if (table.uniform())
    quantize_block(z, size, t, inv, static_cast<float>(g), key, static_cast<uint32_t>(first),
                   digits);
  else
    quantize_block_table(z, size, t, inv, static_cast<float>(g), table, key,
                         static_cast<uint32_t>(first), digits);
}

int thc_quantize(const float* z, int64_t d, const ThcParams& p, int64_t num_workers,
                 int64_t rank, int64_t step, float* words) {
  if (d < 0 || !thc_params_valid(p, num_workers) || rank < 0 || rank >= num_workers ||
      !step_valid(step))
    return kBadParam;
  if (!all_finite(z, d)) return kNonFinite;  // a NaN has no code (nor a defined floor)
  std::vector<uint16_t> digits(static_cast<size_t>(d));
  const uint64_t key =
      thc_stream(p.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(rank) + 1);
  quantize_digits(z, d, p, Intervals(p), dither_key(key), 0, digits.data());
  const int64_t base = thc_sum_base(p, num_workers);
  pack_any(digits.data(), d, digits_per_word(base, kMantissaF32), static_cast<int32_t>(base),
           words);
  return kOk;
}

// Checks that each of num_words words (valid parameters) is a whole number of
// digits_per_word digits: kOk or kBadWord.
static int check_digits(const float* words, int64_t num_words, const ThcParams& p,
                        int64_t num_workers) {
  const int64_t base = thc_sum_base(p, num_workers);
  const int digits = digits_per_word(base, kMantissaF32);
  int64_t limit = 1;
  for (int j = 0; j < digits; ++j) limit *= base;  // <= 2^24: exact in float32
  return words_are_digits(words, num_words, static_cast<float>(limit)) ? kOk : kBadWord;
}

// Checks words (num_words for d positions packed for num_workers): kOk, kBadParam or
// kBadWord.
static int check_words(const float* words, int64_t num_words, int64_t d, const ThcParams& p,
                       int64_t num_workers) {
  if (d < 0 || !thc_params_valid(p, num_workers)) return kBadParam;
  if (num_words != ceil_div(d, digits_per_word(thc_sum_base(p, num_workers), kMantissaF32)))
    return kBadParam;
  return check_digits(words, num_words, p, num_workers);
}

// sums[0, count): the summed digits of padded positions [first, first + count) of
// checked words; a block's digits stay in cache until they are used.
static void unpack_sums(const float* words, int64_t first, int64_t count, const ThcParams& p,
                        int64_t num_workers, uint32_t* sums) {
  const uint32_t base = static_cast<uint32_t>(thc_sum_base(p, num_workers));
  const int per_word = digits_per_word(base, kMantissaF32);
  int64_t i = 0;
  if (first % per_word != 0) {  // the rest of the word that holds position `first`
    const Divider div(base);
    uint32_t x = static_cast<uint32_t>(words[first / per_word]);
    for (int64_t k = 0; k < first % per_word; ++k) x = div(x);
    for (int64_t k = first % per_word; k < per_word && i < count; ++k, ++i) {
      const uint32_t q = div(x);
      sums[i] = x - q * base;
      x = q;
    }
  }
  unpack_any(words + (first + i) / per_word, count - i, per_word, base, sums + i);
}

int thc_dequantize(const float* words, int64_t num_words, int64_t d, const ThcParams& p,
                   int64_t num_workers, int64_t summed, float* values) {
  int status = summed < 1 || summed > num_workers ? kBadParam : kOk;
  if (status == kOk) status = check_words(words, num_words, d, p, num_workers);
  if (status != kOk) {
    zero(values, d);
    return status;
  }
  const Levels levels(p, summed);
  std::vector<uint32_t> sums(static_cast<size_t>(d));
  unpack_sums(words, 0, d, p, num_workers, sums.data());
  for (int64_t i = 0; i < d; ++i) values[i] = levels(sums[i]);
  return kOk;
}

// ---- one step ------------------------------------------------------------------------

int thc_encode(const float* grad, float* residual, int64_t n, const float* norms,
               int64_t num_workers, int64_t rank, int64_t step, const ThcParams& p,
               float* words) {
  if (n < 0 || !thc_params_valid(p, num_workers)) return kBadParam;  // word count unknown
  const int64_t num_words = thc_sum_words(n, p, num_workers);
  const Layout layout(n, p.block);
  if (rank < 0 || rank >= num_workers || !step_valid(step) || !layout.valid) {
    zero(words, num_words);
    return kBadParam;
  }
  // a void step (this worker's gradient, or a NaN norm: another's): a void payload
  if (!acc_all_finite(grad, residual, n)) {
    fill_nan(words, num_words);
    return kNonFinite;
  }
  if (void_norms(norms, num_workers)) {
    fill_nan(words, num_words);
    return kVoid;
  }
  float m = 0.0f;
  if (!thc_max_norm(norms, num_workers, &m)) {
    zero(words, num_words);
    return kBadParam;
  }
  const uint64_t sign_key = thc_stream(p.seed, static_cast<uint64_t>(step), 0);
  const uint32_t dither = dither_key(
      thc_stream(p.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(rank) + 1));
  const Levels own(p, 1);
  const Intervals intervals(p);
  std::vector<uint16_t> digits(static_cast<size_t>(layout.d));
  std::vector<float> buf;
  int64_t offset = 0;
  for (int64_t size : layout.sizes) {
    const int64_t m_here = std::min(size, n - offset);
    const Scales sc(layout.d, size, m);
    buf.resize(static_cast<size_t>(size));
    // rotate: scale, clamp to the guard, signs, transform
    load_scaled(grad + offset, residual + offset, m_here, size, sc.s, sc.bound, buf.data());
    apply_signs(buf.data(), size, sign_key, offset);
    thc_fwht(buf.data(), size);
    // quantise
    uint16_t* c = digits.data() + offset;
    quantize_digits(buf.data(), size, p, intervals, dither, offset, c);
    // this worker's own decoding: level * r, transform, signs; residual = acc - that
    scale_levels(c, size, own.delta, own.offset, sc.r, buf.data());
    inverse_block(buf.data(), size, sign_key, offset);
    finish_residual(grad + offset, residual + offset, buf.data(), m_here);
    offset += size;
  }
  const int64_t base = thc_sum_base(p, num_workers);
  pack_any(digits.data(), layout.d, digits_per_word(base, kMantissaF32),
           static_cast<int32_t>(base), words);
  return kOk;
}

int thc_decode_sum(const float* words, int64_t num_words, int64_t n, const float* norms,
                   int64_t num_workers, int64_t step, const ThcParams& p, float* out) {
  const Layout layout(n, p.block);
  float m = 0.0f;
  if (n < 0) return kBadParam;
  if (!thc_params_valid(p, num_workers) || !step_valid(step) || !layout.valid ||
      num_words != thc_packed_words(layout.d, p, num_workers)) {
    zero(out, n);
    return kBadParam;
  }
  if (void_norms(norms, num_workers)) {  // a worker's gradient was non-finite
    fill_nan(out, n);
    return kVoid;
  }
  if (!thc_max_norm(norms, num_workers, &m)) {
    zero(out, n);
    return kBadParam;
  }
  // the parameters and the word count were checked above, before a void step answers
  const int status = check_digits(words, num_words, p, num_workers);
  if (status != kOk) {
    zero(out, n);
    return status;
  }
  const uint64_t sign_key = thc_stream(p.seed, static_cast<uint64_t>(step), 0);
  const Levels levels(p, num_workers);
  std::vector<uint32_t> sums;
  std::vector<float> tail;
  int64_t offset = 0;
  for (int64_t size : layout.sizes) {
    const Scales sc(layout.d, size, m);
    const int64_t m_here = std::min(size, n - offset);
    if (m_here < size) tail.resize(static_cast<size_t>(size));  // padded: transform aside
    float* b = m_here < size ? tail.data() : out + offset;
    sums.resize(static_cast<size_t>(size));
    unpack_sums(words, offset, size, p, num_workers, sums.data());
    scale_levels(sums.data(), size, levels.delta, levels.offset, sc.r, b);
    inverse_block(b, size, sign_key, offset);
    if (b != out + offset)
      std::memcpy(out + offset, b, static_cast<size_t>(m_here) * sizeof(float));
    offset += size;
  }
  return kOk;
}

}  // namespace kvx
