// Codec kernels of kvstore_ext; see kernels.h and python/kvx_ref (the spec).
//
// Speed notes.  The kernels are memory bound: an encoder must read grad and residual
// twice (a first pass finds the statistic -- mean |acc|, filter scores -- or just checks
// that acc is finite, because a non-finite step must leave the residual untouched), then
// write the residual and the payload.  Hot loops are branch-free so that GCC vectorises
// them, and are compiled for AVX-512, AVX2 and baseline x86-64 with runtime dispatch
// (target_clones).  Build without -ffast-math and with -ffp-contract=off: results must
// match the NumPy reference bit for bit.
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__)) \
    && !defined(KVX_NO_CLONES)
#define KVX_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KVX_HOT
#endif
#define KVX_INLINE inline __attribute__((always_inline))

namespace kvx {

const char* status_name(int status) {
  switch (status) {
    case kOk: return "ok";
    case kNonFinite: return "non-finite value in grad + residual";
    case kBadMagic: return "bad magic word";
    case kBadVersion: return "unsupported wire version";
    case kBadCodec: return "payload of another codec";
    case kBadSize: return "size mismatch";
    case kBadParam: return "bad codec parameter";
    case kBadIndex: return "bad filter index";
    case kBadWord: return "bad packed word";
    default: return "unknown status";
  }
}

int digits_per_word(int64_t base, int mantissa_bits) {
  if (base < 2 || mantissa_bits < 1 || mantissa_bits > 62) return 0;
  const int64_t limit = int64_t{1} << mantissa_bits;
  int d = 0;
  for (int64_t power = 1; power <= limit / base; power *= base) ++d;
  return d;
}

int64_t ternary_sum_words(int64_t n, int64_t num_workers) {
  if (num_workers < 1 || num_workers > kMaxWorkers) return 0;
  return ceil_div(n, digits_per_word(sum_base(num_workers), kMantissaF32));
}

// True when the integer v survives a round trip through float32 (the header stores
// counts as float32 words).
static bool exact_in_f32(int64_t v) {
  return static_cast<int64_t>(static_cast<float>(v)) == v;
}
// Element counts travel as two float32 words (n mod 2^24, n div 2^24).
static bool count_fits_header(int64_t n) { return n >= 0 && n < (kExactF32 << 24); }

// A threshold is used as float32: it must be finite there too (1e39 would become Inf,
// and 0 * Inf = NaN would then enter the residual).  IEEE rounding, as NumPy's f32().
static bool threshold_valid(double threshold) {
  return threshold >= 0.0 && std::isfinite(threshold) &&
         std::isfinite(static_cast<float>(threshold));
}

void write_header(float* payload, float codec, int64_t n, float a, float b,
                  int64_t body_words) {
  payload[0] = kMagic;
  payload[1] = codec;
  payload[2] = kVersion;
  payload[3] = static_cast<float>(n % kExactF32);
  payload[4] = static_cast<float>(n / kExactF32);
  payload[5] = a;
  payload[6] = b;
  payload[7] = static_cast<float>(body_words);
}

int check_header(const float* payload, int64_t payload_words, float codec, int64_t n,
                 float* a, float* b) {
  *a = 0.0f;
  *b = 0.0f;
  if (payload_words < kHeaderWords) return kBadSize;
  // Negated comparisons so that NaN words fail, like `h[0] != MAGIC` in the spec.
  if (!(payload[0] == kMagic)) return kBadMagic;
  if (!(payload[2] == kVersion)) return kBadVersion;
  if (!(payload[1] == codec)) return kBadCodec;
  // The spec compares in float64: h[3] + h[4] * 2^24 == n, h[7] == body length.
  const double count = static_cast<double>(payload[3]) +
                       static_cast<double>(payload[4]) * static_cast<double>(kExactF32);
  if (!(count == static_cast<double>(n)) ||
      !(static_cast<double>(payload[7]) == static_cast<double>(payload_words - kHeaderWords)))
    return kBadSize;
  *a = payload[5];
  *b = payload[6];
  return kOk;
}

// ---- NumPy-order float64 summation ----------------------------------------------------
//
// NumPy 1.x reduces a contiguous float64 array in chunks of its buffer size (8192
// elements), adding each chunk's pairwise sum (blocks of <= 128 summed with 8 interleaved
// accumulators, larger ranges split in two at a multiple of 8) to the running total.
// Reproducing that order gives the reference's thresholds and filter scores exactly, so
// top-k ties and near-ties resolve identically.  The 8-accumulator leaf is also what
// makes the loop vectorisable without reassociating anything.

constexpr int64_t kNumpyChunk = 8192;
constexpr int64_t kPairwiseBlock = 128;

// Pairwise leaf over [begin, begin + n), n <= 128, term(i) giving the float64 summand.
template <class Term>
KVX_INLINE double pairwise_leaf(const Term& term, int64_t begin, int64_t n) {
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; ++i) res += term(begin + i);
    return res;
  }
  double r[8];
  for (int j = 0; j < 8; ++j) r[j] = term(begin + j);
  int64_t i = 8;
  for (; i < n - (n % 8); i += 8)
    for (int j = 0; j < 8; ++j) r[j] += term(begin + i + j);
  double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
  for (; i < n; ++i) res += term(begin + i);
  return res;
}

