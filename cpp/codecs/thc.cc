// THC kernels; see thc.h and the spec python/kvx_ref/thc.py.
#include "codecs/thc.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
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
  if (rest >= kThcMinBlock) return int64_t{1} << (63 - __builtin_clzll(static_cast<uint64_t>(rest)));
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

// Flips the sign of x[i] where the shared sign of padded position first + i is
// negative: bit (first + i) % 64 of mix64(key + (first + i) / 64).  `first` is a
// multiple of 64 (Layout), so each group of 64 takes one hash.
KVX_HOT void apply_signs(float* x, int64_t size, uint64_t key, int64_t first) {
  for (int64_t i0 = 0; i0 < size; i0 += 64) {
    const uint64_t h = thc_mix64(key + static_cast<uint64_t>((first + i0) >> 6));
    const int64_t m = std::min<int64_t>(64, size - i0);
    uint32_t bits[64];
    std::memcpy(bits, x + i0, static_cast<size_t>(m) * sizeof(float));
    for (int64_t j = 0; j < m; ++j) bits[j] ^= static_cast<uint32_t>((h >> j) & 1u) << 31;
    std::memcpy(x + i0, bits, static_cast<size_t>(m) * sizeof(float));
  }
}

// out[i] = float32(clamp(double(x[i]) * factor, -bound, bound)) for i < m, 0 up to size.
KVX_HOT void scale_block(const float* x, int64_t m, int64_t size, double factor, double bound,
                         float* out) {
  for (int64_t i = 0; i < m; ++i)
    out[i] = static_cast<float>(std::min(std::max(static_cast<double>(x[i]) * factor, -bound),
                                         bound));
  for (int64_t i = m; i < size; ++i) out[i] = 0.0f;
}

// out[i] = float32(double(h[i]) * factor).
KVX_HOT void unscale(const float* h, int64_t m, double factor, float* out) {
  for (int64_t i = 0; i < m; ++i)
    out[i] = static_cast<float>(static_cast<double>(h[i]) * factor);
}

// The butterflies of one stride h over a block: pairs (j, j + h) within runs of 2h.
KVX_HOT void fwht_stride(float* x, int64_t size, int64_t h) {
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

// Strides 1, 2 and 4 together, 8 floats at a time: the same butterflies as three
// fwht_stride passes (so the same float32 results), one pass over memory.
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

// Exact floor(x / p) for x < 2^24, 1 <= p < 2^24, by one multiply and shift
// (Granlund-Montgomery): with s = 24 + ceil(log2 p) and m = floor(2^s / p) + 1,
// x * m / 2^s = x / p + e, 0 < e < x / 2^s < 2^24 / 2^s <= 1 / p, and x / p is at least
// 1 / p below the next integer, so the floor is unchanged.
struct Divider {
  uint64_t mul = 0;
  int shift = 0;
  explicit Divider(uint64_t p) {
    int log2p = 0;
    while ((uint64_t{1} << log2p) < p) ++log2p;
    shift = kMantissaF32 + log2p;
    mul = (uint64_t{1} << shift) / p + 1;
  }
  uint32_t operator()(uint32_t x) const { return static_cast<uint32_t>((x * mul) >> shift); }
};

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

// Codes of z[0, d) into codes[0, d): the quantiser of thc.h with worker stream `key`.
KVX_HOT void quantize_codes(const float* z, int64_t d, float t, float inv, float top,
                            uint64_t key, int32_t* codes) {
  for (int64_t i0 = 0; i0 < d; i0 += 2) {
    const uint64_t h = thc_mix64(key + static_cast<uint64_t>(i0 >> 1));
    const int64_t m = std::min<int64_t>(2, d - i0);
    for (int64_t j = 0; j < m; ++j) {
      const float u = static_cast<float>((h >> (32 * j)) & 0xFFFFFFu) * 0x1p-24f;
      const float zc = std::min(std::max(z[i0 + j], -t), t);
      const float p = std::min((zc + t) * inv, top);
      const float lo = std::floor(p);
      codes[i0 + j] = static_cast<int32_t>(lo) + static_cast<int32_t>(u < p - lo);
    }
  }
}

// values[i] = float32(double(S_i) * delta - offset), S_i the digits of the words.
KVX_HOT void unpack_values(const float* words, int64_t d, int digits, uint32_t base,
                           const Divider& div, double delta, double offset, float* values) {
  for (int64_t i0 = 0; i0 < d; i0 += digits) {
    uint32_t x = static_cast<uint32_t>(words[i0 / digits]);
    const int64_t m = std::min<int64_t>(digits, d - i0);
    for (int64_t j = 0; j < m; ++j) {
      const uint32_t q = div(x);
      values[i0 + j] = static_cast<float>(static_cast<double>(x - q * base) * delta - offset);
      x = q;
    }
  }
}

// Level values of codes summed over `summed` workers: S * delta - summed * T.
double level_delta(const ThcParams& p) {
  const double t = static_cast<double>(static_cast<float>(p.clamp));
  return 2.0 * t / static_cast<double>(p.levels - 1);
}
double level_offset(const ThcParams& p, int64_t summed) {
  return static_cast<double>(summed) * static_cast<double>(static_cast<float>(p.clamp));
}

}  // namespace

