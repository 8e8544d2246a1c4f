// float16 in sum mode (dist_sync_fp16, kvstore_ext/codecs/fp16.py): a worker sends
// acc = grad + residual clipped to +-limit and rounded to float16 (nearest, ties to even,
// as NumPy's astype), and keeps acc minus what it sent.  One op does what took MXNet nine
// (add, finite check, where, multiply, clip, two casts, subtract, copy): two passes over
// the tensor instead of about twenty, 8-12x faster on cnn512's 512 x 3136 weight
// (bench/fp16_kernels.py), where MXNet's cast to float16 alone took longer than the op.
// Without a residual (the default) it is one pass, the CPU's F16C conversion where it has
// one: less than a copy of the tensor.
#ifndef KVX_CODECS_FP16_H_
#define KVX_CODECS_FP16_H_

#include <cstdint>

#include "wire.h"

namespace kvx {

// float16 bits of a float32 of magnitude <= 65504, rounded to nearest, ties to even
// (subnormal halves included); the bits of a larger or non-finite value are unspecified.
uint16_t float_to_half(float x);
float half_to_float(uint16_t h);  // exact; Inf and NaN included

// If every acc = grad + residual (residual null: acc = grad) is finite: half[i] =
// float_to_half(clamp(acc[i], -limit, limit)), residual[i] = acc[i] - half[i] (when not
// null), and kOk.  Otherwise every half is NaN (so the sum of every worker's halves is
// NaN: the step is void on every worker), the residual is untouched, and kNonFinite.
// `limit` is a float16 value <= 65504 (codecs/fp16.py, limit).
int fp16_encode(const float* grad, float* residual, int64_t n, float limit, uint16_t* half);

// out[i] = half_to_float(half[i]): the pulled sum, widened (NaN stays NaN).
void fp16_widen(const uint16_t* half, int64_t n, float* out);

// ---- server aggregation: float16 pairs, decoded by the servers ------------------------
//
// The halves of fp16_encode, two to a float32 word after the header: word j holds half
// 2j in its low 16 bits and half 2j + 1 in its high 16 (a last odd half with zeros).  A
// payload carries raw bits, which no other codec does (python/kvx_ref/wire.py says
// why they avoid it), and survives the transport because every half is finite: the
// float32 exponent field of a word is the high half's 5-bit exponent and 3 mantissa
// bits, which are all ones only for a half Inf or NaN, so no word is NaN or Inf, and a
// server's `x + 0` and `x * 1` keep every other word bit for bit (but -0.0, a pair of
// zeros with the high one negative, which becomes +0.0: the same numbers).  Header:
// a = the clip limit, b = 1 with error feedback (the residual updated) else 0 (the
// residual neither read nor written; it may be grad itself).
constexpr float kCodecFp16Pairs = 7.0f;

inline int64_t fp16_pairs_payload_words(int64_t n) { return kHeaderWords + ceil_div(n, 2); }

int fp16_pairs_encode(const float* grad, float* residual, int64_t n, float limit,
                      float error_feedback, float* payload);
// kBadWord if any half is Inf or NaN (no encoder writes one: a corrupted payload).
int fp16_pairs_decode(const float* payload, int64_t payload_words, int64_t n, float* out);
int fp16_pairs_decode_add(const float* payload, int64_t payload_words, int64_t n,
                          float* acc);

}  // namespace kvx

#endif  // KVX_CODECS_FP16_H_
