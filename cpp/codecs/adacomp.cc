// AdaComp's localized selection; see adacomp.h.
#include "codecs/adacomp.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "codec_table.h"
#include "kernel_util.h"

namespace kvx {

struct AdacompCandidate {
  int64_t index;
  float magnitude;  // |H|
  bool negative;    // H < 0
};

// max |G| over one bin, G = grad + residual; *bad counts elements whose H = G + grad is
// not finite (H finite implies grad, residual and G finite).
KVX_HOT static float bin_max(const float* grad, const float* residual, int64_t len, int64_t* bad) {
  float gmax = 0.0f;
  int64_t nonfinite = 0;
  for (int64_t j = 0; j < len; ++j) {
    const float g = grad[j];
    const float acc = g + residual[j];
    const float h = acc + g;
    gmax = std::max(gmax, std::fabs(acc));
    nonfinite += !(std::fabs(h) <= FLT_MAX);
  }
  *bad += nonfinite;
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
  int64_t bad = 0;
  for (int64_t i = 0; i < bins; ++i) {
    const int64_t start = i * bin;
    gmax[i] = bin_max(grad + start, residual + start, std::min(bin, n - start), &bad);
  }
  zero(payload, words);
  if (bad) return kNonFinite;

  std::vector<AdacompCandidate> sent;
  for (int64_t i = 0; i < bins; ++i)
    select_bin(grad, residual, i * bin, std::min(bin, n - i * bin), gmax[i], &sent);
  if (static_cast<int64_t>(sent.size()) > capacity) {
    // Over capacity: the largest |H| go (ties to the lower index); the rest stay in G.
    std::nth_element(sent.begin(), sent.begin() + capacity, sent.end(),
                     [](const AdacompCandidate& x, const AdacompCandidate& y) {
                       return x.magnitude > y.magnitude ||
                              (x.magnitude == y.magnitude && x.index < y.index);
                     });
    sent.resize(static_cast<size_t>(capacity));
    std::sort(sent.begin(), sent.end(),
              [](const AdacompCandidate& x, const AdacompCandidate& y) { return x.index < y.index; });
  }
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

// The servers' row (codec_table.h): id, name, decoders, payload size.
KVX_REGISTER_CODEC(kAdacompRow, kCodecAdacomp,
    "adacomp", adacomp_decode, adacomp_decode_add,
    [](int64_t n, float, float count) -> int64_t {
      const int64_t entries = count_param(count);
      return entries < 0 ? -1 : adacomp_payload_words(n, entries);
    },
    nullptr);

}  // namespace kvx