// Pairwise sum of one chunk (n <= 8192): NumPy's recursion, run with an explicit stack
// so that everything inlines into the caller's (vectorised, target-cloned) body.
template <class Term>
KVX_INLINE double pairwise_chunk(const Term& term, int64_t begin, int64_t n) {
  if (n <= kPairwiseBlock) return pairwise_leaf(term, begin, n);
  struct Frame { int64_t begin, n; bool expanded; };
  Frame stack[64];
  double values[64];
  int frames = 0, nvalues = 0;
  stack[frames++] = {begin, n, false};
  while (frames > 0) {
    Frame& f = stack[frames - 1];
    if (f.n <= kPairwiseBlock) {
      values[nvalues++] = pairwise_leaf(term, f.begin, f.n);
      --frames;
    } else if (!f.expanded) {
      f.expanded = true;
      int64_t half = f.n / 2;
      half -= half % 8;
      const Frame right = {f.begin + half, f.n - half, false};
      const Frame left = {f.begin, half, false};
      stack[frames++] = right;  // evaluated second
      stack[frames++] = left;   // evaluated first
    } else {
      const double right = values[--nvalues];
      const double left = values[--nvalues];
      values[nvalues++] = left + right;
      --frames;
    }
  }
  return values[0];
}

template <class Term>
KVX_INLINE double numpy_sum(const Term& term, int64_t begin, int64_t n) {
  double total = 0.0;
  for (int64_t c = 0; c < n; c += kNumpyChunk)
    total += pairwise_chunk(term, begin + c, std::min(kNumpyChunk, n - c));
  return total;
}

// ---- statistics -----------------------------------------------------------------------

// Exponent bits all ones <=> NaN or Inf.  Integer OR-reduction, so it vectorises: the
// sum (bits & exp) + 2^23 reaches bit 31 exactly when the exponent is all ones.
KVX_INLINE uint32_t nonfinite_bit(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & 0x7f800000u) + 0x00800000u;
}

KVX_HOT bool all_finite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= nonfinite_bit(x[i]);
  return (bad & 0x80000000u) == 0;
}

KVX_HOT bool acc_all_finite(const float* grad, const float* residual, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= nonfinite_bit(grad[i] + residual[i]);
  return (bad & 0x80000000u) == 0;
}

KVX_HOT double acc_abs_sum(const float* grad, const float* residual, int64_t n) {
  auto term = [grad, residual](int64_t i) {
    return std::fabs(static_cast<double>(grad[i] + residual[i]));
  };
  return numpy_sum(term, 0, n);
}

float adaptive_threshold(double abs_sum, int64_t n, double scale) {
  return static_cast<float>(scale * (abs_sum / static_cast<double>(n)));
}

KVX_HOT void filter_scores(const float* x, int64_t filters, int64_t filter_size,
                           double* scores) {
  auto term = [x](int64_t i) {
    const double v = x[i];
    return v * v;  // exact: a float32 squared fits in a float64 mantissa
  };
  for (int64_t o = 0; o < filters; ++o) scores[o] = numpy_sum(term, o * filter_size, filter_size);
}

KVX_HOT void acc_filter_scores(const float* grad, const float* residual, int64_t filters,
                               int64_t filter_size, double* scores) {
  auto term = [grad, residual](int64_t i) {
    const double v = grad[i] + residual[i];
    return v * v;
  };
  for (int64_t o = 0; o < filters; ++o) scores[o] = numpy_sum(term, o * filter_size, filter_size);
}

void topk_select(const double* scores, int64_t filters, int64_t k, int64_t* indices) {
  std::vector<int64_t> order(static_cast<size_t>(filters));
  std::iota(order.begin(), order.end(), int64_t{0});
  // Strict total order: larger score first, then lower index.
  auto before = [scores](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  if (k < filters) std::nth_element(order.begin(), order.begin() + k, order.end(), before);
  std::sort(order.begin(), order.begin() + k);
  std::copy(order.begin(), order.begin() + k, indices);
}

// ---- element-wise helpers -------------------------------------------------------------

KVX_HOT static void add_into(float* acc, const float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += values[i];
}

// residual += grad (filters that stay in the residual).
KVX_HOT static void keep_in_residual(const float* grad, float* residual, int64_t n) {
  for (int64_t i = 0; i < n; ++i) residual[i] = grad[i] + residual[i];
}

// out = grad + residual; residual = 0 (filters that are sent).
KVX_HOT static void send_from_residual(const float* grad, float* residual, int64_t n,
                                       float* out) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = grad[i] + residual[i];
    residual[i] = 0.0f;
  }
}

static void zero(float* x, int64_t n) {
  if (n > 0) std::memset(x, 0, static_cast<size_t>(n) * sizeof(float));
}

// ---- fp32 pass-through ----------------------------------------------------------------

int fp32_encode(const float* grad, int64_t n, float* payload) {
  if (n < 0) return kBadParam;
  // The body length travels as one float32 word: refuse sizes it cannot represent
  // (the spec would emit a payload its own decoder rejects).
  if (!count_fits_header(n) || !exact_in_f32(n)) {
    zero(payload, fp32_payload_words(n));
    return kBadSize;
  }
  if (!all_finite(grad, n)) {
    zero(payload, fp32_payload_words(n));
    return kNonFinite;
  }
  write_header(payload, kCodecFp32, n, 0.0f, 0.0f, n);
  if (n > 0) std::memcpy(payload + kHeaderWords, grad, static_cast<size_t>(n) * sizeof(float));
  return kOk;
}

