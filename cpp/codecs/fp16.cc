// float16 in sum mode; see fp16.h.  Not decoded by the servers (MXNet's stock server adds
// float16 keys), so no row of the codec table.
#include "codecs/fp16.h"

#include <cstring>

#include "kernel_util.h"
#include "stats.h"
#include "wire.h"

namespace kvx {

namespace {

KVX_INLINE uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// a if `take_a`, else b, as a mask: GCC if-converts a `?:` whose arms hold float
// arithmetic only under -fno-trapping-math, and results must stay exact without it.
KVX_INLINE uint32_t select(bool take_a, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(take_a);
  return (a & mask) | (b & ~mask);
}

KVX_INLINE float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// Branch-free, so that the loops below vectorise.  The magnitude is clipped to `limit`
// as bits (finite non-negative floats order as their bit patterns: an integer min, where
// a float comparison would keep a branch for NaN's sake).  A normal half: drop 13
// mantissa bits, adding 0xfff plus the lowest kept bit first (ties to even) and rebiasing
// the exponent (127 -> 15).  A subnormal half (|x| < 2**-14): adding 0.5 to |x| lines the
// half's subnormal unit 2**-24 up with float32's unit at 0.5, so the FPU rounds to
// nearest even and the low mantissa bits are the half's.
KVX_INLINE uint16_t to_half(float x, uint32_t limit_bits) {
  const uint32_t u = bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t mag = u & 0x7fffffffu;
  mag = mag < limit_bits ? mag : limit_bits;
  const uint32_t normal = (mag + 0xc8000fffu + ((mag >> 13) & 1u)) >> 13;  // -112 << 23
  const uint32_t subnormal = bits(from_bits(mag) + 0.5f) - 0x3f000000u;
  return static_cast<uint16_t>(sign | select(mag < 0x38800000u, subnormal, normal));
}

// Exact: a normal half rebiased (15 -> 127); a subnormal one as its integer times 2**-24;
// Inf and NaN (exponent 31) to float32's exponent 255.
KVX_INLINE float to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t mag = h & 0x7fffu;
  const float subnormal = static_cast<float>(mag) * 5.9604644775390625e-8f;  // 2**-24
  const uint32_t normal = (mag << 13) + 0x38000000u;                        // 112 << 23
  const uint32_t special = (mag << 13) | 0x7f800000u;
  return from_bits(sign | select(mag < 0x0400u, bits(subnormal),
                                 select(mag >= 0x7c00u, special, normal)));
}

KVX_HOT void encode_ef(const float* grad, float* residual, int64_t n, uint32_t limit_bits,
                       uint16_t* half) {
  for (int64_t i = 0; i < n; ++i) {
    const float acc = grad[i] + residual[i];
    const uint16_t h = to_half(acc, limit_bits);
    half[i] = h;
    residual[i] = acc - to_float(h);
  }
}

KVX_HOT void encode_plain(const float* grad, int64_t n, uint32_t limit_bits, uint16_t* half) {
  for (int64_t i = 0; i < n; ++i) half[i] = to_half(grad[i], limit_bits);
}

KVX_HOT void widen(const uint16_t* half, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_float(half[i]);
}

}  // namespace

uint16_t float_to_half(float x) { return to_half(x, 0x477fe000u); }  // 65504
float half_to_float(uint16_t h) { return to_float(h); }

int fp16_encode(const float* grad, float* residual, int64_t n, float limit, uint16_t* half) {
  if (n < 0) return kBadParam;
  const bool finite = residual ? acc_all_finite(grad, residual, n) : all_finite(grad, n);
  if (!finite) {
    for (int64_t i = 0; i < n; ++i) half[i] = 0x7e00u;  // quiet NaN
    return kNonFinite;
  }
  if (residual)
    encode_ef(grad, residual, n, bits(limit), half);
  else
    encode_plain(grad, n, bits(limit), half);
  return kOk;
}

void fp16_widen(const uint16_t* half, int64_t n, float* out) { widen(half, n, out); }

}  // namespace kvx
