// AdaComp's localized selection; see adacomp.h.
#include "codecs/adacomp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "codec_table.h"
#include "kernel_util.h"

namespace kvx {

struct AdacompCandidate {
  int64_t index;
  float magnitude;  // |H|
  bool negative;    // H < 0
};

// max |G| over one bin, G = grad + residual; *bad becomes nonzero if some H = G + grad is
// not finite (H finite implies grad, residual and G finite).  On magnitude bits, which
// order as the magnitudes do and whose max GCC vectorises (a float max it may not: NaN).
KVX_HOT static float bin_max(const float* grad, const float* residual, int64_t len, uint32_t* bad) {
  uint32_t top = 0, nonfinite = 0;
  for (int64_t j = 0; j < len; ++j) {
    const float g = grad[j];
    const float acc = g + residual[j];
    const float h = acc + g;
    uint32_t a, b;
    std::memcpy(&a, &acc, sizeof a);
    std::memcpy(&b, &h, sizeof b);
    top = std::max(top, a & 0x7fffffffu);
    nonfinite |= (b & 0x7fffffffu) > 0x7f7fffffu;  // above FLT_MAX's bits: Inf or NaN
  }
  *bad |= nonfinite;
  float gmax;
  std::memcpy(&gmax, &top, sizeof gmax);
  return gmax;
}

// Residual = G over one bin; the elements with |H| >= gmax join the candidates.  Reads
// grad[j] before writing residual[j], so the two may alias.
static void select_bin(const float* grad, float* residual, int64_t start, int64_t len, float gmax,
                std::vector<AdacompCandidate>* out) {
  for (int64_t j = start; j < start + len; ++j) {
    const float g = grad[j];
    const float acc = g + residual[j];
    const float h = acc + g;
    residual[j] = acc;
    // gmax > 0: a bin whose G is all zero sends nothing.
    if (gmax > 0.0f && std::fabs(h) >= gmax) out->push_back({j, std::fabs(h), h < 0.0f});
  }
}

#ifdef KVX_AVX2
// select_bin over every bin with AVX2, eight elements a step: the residual stored, the
// elements with |H| >= gmax (compared as magnitude bits: H is finite here) packed to the
// front of a register and stored whole, the next store starting where they end.
// Appends (index, H) to `index` and `h`, which keep room for 8 beyond the count; returns
// the count.  n < 2^31 (int32 lanes).
__attribute__((target("avx2,popcnt"))) static int64_t select_avx2(
    const float* grad, float* residual, int64_t n, int64_t bin, const std::vector<float>& gmax,
    std::vector<int32_t>* index, std::vector<float>* h) {
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i eight = _mm256_set1_epi32(8);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t count = 0;
  for (int64_t b = 0, start = 0; start < n; ++b, start += bin) {
    const int64_t end = std::min(n, start + bin);
    const float top = gmax[static_cast<size_t>(b)];
    int32_t top_bits;
    std::memcpy(&top_bits, &top, sizeof top_bits);
    // |H| >= top as bits: |H| > top_bits - 1; a zero top selects nothing (no bits exceed
    // 0x7fffffff)
    const __m256i below = _mm256_set1_epi32(top > 0.0f ? top_bits - 1 : 0x7fffffff);
    __m256i at = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(start)), lanes);
    int64_t j = start;
    for (; j + 8 <= end; j += 8) {
      room_for_eight(index, h, count);
      const __m256 g = _mm256_loadu_ps(grad + j);
      const __m256 acc = _mm256_add_ps(g, _mm256_loadu_ps(residual + j));
      const __m256 sum = _mm256_add_ps(acc, g);
      _mm256_storeu_ps(residual + j, acc);
      const __m256i over = _mm256_cmpgt_epi32(
          _mm256_and_si256(_mm256_castps_si256(sum), magnitude), below);
      const int mask = _mm256_movemask_ps(_mm256_castsi256_ps(over));
      const __m256i pack =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(kPackLanes.lanes[mask]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(index->data() + count),
                          _mm256_permutevar8x32_epi32(at, pack));
      _mm256_storeu_ps(h->data() + count, _mm256_permutevar8x32_ps(sum, pack));
      count += __builtin_popcount(static_cast<unsigned>(mask));
      at = _mm256_add_epi32(at, eight);
    }
    for (; j < end; ++j) {
      const float g = grad[j];
      const float acc = g + residual[j];
      const float sum = acc + g;
      residual[j] = acc;
      if (!(top > 0.0f && std::fabs(sum) >= top)) continue;
      room_for_eight(index, h, count);
      (*index)[count] = static_cast<int32_t>(j);
      (*h)[count++] = sum;
    }
  }
  return count;
}
#endif