int fp32_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  float a, b;
  const int status = check_header(payload, payload_words, kCodecFp32, n, &a, &b);
  if (status != kOk) {
    zero(out, n);
    return status;
  }
  if (n > 0) std::memcpy(out, payload + kHeaderWords, static_cast<size_t>(n) * sizeof(float));
  return kOk;
}

int fp32_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc) {
  float a, b;
  const int status = check_header(payload, payload_words, kCodecFp32, n, &a, &b);
  if (status != kOk) return status;
  add_into(acc, payload + kHeaderWords, n);
  return kOk;
}

// ---- conv filter selection (top-k) ----------------------------------------------------

// Checks agreed or received filter indices: integral, in [0, rows), strictly ascending.
static bool indices_valid(const float* indices, int64_t k, int64_t rows) {
  double previous = -1.0;
  for (int64_t i = 0; i < k; ++i) {
    const double v = indices[i];
    if (!(v >= 0.0 && v < static_cast<double>(rows) && v == std::floor(v) && v > previous))
      return false;
    previous = v;
  }
  return true;
}

// Pass 2 of every filter codec: rows listed in `sent` (ascending) go to `values` and are
// zeroed in the residual; runs of rows in between get residual = acc.
static void split_rows(const float* grad, float* residual, int64_t filters,
                       int64_t filter_size, const int64_t* sent, int64_t k, float* values) {
  int64_t row = 0;
  for (int64_t s = 0; s < k; ++s) {
    const int64_t next = sent[s];
    keep_in_residual(grad + row * filter_size, residual + row * filter_size,
                     (next - row) * filter_size);
    send_from_residual(grad + next * filter_size, residual + next * filter_size, filter_size,
                       values + s * filter_size);
    row = next + 1;
  }
  keep_in_residual(grad + row * filter_size, residual + row * filter_size,
                   (filters - row) * filter_size);
}

int topk_encode(const float* grad, float* residual, int64_t filters, int64_t filter_size,
                int64_t k, float* payload) {
  if (filters < 1 || filter_size < 1 || k < 1 || k > filters) {
    if (k >= 0 && filter_size >= 0) zero(payload, topk_payload_words(k, filter_size));
    return kBadParam;
  }
  const int64_t body = k + k * filter_size;
  // Indices, k, F and the body length are float32 words: they must be exact.
  if (filters > kExactF32 || filter_size > kExactF32 || !exact_in_f32(body) ||
      !count_fits_header(filters * filter_size)) {
    zero(payload, kHeaderWords + body);
    return kBadSize;
  }
  std::vector<double> scores(static_cast<size_t>(filters));
  acc_filter_scores(grad, residual, filters, filter_size, scores.data());
  for (double s : scores) {
    if (!std::isfinite(s)) {  // a float32 square sum cannot overflow float64
      zero(payload, kHeaderWords + body);
      return kNonFinite;
    }
  }
  std::vector<int64_t> sent(static_cast<size_t>(k));
  topk_select(scores.data(), filters, k, sent.data());
  write_header(payload, kCodecTopk, filters * filter_size, static_cast<float>(k),
               static_cast<float>(filter_size), body);
  for (int64_t i = 0; i < k; ++i) payload[kHeaderWords + i] = static_cast<float>(sent[i]);
  split_rows(grad, residual, filters, filter_size, sent.data(), k, payload + kHeaderWords + k);
  return kOk;
}

// Header parameters and indices of a top-k payload; on kOk, *k and *f are set.
static int topk_check(const float* payload, int64_t payload_words, int64_t n, int64_t* k,
                      int64_t* f) {
  float a, b;
  const int status = check_header(payload, payload_words, kCodecTopk, n, &a, &b);
  if (status != kOk) return status;
  // Same tests as the spec, in float64; finite and range tests first so that the
  // integer conversions below are defined.
  const double kd = a, fd = b, nd = static_cast<double>(n);
  if (!(std::isfinite(kd) && std::isfinite(fd) && kd == std::floor(kd) &&
        fd == std::floor(fd) && kd >= 1.0 && fd >= 1.0 && kd * fd <= nd &&
        static_cast<double>(payload_words) == static_cast<double>(kHeaderWords) + kd + kd * fd))
    return kBadParam;
  *k = static_cast<int64_t>(kd);
  *f = static_cast<int64_t>(fd);
  if (n % *f != 0) return kBadParam;
  if (!indices_valid(payload + kHeaderWords, *k, n / *f)) return kBadIndex;
  return kOk;
}

int topk_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  int64_t k = 0, f = 0;
  const int status = topk_check(payload, payload_words, n, &k, &f);
  zero(out, n);
  if (status != kOk) return status;
  const float* indices = payload + kHeaderWords;
  const float* values = indices + k;
  for (int64_t s = 0; s < k; ++s) {
    const int64_t row = static_cast<int64_t>(indices[s]);
    std::memcpy(out + row * f, values + s * f, static_cast<size_t>(f) * sizeof(float));
  }
  return kOk;
}

int topk_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc) {
  int64_t k = 0, f = 0;
  const int status = topk_check(payload, payload_words, n, &k, &f);
  if (status != kOk) return status;
  const float* indices = payload + kHeaderWords;
  const float* values = indices + k;
  for (int64_t s = 0; s < k; ++s)
    add_into(acc + static_cast<int64_t>(indices[s]) * f, values + s * f, f);
  return kOk;
}

