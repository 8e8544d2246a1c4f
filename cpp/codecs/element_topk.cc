// Element top-k; see element_topk.h.
#include "codecs/element_topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "codec_table.h"
#include "kernel_util.h"
#include "stats.h"

namespace kvx {

// |acc| as the bits of a float32: for a non-negative float the bits order as the value
// does.  acc = grad + residual, formed as the spec forms it, in float32.
static KVX_INLINE uint32_t magnitude_bits(float acc) {
  const float m = std::fabs(acc);
  uint32_t bits;
  std::memcpy(&bits, &m, sizeof bits);
  return bits;
}

constexpr int kBucketShift = 20;  // a bucket: the top 12 bits (exponent, 3 of the mantissa)
constexpr int64_t kBuckets = int64_t{1} << (32 - kBucketShift);

// An element that may be sent: its index and acc.
struct Candidate {
  int64_t index;
  float acc;
};

// The elements whose magnitude may be among the k largest (1 <= k <= n), in index order,
// found by a radix select without sorting or copying the tensor: one pass counts the
// magnitudes per bucket, which names the bucket that holds the k-th largest; a second
// collects the elements of that bucket and of every bucket above it (larger magnitudes
// only): k and the few of the k-th's bucket that are smaller.
static std::vector<Candidate> candidates_of(const float* grad, const float* residual,
                                            int64_t n, int64_t k) {
  // Four interleaved counts: a gradient's magnitudes crowd into a few buckets, and
  // increments of one counter in a row would each wait for the one before.
  constexpr int64_t kWays = 4;
  std::vector<int64_t> counts(static_cast<size_t>(kWays * kBuckets), 0);
  int64_t i = 0;
  for (; i + kWays <= n; i += kWays)
    for (int64_t w = 0; w < kWays; ++w)
      ++counts[w * kBuckets + (magnitude_bits(grad[i + w] + residual[i + w]) >> kBucketShift)];
  for (; i < n; ++i) ++counts[magnitude_bits(grad[i] + residual[i]) >> kBucketShift];
  int64_t bucket = kBuckets - 1, at_or_above = 0;
  for (;; --bucket) {
    for (int64_t w = 0; w < kWays; ++w) at_or_above += counts[w * kBuckets + bucket];
    if (at_or_above >= k) break;
  }
  const uint32_t lowest = static_cast<uint32_t>(bucket) << kBucketShift;
  std::vector<Candidate> found;
  found.reserve(static_cast<size_t>(at_or_above));
  for (i = 0; i < n; ++i) {
    const float acc = grad[i] + residual[i];
    if (magnitude_bits(acc) >= lowest) found.push_back({i, acc});
  }
  return found;
}

// residual[i] = grad[i] + residual[i]: what every element not sent keeps.
KVX_HOT static void accumulate(const float* grad, float* residual, int64_t n) {
  for (int64_t i = 0; i < n; ++i) residual[i] = grad[i] + residual[i];
}

int element_topk_encode(const float* grad, float* residual, int64_t n, int64_t k,
                        float* payload) {
  if (n < 1 || k < 1 || k > n) {
    if (n >= 1 && k >= 0 && k <= n) zero(payload, element_topk_payload_words(n, k));
    return kBadParam;
  }
  const int64_t width = element_topk_index_words(n) + 1;
  const int64_t words = element_topk_payload_words(n, k);
  // k and the body length are float32 header words: they must be exact.
  if (!count_fits_header(n) || !exact_in_f32(k * width)) {
    zero(payload, words);
    return kBadSize;
  }
  zero(payload, words);
  if (!acc_all_finite(grad, residual, n)) return kNonFinite;

  // Every candidate above the k-th largest magnitude is sent, and of those equal to it
  // the first `ties` by index (ties to the lower index).
  const std::vector<Candidate> found = candidates_of(grad, residual, n, k);
  std::vector<float> magnitude(found.size());
  for (size_t c = 0; c < found.size(); ++c) magnitude[c] = std::fabs(found[c].acc);
  std::nth_element(magnitude.begin(), magnitude.begin() + (k - 1), magnitude.end(),
                   std::greater<float>());
  const float kth = magnitude[k - 1];
  int64_t ties = k;
  for (const Candidate& c : found) ties -= std::fabs(c.acc) > kth;

  accumulate(grad, residual, n);
  write_header(payload, kCodecElementTopk, n, static_cast<float>(k), 0.0f, k * width);
  float* entry = payload + kHeaderWords;
  for (const Candidate& c : found) {
    const float m = std::fabs(c.acc);
    if (!(m > kth || (m == kth && ties > 0))) continue;
    ties -= m == kth;
    entry[0] = static_cast<float>(c.index % kExactF32);
    if (width == 3) entry[1] = static_cast<float>(c.index / kExactF32);
    entry[width - 1] = c.acc;
    entry += width;
    residual[c.index] = 0.0f;
  }
  return kOk;
}

static inline int64_t entry_index(const float* entry, int64_t width) {
  int64_t index = static_cast<int64_t>(entry[0]);
  if (width == 3) index += static_cast<int64_t>(entry[1]) * kExactF32;
  return index;
}

// k of a payload after checking every field and entry; kOk or a status.
static int element_topk_check(const float* payload, int64_t payload_words, int64_t n,
                              int64_t* k) {
  float a, b;
  const int status = check_header(payload, payload_words, kCodecElementTopk, n, &a, &b);
  if (status != kOk) return status;
  const int64_t width = element_topk_index_words(n) + 1;
  // Float64 tests, as the spec's; finite and range first so that the conversion is defined.
  const double kd = a;
  if (!(kd >= 1.0 && kd <= static_cast<double>(n) && kd == std::floor(kd) && b == 0.0f &&
        static_cast<double>(payload_words) ==
            static_cast<double>(kHeaderWords) + kd * static_cast<double>(width)))
    return kBadParam;
  *k = static_cast<int64_t>(kd);
  // Every word first, then the indices, so that a payload with both faults gets the
  // spec's status (kBadWord).
  const float* body = payload + kHeaderWords;
  for (int64_t e = 0; e < *k; ++e) {
    const float* entry = body + e * width;
    for (int64_t w = 0; w < width - 1; ++w) {
      const double v = entry[w];
      if (!(v >= 0.0 && v < static_cast<double>(kExactF32) && v == std::floor(v)))
        return kBadWord;
    }
    // An encoder never sends a non-finite value: a payload that holds one is malformed.
    if (!std::isfinite(entry[width - 1])) return kBadWord;
  }
  int64_t previous = -1;
  for (int64_t e = 0; e < *k; ++e) {
    const int64_t index = entry_index(body + e * width, width);
    if (index >= n || index <= previous) return kBadIndex;
    previous = index;
  }
  return kOk;
}

int element_topk_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  int64_t k = 0;
  const int status = element_topk_check(payload, payload_words, n, &k);
  zero(out, n);
  if (status != kOk) return status;
  const int64_t width = element_topk_index_words(n) + 1;
  for (const float* entry = payload + kHeaderWords; k > 0; --k, entry += width)
    out[entry_index(entry, width)] = entry[width - 1];
  return kOk;
}

int element_topk_decode_add(const float* payload, int64_t payload_words, int64_t n,
                            float* acc) {
  int64_t k = 0;
  const int status = element_topk_check(payload, payload_words, n, &k);
  if (status != kOk) return status;
  const int64_t width = element_topk_index_words(n) + 1;
  for (const float* entry = payload + kHeaderWords; k > 0; --k, entry += width)
    acc[entry_index(entry, width)] += entry[width - 1];
  return kOk;
}

// The servers' row (codec_table.h): id, name, decoders, payload size.
KVX_REGISTER_CODEC(kElementTopkRow, kCodecElementTopk,
    "element_topk", element_topk_decode, element_topk_decode_add,
    [](int64_t n, float k, float) -> int64_t {
      const int64_t entries = count_param(k);
      return entries < 0 ? -1 : element_topk_payload_words(n, entries);
    },
    nullptr);

}  // namespace kvx
