// float16 in sum mode (dist_sync_fp16, kvstore_ext/codecs/fp16.py): a worker sends
// acc = grad + residual clipped to +-limit and rounded to float16 (nearest, ties to even,
// as NumPy's astype), and keeps acc minus what it sent.  One op does what took MXNet nine
// (add, finite check, where, multiply, clip, two casts, subtract, copy): two passes over
// the tensor instead of about twenty, about 9x faster on cnn512's 512 x 3136 weight
// (bench/fp16_kernels.py), where MXNet's cast to float16 alone took longer than the op.
#ifndef KVX_CODECS_FP16_H_
#define KVX_CODECS_FP16_H_

#include <cstdint>

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

}  // namespace kvx

#endif  // KVX_CODECS_FP16_H_