int topk_gather(const float* grad, float* residual, int64_t filters, int64_t filter_size,
                const float* indices, int64_t k, float* values) {
  if (filters < 1 || filter_size < 1 || k < 0 || k > filters) {
    if (k >= 0 && filter_size >= 0) zero(values, k * filter_size);
    return kBadParam;
  }
  if (!indices_valid(indices, k, filters)) {
    zero(values, k * filter_size);
    return kBadIndex;
  }
  if (!acc_all_finite(grad, residual, filters * filter_size)) {
    zero(values, k * filter_size);
    return kNonFinite;
  }
  std::vector<int64_t> sent(static_cast<size_t>(k));
  for (int64_t s = 0; s < k; ++s) sent[s] = static_cast<int64_t>(indices[s]);
  split_rows(grad, residual, filters, filter_size, sent.data(), k, values);
  return kOk;
}

int topk_scatter(const float* values, const float* indices, int64_t k, int64_t filters,
                 int64_t filter_size, float* out) {
  if (filters < 1 || filter_size < 1 || k < 0 || k > filters) {
    if (filters >= 0 && filter_size >= 0) zero(out, filters * filter_size);
    return kBadParam;
  }
  zero(out, filters * filter_size);
  if (!indices_valid(indices, k, filters)) return kBadIndex;
  for (int64_t s = 0; s < k; ++s)
    std::memcpy(out + static_cast<int64_t>(indices[s]) * filter_size, values + s * filter_size,
                static_cast<size_t>(filter_size) * sizeof(float));
  return kOk;
}

// ---- ternary packing ------------------------------------------------------------------
//
// Codes c in {-1, 0, +1} travel as digits c + 1 in {0, 1, 2}, D per float32 word,
// little-endian (digit j of word w belongs to element w*D + j); the base is 3 for the
// server-decoded payload and 2n+1 for the homomorphic one, and base^D <= 2^24, so D <= 15.
// Encoding runs in blocks of kBlockWords words.  A contiguous, vectorised loop computes
// acc, the codes, the new residual (acc - c*t, exactly the spec's rounding) and each
// element's contribution (c + 1) * base^(i mod D) to its word, taking the power from a
// periodic table and forming the product with masks (no vector multiply).  Then each word
// is summed as one 16-lane vector: 16 contributions from its first element, those past D
// (the next word's) masked off.  Integer sums are exact, so the compiler may reorder them.

constexpr int kBlockWords = 16;
constexpr int kMaxDigits = kTernaryDigits;  // base 3, the smallest, has the most digits
constexpr int kLanes = 16;                  // > kMaxDigits: a word's sum is one vector

// Codes, residual and contributions of one block of m elements.  `enabled` is 0 when
// t <= 0 (no element is sent then, as in the spec), else all ones.
KVX_INLINE void ternary_block(const float* grad, float* residual, int64_t m, float t,
                              float v, int32_t enabled, const int32_t* power,
                              int32_t* contrib) {
  for (int64_t i = 0; i < m; ++i) {
    const float a = grad[i] + residual[i];
    const int32_t pos = static_cast<int32_t>(a >= t) & enabled;
    const int32_t neg = static_cast<int32_t>(a <= -t) & enabled;
    residual[i] = a - static_cast<float>(pos - neg) * v;
    const int32_t p = power[i];
    contrib[i] = p + (p & -pos) - (p & -neg);
  }
}

// Pass 2 of both ternary encoders: kDigits digits of `base` per float32 word
// (base^kDigits <= 2^24).  The digit count is a template parameter: with it known, the
// block loops compile to straight vector code.
template <int kDigits>
KVX_HOT static void ternary_pack(const float* grad, float* residual, int64_t n, float t,
                                 float v, int32_t base, float* words) {
  static_assert(kDigits >= 1 && kDigits <= kMaxDigits, "digits per word");
  constexpr int64_t block = static_cast<int64_t>(kBlockWords) * kDigits;
  int32_t power[block];
  int32_t contrib[block + kLanes] = {};
  for (int j = 0, value = 1; j < kDigits; ++j, value *= base)
    for (int l = 0; l < kBlockWords; ++l) power[l * kDigits + j] = value;
  int32_t lane_mask[kLanes];
  for (int j = 0; j < kLanes; ++j) lane_mask[j] = j < kDigits ? -1 : 0;
  const int32_t enabled = t > 0.0f ? -1 : 0;
  const int64_t num_words = ceil_div(n, kDigits);
  for (int64_t w0 = 0; w0 < num_words; w0 += kBlockWords) {
    const int64_t e0 = w0 * kDigits;
    const int64_t m = std::min(block, n - e0);
    const int64_t words_here = ceil_div(m, kDigits);
    ternary_block(grad + e0, residual + e0, m, t, v, enabled, power, contrib);
    for (int64_t i = m; i < words_here * kDigits; ++i) contrib[i] = 0;  // padding digits: 0
    for (int64_t l = 0; l < words_here; ++l) {
      const int32_t* c = contrib + l * kDigits;
      int32_t word = 0;
      for (int j = 0; j < kLanes; ++j) word += c[j] & lane_mask[j];
      words[w0 + l] = static_cast<float>(word);
    }
  }
}