// The candidates of every bin, in index order; the residual becomes G.
static std::vector<AdacompCandidate> select_bins(const float* grad, float* residual, int64_t n,
                                                 int64_t bin, const std::vector<float>& gmax,
                                                 int64_t capacity) {
  std::vector<AdacompCandidate> sent;
#ifdef KVX_AVX2
  if (n < (int64_t{1} << 31) && have_avx2()) {
    std::vector<int32_t> index(static_cast<size_t>(capacity) + 8);
    std::vector<float> h(index.size());
    const int64_t count = select_avx2(grad, residual, n, bin, gmax, &index, &h);
    sent.resize(static_cast<size_t>(count));
    for (int64_t c = 0; c < count; ++c)
      sent[c] = {index[c], std::fabs(h[c]), h[c] < 0.0f};
    return sent;
  }
#endif
  sent.reserve(static_cast<size_t>(capacity));
  for (int64_t b = 0, start = 0; start < n; ++b, start += bin)
    select_bin(grad, residual, start, std::min(bin, n - start), gmax[b], &sent);
  return sent;
}

// Over capacity: the `capacity` largest |H| go (ties to the lower index), in index order;
// the rest stay in G.  Candidates come in index order.
static void keep_largest(std::vector<AdacompCandidate>* sent, int64_t capacity) {
  const size_t count = sent->size();
  std::vector<AdacompCandidate> chosen(static_cast<size_t>(capacity));
  if (count > 0xffffffffu) {
    std::nth_element(sent->begin(), sent->begin() + capacity, sent->end(),
                     [](const AdacompCandidate& x, const AdacompCandidate& y) {
                       return x.magnitude > y.magnitude ||
                              (x.magnitude == y.magnitude && x.index < y.index);
                     });
    std::copy(sent->begin(), sent->begin() + capacity, chosen.begin());
    std::sort(chosen.begin(), chosen.end(),
              [](const AdacompCandidate& x, const AdacompCandidate& y) { return x.index < y.index; });
    sent->swap(chosen);
    return;
  }
  // One integer key a candidate, faster to select on: its magnitude's bits, then its
  // position reversed, so that the larger key is the larger |H| or, tied, the lower index.
  std::vector<uint64_t> keys(count);
  for (size_t c = 0; c < count; ++c) {
    uint32_t bits;
    std::memcpy(&bits, &(*sent)[c].magnitude, sizeof bits);
    keys[c] = (static_cast<uint64_t>(bits) << 32) | (0xffffffffu - static_cast<uint32_t>(c));
  }
  std::nth_element(keys.begin(), keys.begin() + capacity, keys.end(), std::greater<uint64_t>());
  // Marked by position and read back in order: index order without a sort.
  std::vector<uint8_t> kept(count, 0);
  for (int64_t e = 0; e < capacity; ++e) kept[0xffffffffu - static_cast<uint32_t>(keys[e])] = 1;
  size_t at = 0;
  for (size_t c = 0; c < count; ++c)
    if (kept[c]) chosen[at++] = (*sent)[c];
  sent->swap(chosen);
}

// The entry words of code 2 * index + sign.
static void put_entry(float* body, int64_t code, int64_t words) {
  if (words == 1) {
    body[0] = static_cast<float>(code);
  } else {
    body[0] = static_cast<float>(code % kExactF32);
    body[1] = static_cast<float>(code / kExactF32);
  }
}

// Scale and count of a payload after checking every field and entry; kOk or a status.
static int adacomp_check(const float* payload, int64_t payload_words, int64_t n, float* scale,
                  int64_t* count) {
  float a, b;
  const int status = check_header(payload, payload_words, kCodecAdacomp, n, &a, &b);
  if (status != kOk) return status;
  if (n > kAdacompMaxElements) return kBadSize;
  const int64_t width = adacomp_entry_words(n);
  // Float64 tests, as the spec's; finite and range first so that the conversion is defined.
  const double cd = b;
  if (!(std::isfinite(a) && a >= 0.0f && cd >= 0.0 && cd <= static_cast<double>(n) &&
        cd == std::floor(cd) &&
        static_cast<double>(payload_words) ==
            static_cast<double>(kHeaderWords) + cd * static_cast<double>(width)))
    return kBadParam;
  *scale = a;
  *count = static_cast<int64_t>(cd);
  const float* body = payload + kHeaderWords;
  int64_t previous = -1;
  for (int64_t e = 0; e < *count; ++e) {
    int64_t code = 0;
    for (int64_t w = width - 1; w >= 0; --w) {
      const double v = body[e * width + w];
      if (!(v >= 0.0 && v < static_cast<double>(kExactF32) && v == std::floor(v)))
        return kBadWord;
      code = code * kExactF32 + static_cast<int64_t>(v);
    }
    const int64_t index = code / 2;
    if (index >= n || index <= previous) return kBadIndex;
    previous = index;
  }
  return kOk;
}

