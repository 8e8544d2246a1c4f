// MXNet's 2-bit layout; see twobit.h.
#include "codecs/twobit.h"

#include <cstring>

#include "kernel_util.h"

namespace kvx {

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

}  // namespace kvx