static void ternary_pack_any(const float* grad, float* residual, int64_t n, float t,
                             float v, int32_t base, int digits, float* words) {
  switch (digits) {
#define KVX_PACK_CASE(D) \
    case D: ternary_pack<D>(grad, residual, n, t, v, base, words); break;
    KVX_PACK_CASE(1) KVX_PACK_CASE(2) KVX_PACK_CASE(3) KVX_PACK_CASE(4) KVX_PACK_CASE(5)
    KVX_PACK_CASE(6) KVX_PACK_CASE(7) KVX_PACK_CASE(8) KVX_PACK_CASE(9) KVX_PACK_CASE(10)
    KVX_PACK_CASE(11) KVX_PACK_CASE(12) KVX_PACK_CASE(13) KVX_PACK_CASE(14) KVX_PACK_CASE(15)
#undef KVX_PACK_CASE
    default: break;  // digits_per_word of a base in [3, 2^24] is in [1, 15]
  }
}

// Every word an integer in [0, limit) (limit <= 2^24): range test first, so that the
// conversion is defined; -0.0 counts as 0, as in the spec.
KVX_HOT static bool words_valid_f32(const float* words, int64_t count, float limit) {
  int32_t bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float v = words[i];
    const bool in_range = v >= 0.0f && v < limit;
    const float clamped = in_range ? v : 0.0f;
    bad |= static_cast<int32_t>(!in_range) |
           static_cast<int32_t>(static_cast<float>(static_cast<int32_t>(clamped)) != v);
  }
  return bad == 0;
}

// Base-3 decoding through a table: a word (< 3^15) is three 5-digit chunks (< 243), and
// each chunk maps to 5 ready-made values (c - 1) * t, the spec's float32 products.
struct Base3Table {
  float values[243][5];
  explicit Base3Table(float t) {
    for (int c = 0; c < 243; ++c) {
      int rest = c;
      for (int j = 0; j < 5; ++j) {
        values[c][j] = static_cast<float>(rest % 3 - 1) * t;
        rest /= 3;
      }
    }
  }
};

// out[0..15) (or fewer for the last word) from one word.
KVX_INLINE void base3_expand(const Base3Table& table, uint32_t word, float* out15) {
  const uint32_t c0 = word % 243, c1 = (word / 243) % 243, c2 = word / (243 * 243);
  std::memcpy(out15, table.values[c0], 5 * sizeof(float));
  std::memcpy(out15 + 5, table.values[c1], 5 * sizeof(float));
  std::memcpy(out15 + 10, table.values[c2], 5 * sizeof(float));
}

KVX_HOT static void base3_decode(const Base3Table& table, const float* words, int64_t n,
                                 float* out) {
  const int64_t full = n / kTernaryDigits;
  for (int64_t w = 0; w < full; ++w)
    base3_expand(table, static_cast<uint32_t>(words[w]), out + w * kTernaryDigits);
  const int64_t rest = n - full * kTernaryDigits;
  if (rest > 0) {
    float tail[kTernaryDigits];
    base3_expand(table, static_cast<uint32_t>(words[full]), tail);
    std::memcpy(out + full * kTernaryDigits, tail, static_cast<size_t>(rest) * sizeof(float));
  }
}

KVX_HOT static void base3_decode_add(const Base3Table& table, const float* words, int64_t n,
                                     float* acc) {
  const int64_t num_words = ceil_div(n, kTernaryDigits);
  for (int64_t w = 0; w < num_words; ++w) {
    float decoded[kTernaryDigits];
    base3_expand(table, static_cast<uint32_t>(words[w]), decoded);
    const int64_t m = std::min<int64_t>(kTernaryDigits, n - w * kTernaryDigits);
    float* a = acc + w * kTernaryDigits;
    for (int64_t j = 0; j < m; ++j) a[j] += decoded[j];
  }
}

// ---- ternary (Hylo FC) ------------------------------------------------------------------

// Mean |acc| of the values a threshold t selects (|acc| >= t); t itself if none is.
// Float64 sum, rounded to float32 (as adaptive_threshold).
KVX_HOT float acc_mean_above(const float* grad, const float* residual, int64_t n, float t) {
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(grad[i] + residual[i]);
    if (a >= t) {
      sum += a;
      ++count;
    }
  }
  return count ? static_cast<float>(sum / static_cast<double>(count)) : t;
}

int ternary_encode(const float* grad, float* residual, int64_t n, double scale,
                   double threshold, float* payload, bool mean_value) {
  if (n < 0) return kBadParam;
  const int64_t body = ceil_div(n, kTernaryDigits);
  if (!std::isfinite(scale) || scale < 0.0 || !threshold_valid(threshold)) {
    zero(payload, kHeaderWords + body);
    return kBadParam;
  }
  if (!count_fits_header(n) || !exact_in_f32(body)) {
    zero(payload, kHeaderWords + body);
    return kBadSize;
  }
  float t;
  if (threshold > 0.0) {
    if (!acc_all_finite(grad, residual, n)) {
      zero(payload, kHeaderWords + body);
      return kNonFinite;
    }
    t = static_cast<float>(threshold);
  } else {
    const double abs_sum = acc_abs_sum(grad, residual, n);
    if (!std::isfinite(abs_sum)) {  // |acc| <= FLT_MAX: the float64 sum cannot overflow
      zero(payload, kHeaderWords + body);
      return kNonFinite;
    }
    t = adaptive_threshold(abs_sum, n, scale);
    if (!std::isfinite(t)) {  // scale * mean|acc| beyond float32's range
      zero(payload, kHeaderWords + body);
      return kNonFinite;
    }
  }
  // the value a code stands for: t, or (mean_value) the least-squares value of the
  // selected set, mean |acc| over |acc| >= t; decoders read it from the header
  const float v = (mean_value && t > 0.0f) ? acc_mean_above(grad, residual, n, t) : t;
  write_header(payload, kCodecTernary, n, v, static_cast<float>(kTernaryBase), body);
  ternary_pack<kTernaryDigits>(grad, residual, n, t, v, static_cast<int32_t>(kTernaryBase),
                               payload + kHeaderWords);
  return kOk;
}

