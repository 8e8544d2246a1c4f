// Ternary codes packed as digits, server-decoded and homomorphic; see ternary.h.
#include "codecs/ternary.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "codec_table.h"
#include "kernel_util.h"
#include "stats.h"

namespace kvx {

int64_t ternary_sum_words(int64_t n, int64_t num_workers) {
  if (num_workers < 1 || num_workers > kMaxWorkers) return 0;
  return ceil_div(n, digits_per_word(sum_base(num_workers), kMantissaF32));
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

int ternary_encode(const float* grad, float* residual, int64_t n, double scale,
                   double threshold, float* payload, int value_rule) {
  if (n < 0) return kBadParam;
  const int64_t body = ceil_div(n, kTernaryDigits);
  if (!std::isfinite(scale) || scale < 0.0 || !threshold_valid(threshold) ||
      (value_rule != kValueThreshold && value_rule != kValueRound)) {
    zero(payload, kHeaderWords + body);
    return kBadParam;
  }
  if (!count_fits_header(n) || !exact_in_f32(body)) {
    zero(payload, kHeaderWords + body);
    return kBadSize;
  }
  float t;
  bool capped = false;  // the delivery cap decided t (see ternary.h)
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
    const float largest = acc_abs_max(grad, residual, n);
    if (t >= largest) {  // nothing would pass: the largest |acc| does, and is sent whole
      t = largest;
      capped = true;
    }
  }
  // the value a code stands for (see value_rule in the header); decoders read it.
  // Capped, every rule's value is t: the selected values all equal t in magnitude.
  float v = t;
  if (!capped && value_rule == kValueRound) v = 2.0f * t;
  if (!std::isfinite(v)) {  // 2t beyond float32's range
    zero(payload, kHeaderWords + body);
    return threshold > 0.0 ? kBadParam : kNonFinite;
  }
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

// The servers' row (codec_table.h): id, name, decoders, payload size.
KVX_REGISTER_CODEC(kTernaryRow, kCodecTernary,
    "ternary", ternary_decode, ternary_decode_add,
    [](int64_t n, float, float) { return ternary_payload_words(n); },
    nullptr);

}  // namespace kvx
