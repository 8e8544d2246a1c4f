// MXNet's built-in 2-bit layout (gradient_compression.cc): 16 values per 32-bit word,
// 11 = +t, 10 = -t, 00 = 0.  Raw bits cannot cross the server's float merge, so this is
// for comparisons with MXNet, not a server-decoded codec.
#ifndef KVX_CODECS_TWOBIT_H_
#define KVX_CODECS_TWOBIT_H_

#include <cstdint>

#include "wire.h"

namespace kvx {

constexpr int kTwoBitPerWord = 16;

inline int64_t twobit_words(int64_t n) { return ceil_div(n, kTwoBitPerWord); }

// MXNet's bit order.  Like MXNet it does not check for non-finite values.
// words: twobit_words(n).
int twobit_encode(const float* grad, float* residual, int64_t n, double threshold,
                  uint32_t* words);
int twobit_decode(const uint32_t* words, int64_t n, double threshold, float* out);

}  // namespace kvx

#endif  // KVX_CODECS_TWOBIT_H_