// Header, parameters and words of a ternary payload; on kOk, *t is set.
static int ternary_check(const float* payload, int64_t payload_words, int64_t n, float* t) {
  float a, b;
  const int status = check_header(payload, payload_words, kCodecTernary, n, &a, &b);
  if (status != kOk) return status;
  if (!(b == static_cast<float>(kTernaryBase)) || !std::isfinite(a) || a < 0.0f ||
      payload_words != ternary_payload_words(n))
    return kBadParam;
  // 3^15 = 14348907 is exact in float32.
  if (!words_valid_f32(payload + kHeaderWords, payload_words - kHeaderWords, 14348907.0f))
    return kBadWord;
  *t = a;
  return kOk;
}

int ternary_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  float t = 0.0f;
  const int status = ternary_check(payload, payload_words, n, &t);
  if (status != kOk) {
    zero(out, n);
    return status;
  }
  const Base3Table table(t);
  base3_decode(table, payload + kHeaderWords, n, out);
  return kOk;
}

int ternary_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc) {
  float t = 0.0f;
  const int status = ternary_check(payload, payload_words, n, &t);
  if (status != kOk) return status;
  const Base3Table table(t);
  base3_decode_add(table, payload + kHeaderWords, n, acc);
  return kOk;
}

// ---- homomorphic ternary ----------------------------------------------------------------

int ternary_encode_sum(const float* grad, float* residual, int64_t n, double threshold,
                       int64_t num_workers, float* words, double value) {
  if (n < 0 || num_workers < 1 || num_workers > kMaxWorkers)
    return kBadParam;  // the word count is unknown: nothing to zero
  const int64_t base = sum_base(num_workers);
  const int d = digits_per_word(base, kMantissaF32);
  const int64_t num_words = ceil_div(n, d);
  if (!threshold_valid(threshold) || !(value == 0.0 || threshold_valid(value))) {
    zero(words, num_words);
    return kBadParam;
  }
  if (!acc_all_finite(grad, residual, n)) {
    zero(words, num_words);
    return kNonFinite;
  }
  const float v = static_cast<float>(value > 0.0 ? value : threshold);
  ternary_pack_any(grad, residual, n, static_cast<float>(threshold), v,
                   static_cast<int32_t>(base),
                   d, words);
  return kOk;
}

// Exact floor(x / p) for integers x < 2^24 and 1 <= p < 2^24 with one 32x32->64-bit
// multiply: q = (x * m) >> s, s = 24 + ceil(log2 p), m = floor(2^s / p) + 1 <= 2^25 + 1.
// q = floor(x/p + e) with 0 < e = x * (m - 2^s/p) / 2^s < 2^24 / 2^s <= 1/p, and the
// fractional part of x/p is at most 1 - 1/p, so e never carries q past the next integer.
static void magic24(uint64_t p, uint32_t* mul, uint64_t* shift) {
  int log2p = 0;
  while ((uint64_t{1} << log2p) < p) ++log2p;
  *shift = static_cast<uint64_t>(kMantissaF32 + log2p);
  *mul = static_cast<uint32_t>((uint64_t{1} << *shift) / p + 1);
}

// Decoding through a table, as for base 3: a word (< b^D <= 2^24) is `chunks` chunks of
// e <= 4 digits, each below P = b^e, and chunk c maps to table row c: e ready-made values
// (digit - num_workers) * t, the spec's float32 products, padded to 4 floats.  A word is
// then `chunks` exact divisions by P and as many 16-byte copies; each copy may spill into
// the next chunk's place, which that chunk then overwrites.  The table has at most
// n / 16 rows (it costs a fraction of the output to build) and at most 8192 (128 KiB,
// cache-resident); at least 2048 rows allowed keep chunks <= 4 for every base <= 2048.
constexpr int kRowFloats = 4;
constexpr int64_t kSumTableMinRows = 2048;
constexpr int64_t kSumTableMaxRows = 8192;
constexpr int kSumShift = 37;  // floor(v / P) = (v * mul) >> 37 for v < 2^24, P <= 8192

struct SumTable {
  int e = 0, chunks = 0;
  uint32_t rows = 1;
  uint64_t mul = 0;
  std::vector<float> values;
  SumTable(int64_t base, int d, int64_t num_workers, float t, int64_t n) {
    const int64_t max_rows = std::clamp(n / 16, kSumTableMinRows, kSumTableMaxRows);
    int64_t rows64 = 1;
    while (e < kRowFloats && rows64 * base <= max_rows) {
      rows64 *= base;
      ++e;
    }
    if (e == 0) return;  // base > max_rows: no table (see sum_unpack_digits)
    chunks = static_cast<int>(ceil_div(d, e));
    rows = static_cast<uint32_t>(rows64);
    // As in magic24 with a fixed shift: the error term is below 2^24 / 2^37 < 1 / P.
    mul = (uint64_t{1} << kSumShift) / rows + 1;
    // Rows of one digit, then each further digit j: block `hi` of the rows is a copy of
    // block 0 with digit j = hi.
    values.assign(static_cast<size_t>(rows) * kRowFloats, 0.0f);
    for (int64_t c = 0; c < base; ++c)
      values[c * kRowFloats] = static_cast<float>(c - num_workers) * t;
    int64_t span = base;
    for (int j = 1; j < e; ++j, span *= base) {
      for (int64_t hi = 1; hi < base; ++hi)
        std::copy(values.begin(), values.begin() + span * kRowFloats,
                  values.begin() + hi * span * kRowFloats);
      for (int64_t hi = 0; hi < base; ++hi)
        for (int64_t r = 0; r < span; ++r)
          values[(hi * span + r) * kRowFloats + j] = values[hi * kRowFloats];
    }
  }
};

