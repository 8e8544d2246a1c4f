// fp32 pass-through behind the common header: what a server-decoded tensor that is not
// compressed sends.
#ifndef KVX_CODECS_FP32_H_
#define KVX_CODECS_FP32_H_

#include <cstdint>

#include "wire.h"

namespace kvx {

constexpr float kCodecFp32 = 1.0f;

inline int64_t fp32_payload_words(int64_t n) { return kHeaderWords + n; }

// payload: fp32_payload_words(n) words.
int fp32_encode(const float* grad, int64_t n, float* payload);
int fp32_decode(const float* payload, int64_t payload_words, int64_t n, float* out);
int fp32_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc);

}  // namespace kvx

#endif  // KVX_CODECS_FP32_H_