// ---- layout and parameters -----------------------------------------------------------

bool thc_params_valid(const ThcParams& p, int64_t num_workers) {
  if (num_workers < 1 || num_workers > kThcMaxWorkers || p.levels < 2 ||
      p.levels > kExactF32 || !block_valid(p.block))
    return false;
  if (thc_sum_base(p.levels, num_workers) > kExactF32) return false;
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

int64_t thc_packed_words(int64_t d, int64_t levels, int64_t num_workers) {
  if (d < 0 || levels < 2 || levels > kExactF32 || num_workers < 1 ||
      num_workers > kThcMaxWorkers)
    return 0;
  const int digits = digits_per_word(thc_sum_base(levels, num_workers), kMantissaF32);
  return digits > 0 ? ceil_div(d, digits) : 0;
}

int64_t thc_sum_words(int64_t n, const ThcParams& p, int64_t num_workers) {
  if (!thc_params_valid(p, num_workers)) return 0;
  return thc_packed_words(thc_padded_size(n, p.block), p.levels, num_workers);
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

KVX_HOT void thc_fwht(float* x, int64_t size) {
  int64_t h = 1;
  if (size >= 8) {
    fwht_first3(x, size);
    h = 8;
  }
  for (; h < size; h *= 2) fwht_stride(x, size, h);
}

int thc_norm(const float* grad, const float* residual, int64_t n, float* norm) {
  *norm = 0.0f;
  if (n < 0) return kBadParam;
  if (!acc_all_finite(grad, residual, n)) return kNonFinite;
  double squares = 0.0;
  if (n > 0) acc_filter_scores(grad, residual, 1, n, &squares);
  *norm = static_cast<float>(std::min(std::sqrt(squares), static_cast<double>(FLT_MAX)));
  return kOk;
}

static bool rotate_args_valid(int64_t n, float max_norm, int64_t step) {
  return n >= 0 && std::isfinite(max_norm) && max_norm >= 0.0f && step >= 0 &&
         step < kThcMaxStep;
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
  const double d = static_cast<double>(layout.d);
  int64_t offset = 0;
  for (int64_t b = 0; b < static_cast<int64_t>(layout.sizes.size()); ++b) {
    const int64_t size = layout.sizes[b];
    const double bs = static_cast<double>(size);
    const double factor = max_norm > 0.0f
        ? std::sqrt(d) / (static_cast<double>(max_norm) * std::sqrt(bs)) : 0.0;
    const double bound = 2.0 * std::sqrt(d / bs);
    scale_block(x + offset, std::min(size, n - offset), size, factor, bound, z + offset);
    apply_signs(z + offset, size, key, offset);
    thc_fwht(z + offset, size);
    offset += size;
  }
  return kOk;
}

// The inverse into out[0, n), through `scratch` (d floats, may be z itself when z may
// be overwritten).
static void unrotate_into(const float* z, const Layout& layout, int64_t n, float max_norm,
                          uint64_t key, float* scratch, float* out) {
  const double d = static_cast<double>(layout.d);
  if (scratch != z) std::memcpy(scratch, z, static_cast<size_t>(layout.d) * sizeof(float));
  int64_t offset = 0;
  for (int64_t b = 0; b < static_cast<int64_t>(layout.sizes.size()); ++b) {
    const int64_t size = layout.sizes[b];
    const double factor =
        static_cast<double>(max_norm) / (std::sqrt(d) * std::sqrt(static_cast<double>(size)));
    float* block = scratch + offset;
    thc_fwht(block, size);
    unscale(block, size, factor, block);
    apply_signs(block, size, key, offset);
    offset += size;
  }
  if (out != scratch) std::memcpy(out, scratch, static_cast<size_t>(n) * sizeof(float));
}

int thc_unrotate(const float* z, int64_t n, float max_norm, uint64_t seed, int64_t step,
                 int64_t block, float* out) {
  const Layout layout(n, block);
  if (n < 0) return kBadParam;
  if (!rotate_args_valid(n, max_norm, step) || !layout.valid) {
    zero(out, n);
    return kBadParam;
  }
  std::vector<float> scratch(static_cast<size_t>(layout.d));
  unrotate_into(z, layout, n, max_norm, thc_stream(seed, static_cast<uint64_t>(step), 0),
                scratch.data(), out);
  return kOk;
}

// ---- quantisation and packing ----------------------------------------------------------

static void pack_codes(const int32_t* codes, int64_t d, int digits, int32_t base,
                       float* words) {
  for (int64_t w = 0, i0 = 0; i0 < d; ++w, i0 += digits) {
    const int64_t m = std::min<int64_t>(digits, d - i0);
    int32_t word = 0;  // Horner from the highest digit; < base^digits <= 2^24
    for (int64_t j = m - 1; j >= 0; --j) word = word * base + codes[i0 + j];
    words[w] = static_cast<float>(word);
  }
}

static void quantize_into(const float* z, int64_t d, const ThcParams& p, int64_t num_workers,
                          int64_t rank, int64_t step, int32_t* codes, float* words) {
  const float t = static_cast<float>(p.clamp);
  const float inv =
      static_cast<float>(static_cast<double>(p.levels - 1) / (2.0 * static_cast<double>(t)));
  const uint64_t key =
      thc_stream(p.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(rank) + 1);
  quantize_codes(z, d, t, inv, static_cast<float>(p.levels - 1), key, codes);
  const int64_t base = thc_sum_base(p.levels, num_workers);
  pack_codes(codes, d, digits_per_word(base, kMantissaF32), static_cast<int32_t>(base), words);
}

int thc_quantize(const float* z, int64_t d, const ThcParams& p, int64_t num_workers,
                 int64_t rank, int64_t step, float* words) {
  if (d < 0 || !thc_params_valid(p, num_workers) || rank < 0 || rank >= num_workers ||
      step < 0 || step >= kThcMaxStep)
    return kBadParam;
  if (!all_finite(z, d)) return kNonFinite;  // a NaN has no code (nor a defined floor)
  std::vector<int32_t> codes(static_cast<size_t>(d));
  quantize_into(z, d, p, num_workers, rank, step, codes.data(), words);
  return kOk;
}

// Checks words against (d, p, num_workers); on kOk writes the level values of `summed`
// workers' codes.
static int dequantize_checked(const float* words, int64_t num_words, int64_t d,
                              const ThcParams& p, int64_t num_workers, int64_t summed,
                              float* values) {
  if (d < 0 || !thc_params_valid(p, num_workers) || summed < 1 || summed > num_workers)
    return kBadParam;
  const int64_t base = thc_sum_base(p.levels, num_workers);
  const int digits = digits_per_word(base, kMantissaF32);
  if (num_words != ceil_div(d, digits)) return kBadParam;
  int64_t limit = 1;
  for (int j = 0; j < digits; ++j) limit *= base;  // <= 2^24: exact in float32
  if (!words_are_digits(words, num_words, static_cast<float>(limit))) return kBadWord;
  unpack_values(words, d, digits, static_cast<uint32_t>(base),
                Divider(static_cast<uint64_t>(base)), level_delta(p), level_offset(p, summed),
                values);
  return kOk;
}

int thc_dequantize(const float* words, int64_t num_words, int64_t d, const ThcParams& p,
                   int64_t num_workers, int64_t summed, float* values) {
  const int status = dequantize_checked(words, num_words, d, p, num_workers, summed, values);
  if (status != kOk) zero(values, d);
  return status;
}

// ---- one step ------------------------------------------------------------------------

KVX_HOT static void subtract_into(float* residual, const float* grad, const float* own,
                                  int64_t n) {
  for (int64_t i = 0; i < n; ++i) residual[i] = (grad[i] + residual[i]) - own[i];
}

int thc_encode(const float* grad, float* residual, int64_t n, const float* norms,
               int64_t num_workers, int64_t rank, int64_t step, const ThcParams& p,
               float* words) {
  if (n < 0 || !thc_params_valid(p, num_workers)) return kBadParam;  // word count unknown
  const int64_t num_words = thc_sum_words(n, p, num_workers);
  const Layout layout(n, p.block);
  float m = 0.0f;
  if (rank < 0 || rank >= num_workers || step < 0 || step >= kThcMaxStep ||
      !thc_max_norm(norms, num_workers, &m) || !layout.valid) {
    zero(words, num_words);
    return kBadParam;
  }
  if (!acc_all_finite(grad, residual, n)) {
    zero(words, num_words);
    return kNonFinite;
  }
  // acc, then z in the same buffer; codes; then this worker's own decoding in place
  std::vector<float> z(static_cast<size_t>(std::max<int64_t>(layout.d, n)));
  for (int64_t i = 0; i < n; ++i) z[i] = grad[i] + residual[i];
  thc_rotate(z.data(), n, m, p.seed, step, p.block, z.data());
  std::vector<int32_t> codes(static_cast<size_t>(layout.d));
  quantize_into(z.data(), layout.d, p, num_workers, rank, step, codes.data(), words);
  const double delta = level_delta(p), offset = level_offset(p, 1);
  for (int64_t i = 0; i < layout.d; ++i)
    z[i] = static_cast<float>(static_cast<double>(codes[i]) * delta - offset);
  unrotate_into(z.data(), layout, n, m, thc_stream(p.seed, static_cast<uint64_t>(step), 0),
                z.data(), z.data());
  subtract_into(residual, grad, z.data(), n);
  return kOk;
}

int thc_decode_sum(const float* words, int64_t num_words, int64_t n, const float* norms,
                   int64_t num_workers, int64_t step, const ThcParams& p, float* out) {
  const Layout layout(n, p.block);
  float m = 0.0f;
  if (n < 0) return kBadParam;
  if (!thc_params_valid(p, num_workers) || step < 0 || step >= kThcMaxStep ||
      !thc_max_norm(norms, num_workers, &m) || !layout.valid) {
    zero(out, n);
    return kBadParam;
  }
  std::vector<float> values(static_cast<size_t>(layout.d));
  const int status =
      dequantize_checked(words, num_words, layout.d, p, num_workers, num_workers, values.data());
  if (status != kOk) {
    zero(out, n);
    return status;
  }
  unrotate_into(values.data(), layout, n, m, thc_stream(p.seed, static_cast<uint64_t>(step), 0),
                values.data(), out);
  return kOk;
}

}  // namespace kvx