// Table parameters are locals: a 16-byte copy may alias anything, a struct's members would
// be reloaded after each.
template <int kChunks>
KVX_INLINE void sum_expand(const float* values, uint32_t rows, uint64_t mul, int e, uint32_t x,
                           float* out) {
  for (int k = 0; k < kChunks; ++k) {
    const uint32_t q = static_cast<uint32_t>((x * mul) >> kSumShift);
    std::memcpy(out + k * e, values + (x - q * rows) * kRowFloats, kRowFloats * sizeof(float));
    x = q;
  }
}

template <int kChunks>
KVX_HOT static void sum_unpack_table(const SumTable& table, const float* words, int64_t n,
                                     int d, float* out) {
  const float* values = table.values.data();
  const uint32_t rows = table.rows;
  const uint64_t mul = table.mul;
  const int e = table.e;
  const int64_t num_words = ceil_div(n, d);
  // Word w writes out[w*d, w*d + reach); words that would write past out[n - 1] go
  // through a scratch buffer.
  const int64_t reach = static_cast<int64_t>(kChunks - 1) * e + kRowFloats;
  const int64_t direct = n >= reach ? (n - reach) / d + 1 : 0;
  for (int64_t w = 0; w < direct; ++w)
    sum_expand<kChunks>(values, rows, mul, e, static_cast<uint32_t>(words[w]), out + w * d);
  for (int64_t w = direct; w < num_words; ++w) {
    float scratch[kMaxDigits + kRowFloats];
    sum_expand<kChunks>(values, rows, mul, e, static_cast<uint32_t>(words[w]), scratch);
    std::memcpy(out + w * d, scratch,
                static_cast<size_t>(std::min<int64_t>(d, n - w * d)) * sizeof(float));
  }
}

// Bases above the table's rows (over 1023 workers for small n, 4095 for large; D <= 2
// then): digit by digit.
KVX_HOT static void sum_unpack_digits(const float* words, int64_t n, int64_t base, int d,
                                      int64_t num_workers, float t, float* out) {
  uint32_t mul;
  uint64_t shift;
  magic24(static_cast<uint64_t>(base), &mul, &shift);
  const uint32_t b = static_cast<uint32_t>(base);
  const int32_t workers = static_cast<int32_t>(num_workers);
  for (int64_t i0 = 0; i0 < n; i0 += d) {
    uint32_t x = static_cast<uint32_t>(words[i0 / d]);
    const int64_t m = std::min<int64_t>(d, n - i0);
    for (int64_t j = 0; j < m; ++j) {
      const uint32_t q = static_cast<uint32_t>((uint64_t{x} * mul) >> shift);
      out[i0 + j] = static_cast<float>(static_cast<int32_t>(x - q * b) - workers) * t;
      x = q;
    }
  }
}

int ternary_decode_sum(const float* words, int64_t num_words, double threshold,
                       int64_t num_workers, int64_t n, float* out) {
  if (n < 0) return kBadParam;
  if (num_workers < 1 || num_workers > kMaxWorkers || !threshold_valid(threshold) ||
      num_words != ternary_sum_words(n, num_workers)) {
    zero(out, n);
    return kBadParam;
  }
  const int64_t base = sum_base(num_workers);
  const int d = digits_per_word(base, kMantissaF32);
  int64_t limit = 1;
  for (int j = 0; j < d; ++j) limit *= base;  // <= 2^24: exact in float32
  if (!words_valid_f32(words, num_words, static_cast<float>(limit))) {
    zero(out, n);
    return kBadWord;
  }
  const float t = static_cast<float>(threshold);
  const SumTable table(base, d, num_workers, t, n);
  switch (table.chunks) {  // ceil(d / e) <= 4: e = 4 for the bases with d > 12
    case 1: sum_unpack_table<1>(table, words, n, d, out); break;
    case 2: sum_unpack_table<2>(table, words, n, d, out); break;
    case 3: sum_unpack_table<3>(table, words, n, d, out); break;
    case 4: sum_unpack_table<4>(table, words, n, d, out); break;
    default: sum_unpack_digits(words, n, base, d, num_workers, t, out); break;
  }
  return kOk;
}

// ---- MXNet's 2-bit layout ---------------------------------------------------------------
//
// Element j of a 16-element group sits in byte j/4 of the little-endian 32-bit word,
// most significant pair first: bits 6-2*(j%4) and up of that byte.  +t is 11, -t is 10.

KVX_INLINE uint32_t twobit_shift(int j) { return 8u * (j >> 2) + 6u - 2u * (j & 3); }