// The decoded value of entry e: +-scale at its index.
static inline void entry(const float* body, int64_t e, int64_t width, float scale, int64_t* index,
                  float* value) {
  int64_t code = static_cast<int64_t>(body[e * width]);
  if (width == 2) code += static_cast<int64_t>(body[e * width + 1]) * kExactF32;
  *index = code / 2;
  *value = (code & 1) ? -scale : scale;
}

int adacomp_encode(const float* grad, float* residual, int64_t n, int64_t bin,
                   int64_t capacity, float* payload) {
  if (n < 1 || bin < 1 || capacity < 1 || capacity > n) {
    if (n >= 1 && capacity >= 0 && capacity <= n) zero(payload, adacomp_payload_words(n, capacity));
    return kBadParam;
  }
  const int64_t width = adacomp_entry_words(n);
  const int64_t words = adacomp_payload_words(n, capacity);
  // The count and the body length are float32 words: they must be exact.
  if (n > kAdacompMaxElements || !exact_in_f32(capacity * width)) {
    zero(payload, words);
    return kBadSize;
  }
  const int64_t bins = ceil_div(n, bin);
  std::vector<float> gmax(static_cast<size_t>(bins));
  uint32_t bad = 0;
  for (int64_t i = 0; i < bins; ++i) {
    const int64_t start = i * bin;
    gmax[i] = bin_max(grad + start, residual + start, std::min(bin, n - start), &bad);
  }
  zero(payload, words);
  if (bad) return kNonFinite;

  std::vector<AdacompCandidate> sent = select_bins(grad, residual, n, bin, gmax, capacity);
  if (static_cast<int64_t>(sent.size()) > capacity) keep_largest(&sent, capacity);
  // The spec sums the bins' maxima in float64, in bin order.
  double total = 0.0;
  for (float m : gmax) total += m;
  const float scale = static_cast<float>(total / static_cast<double>(bins));

  const int64_t count = static_cast<int64_t>(sent.size());
  write_header(payload, kCodecAdacomp, n, scale, static_cast<float>(count), count * width);
  float* body = payload + kHeaderWords;
  for (int64_t e = 0; e < count; ++e) {
    const AdacompCandidate& c = sent[e];
    put_entry(body + e * width, 2 * c.index + (c.negative ? 1 : 0), width);
    residual[c.index] -= c.negative ? -scale : scale;
  }
  return kOk;
}

int adacomp_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  float scale = 0.0f;
  int64_t count = 0;
  const int status = adacomp_check(payload, payload_words, n, &scale, &count);
  zero(out, n);
  if (status != kOk) return status;
  const int64_t width = adacomp_entry_words(n);
  for (int64_t e = 0; e < count; ++e) {
    int64_t index;
    float value;
    entry(payload + kHeaderWords, e, width, scale, &index, &value);
    out[index] = value;
  }
  return kOk;
}

int adacomp_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc) {
  float scale = 0.0f;
  int64_t count = 0;
  const int status = adacomp_check(payload, payload_words, n, &scale, &count);
  if (status != kOk) return status;
  const int64_t width = adacomp_entry_words(n);
  for (int64_t e = 0; e < count; ++e) {
    int64_t index;
    float value;
    entry(payload + kHeaderWords, e, width, scale, &index, &value);
    acc[index] += value;
  }
  return kOk;
}

void adacomp_sent(const float* payload, int64_t n, int64_t capacity, int64_t* sent) {
  const int64_t width = adacomp_entry_words(n);
  const double header_count = payload[6];       // the header's b: entries sent
  const int64_t count = header_count >= 0.0 && header_count <= static_cast<double>(capacity)
                            ? static_cast<int64_t>(header_count) : 0;
  const float* body = payload + kHeaderWords;
  for (int64_t e = 0; e < capacity; ++e) {
    int64_t index = n;
    if (e < count) {
      const int64_t low = index_word(body[e * width]);
      const int64_t high = width == 2 ? index_word(body[e * width + 1]) : 0;
      if (low >= 0 && high >= 0) index = std::min((low + high * kExactF32) / 2, n);
    }
    sent[e] = index;
  }
}

// The servers' row (codec_table.h): id, name, decoders, payload size.
KVX_REGISTER_CODEC(kAdacompRow, kCodecAdacomp,
    "adacomp", adacomp_decode, adacomp_decode_add,
    [](int64_t n, float, float count) -> int64_t {
      const int64_t entries = count_param(count);
      return entries < 0 ? -1 : adacomp_payload_words(n, entries);
    },
    nullptr);

}  // namespace kvx
