// Element top-k; see element_topk.h.
#include "codecs/element_topk.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "codec_table.h"
#include "kernel_util.h"
#include "stats.h"

namespace kvx {

// |grad + residual| of every element (acc formed as the spec forms it, in float32).
KVX_HOT static void acc_magnitudes(const float* grad, const float* residual, int64_t n,
                                   float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::fabs(grad[i] + residual[i]);
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

  // The k-th largest magnitude; every element above it is sent, and of those equal to
  // it the first `ties` by index (ties to the lower index).
  std::vector<float> magnitude(static_cast<size_t>(n));
  acc_magnitudes(grad, residual, n, magnitude.data());
  std::vector<float> order(magnitude);
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), std::greater<float>());
  const float kth = order[k - 1];
  int64_t ties = k;
  for (float m : magnitude) ties -= m > kth;

  write_header(payload, kCodecElementTopk, n, static_cast<float>(k), 0.0f, k * width);
  float* entry = payload + kHeaderWords;
  for (int64_t i = 0; i < n; ++i) {
    const float acc = grad[i] + residual[i];
    const bool sent = magnitude[i] > kth || (magnitude[i] == kth && ties > 0);
    if (!sent) {
      residual[i] = acc;
      continue;
    }
    ties -= magnitude[i] == kth;
    entry[0] = static_cast<float>(i % kExactF32);
    if (width == 3) entry[1] = static_cast<float>(i / kExactF32);
    entry[width - 1] = acc;
    entry += width;
    residual[i] = 0.0f;
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