// One word of `count` <= 16 codes; the hot loop passes the constant 16, so after
// inlining the inner loop has a fixed trip count and vectorises.
KVX_INLINE uint32_t twobit_word(const float* g, float* r, int count, float t,
                                int32_t enabled) {
  uint32_t word = 0;
  for (int j = 0; j < count; ++j) {
    const float a = g[j] + r[j];
    const int32_t pos = static_cast<int32_t>(a >= t) & enabled;
    const int32_t neg = static_cast<int32_t>(a <= -t) & enabled;
    r[j] = a - static_cast<float>(pos - neg) * t;
    // 3 for +t, 2 for -t, 0 otherwise (pos and neg are never both set).
    const uint32_t bits = static_cast<uint32_t>(3 * pos + 2 * neg);
    word |= bits << twobit_shift(j);
  }
  return word;
}

KVX_HOT static void twobit_pack(const float* grad, float* residual, int64_t n, float t,
                                uint32_t* words) {
  const int32_t enabled = t > 0.0f ? -1 : 0;
  const int64_t full = n / kTwoBitPerWord;
  for (int64_t w = 0; w < full; ++w)
    words[w] = twobit_word(grad + w * kTwoBitPerWord, residual + w * kTwoBitPerWord,
                           kTwoBitPerWord, t, enabled);
  const int64_t rest = n - full * kTwoBitPerWord;
  if (rest > 0)
    words[full] = twobit_word(grad + full * kTwoBitPerWord, residual + full * kTwoBitPerWord,
                              static_cast<int>(rest), t, enabled);
}

KVX_HOT static void twobit_unpack(const uint32_t* words, int64_t n, float t, float* out) {
  const int64_t full = n / kTwoBitPerWord;
  for (int64_t w = 0; w < full; ++w) {
    const uint32_t word = words[w];
    float* o = out + w * kTwoBitPerWord;
    for (int j = 0; j < kTwoBitPerWord; ++j) {
      const uint32_t bits = (word >> twobit_shift(j)) & 3u;
      // (+1, -1 or 0) * t: the spec's t, -t and +0.
      const int32_t code = static_cast<int32_t>(bits == 3u) - static_cast<int32_t>(bits == 2u);
      o[j] = static_cast<float>(code) * t;
    }
  }
  const int64_t rest = n - full * kTwoBitPerWord;
  for (int j = 0; j < rest; ++j) {
    const uint32_t bits = (words[full] >> twobit_shift(j)) & 3u;
    const int32_t code = static_cast<int32_t>(bits == 3u) - static_cast<int32_t>(bits == 2u);
    out[full * kTwoBitPerWord + j] = static_cast<float>(code) * t;
  }
}

int twobit_encode(const float* grad, float* residual, int64_t n, double threshold,
                  uint32_t* words) {
  if (n < 0) return kBadParam;
  if (!threshold_valid(threshold)) {
    if (n > 0) std::memset(words, 0, static_cast<size_t>(twobit_words(n)) * sizeof(uint32_t));
    return kBadParam;
  }
  twobit_pack(grad, residual, n, static_cast<float>(threshold), words);
  return kOk;
}

int twobit_decode(const uint32_t* words, int64_t n, double threshold, float* out) {
  if (n < 0) return kBadParam;
  if (!threshold_valid(threshold)) {
    zero(out, n);
    return kBadParam;
  }
  twobit_unpack(words, n, static_cast<float>(threshold), out);
  return kOk;
}

// ---- server-decode aggregation ------------------------------------------------------------

// Codec id and element count of a slot's header, before the codec's own full check.
static int slot_header(const float* slot, int64_t slot_words, float* codec, int64_t* n,
                       int64_t* payload_words) {
  if (slot_words < kHeaderWords) return kBadSize;
  const double low = slot[3], high = slot[4], body = slot[7];
  if (!(low >= 0 && low < static_cast<double>(kExactF32) && low == std::floor(low) &&
        high >= 0 && high < static_cast<double>(kExactF32) && high == std::floor(high) &&
        body >= 0 && body <= static_cast<double>(slot_words - kHeaderWords) &&
        body == std::floor(body)))
    return kBadSize;
  *codec = slot[1];
  *n = static_cast<int64_t>(low) + (static_cast<int64_t>(high) << kMantissaF32);
  *payload_words = kHeaderWords + static_cast<int64_t>(body);
  return kOk;
}

int decode_slots(const float* slots, int64_t workers, int64_t slot_words, float* acc,
                 int64_t capacity, float* status) {
  zero(acc, capacity);
  int first = kOk;
  float codec0 = 0.0f;
  int64_t n0 = -1;
  for (int64_t w = 0; w < workers; ++w) {
    const float* slot = slots + w * slot_words;
    float codec = 0.0f;
    int64_t n = 0, words = 0;
    int st = slot_header(slot, slot_words, &codec, &n, &words);
    if (st == kOk && n0 < 0) {
      codec0 = codec;
      n0 = n;
    }
    if (st == kOk && (n > capacity || n < 1)) st = kBadSize;
    if (st == kOk && (codec != codec0 || n != n0)) st = kBadCodec;
    if (st == kOk) {
      if (codec == kCodecFp32)
        st = fp32_decode_add(slot, words, n, acc);
      else if (codec == kCodecTopk)
        st = topk_decode_add(slot, words, n, acc);
      else if (codec == kCodecTernary)
        st = ternary_decode_add(slot, words, n, acc);
      else
        st = kBadCodec;
    }
    status[w] = static_cast<float>(st);
    if (first == kOk) first = st;
  }
  return first;
}

}  // namespace kvx
