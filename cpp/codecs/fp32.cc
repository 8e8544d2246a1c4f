// fp32 pass-through; see fp32.h.
#include "codecs/fp32.h"

#include <cstring>

#include "codec_table.h"
#include "kernel_util.h"
#include "stats.h"

namespace kvx {

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

// The header's own checks agree on n and on the body length, but not with each other:
// a body shorter than n values would be read past its end (found by fuzz_decoders).
static int check_fp32(const float* payload, int64_t payload_words, int64_t n) {
  float a, b;
  const int status = check_header(payload, payload_words, kCodecFp32, n, &a, &b);
  if (status == kOk && payload_words != fp32_payload_words(n)) return kBadSize;
  return status;
}

int fp32_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  const int status = check_fp32(payload, payload_words, n);
  if (status != kOk) {
    zero(out, n);
    return status;
  }
  if (n > 0) std::memcpy(out, payload + kHeaderWords, static_cast<size_t>(n) * sizeof(float));
  return kOk;
}

int fp32_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc) {
  const int status = check_fp32(payload, payload_words, n);
  if (status != kOk) return status;
  add_into(acc, payload + kHeaderWords, n);
  return kOk;
}

// The servers' row (codec_table.h): id, name, decoders, payload size.
KVX_REGISTER_CODEC(kFp32Row, kCodecFp32,
    "fp32", fp32_decode, fp32_decode_add,
    [](int64_t n, float, float) { return fp32_payload_words(n); },
    [](const float* grad, float*, int64_t n, float, float, float* payload) {
      return fp32_encode(grad, n, payload);
    });

}  // namespace kvx
