// float16 in sum mode and as pairs the servers decode; see fp16.h.  Sum mode needs no
// row of the codec table (MXNet's stock server adds float16 keys); the pairs have one.
#include "codecs/fp16.h"

#include <cmath>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(KVX_NO_CLONES)
#define KVX_F16C 1
#include <immintrin.h>
#endif

#include "codec_table.h"
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

// Halves as the encoders write them: into uint16_t arrays (kvx_fp16_encode's output)
// or into a pairs payload's float32 words (may_alias: the words are float32 elsewhere).
using HalfWords = uint16_t __attribute__((may_alias));

KVX_HOT void encode_ef(const float* grad, float* residual, int64_t n, uint32_t limit_bits,
                       HalfWords* half) {
  for (int64_t i = 0; i < n; ++i) {
    const float acc = grad[i] + residual[i];
    const uint16_t h = to_half(acc, limit_bits);
    half[i] = h;
    residual[i] = acc - to_float(h);
  }
}

// Without a residual the finite check rides along (one pass over grad, not two): true if
// every grad[i] was finite; the halves of a non-finite one are unspecified.
KVX_HOT bool encode_plain_portable(const float* grad, int64_t n, uint32_t limit_bits,
                                   HalfWords* half) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad |= static_cast<uint32_t>((bits(grad[i]) & 0x7fffffffu) >= 0x7f800000u);
    half[i] = to_half(grad[i], limit_bits);
  }
  return bad == 0;
}

#ifdef KVX_F16C
// The same with the CPU's own conversion (F16C's vcvtps2ph rounds to nearest even,
// subnormal halves included, whatever MXCSR says): 8 floats an instruction where the
// portable loop takes about ten integer operations a float.  The clip is a float min
// of the magnitude (a NaN's is replaced by the limit, and reported as not finite).
__attribute__((target("avx2,f16c"))) bool encode_plain_f16c(const float* grad, int64_t n,
                                                            uint32_t limit_bits,
                                                            HalfWords* half) {
  const __m256 limit = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(limit_bits)));
  const __m256 magnitude_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i below_inf = _mm256_set1_epi32(0x7f7fffff);
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(grad + i);
    const __m256 mag = _mm256_and_ps(x, magnitude_mask);
    bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_castps_si256(mag), below_inf));
    const __m256 clipped = _mm256_or_ps(_mm256_min_ps(mag, limit),
                                        _mm256_andnot_ps(magnitude_mask, x));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(half + i),
                     _mm256_cvtps_ph(clipped, _MM_FROUND_TO_NEAREST_INT));
  }
  const bool tail_finite = encode_plain_portable(grad + i, n - i, limit_bits, half + i);
  return tail_finite && _mm256_testz_si256(bad, bad);
}
#endif

bool encode_plain(const float* grad, int64_t n, uint32_t limit_bits, HalfWords* half) {
#ifdef KVX_F16C
  static const bool f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (f16c) return encode_plain_f16c(grad, n, limit_bits, half);
#endif
  return encode_plain_portable(grad, n, limit_bits, half);
}

KVX_HOT void widen(const HalfWords* half, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_float(half[i]);
}

KVX_HOT void widen_add(const HalfWords* half, int64_t n, float* acc) {
  for (int64_t i = 0; i < n; ++i) acc[i] += to_float(half[i]);
}

// True if every half is finite (exponent below 31).
KVX_HOT bool halves_finite(const HalfWords* half, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint32_t>((half[i] & 0x7c00u) == 0x7c00u);
  return bad == 0;
}

// The body of a pairs payload as halves: little-endian words hold half 2j in their low
// 16 bits, so the body read as uint16_t is the halves in order.
HalfWords* body_halves(float* payload) {
  return reinterpret_cast<HalfWords*>(payload + kHeaderWords);
}
const HalfWords* body_halves(const float* payload) {
  return reinterpret_cast<const HalfWords*>(payload + kHeaderWords);
}
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "pairs assume little-endian words");

int check_pairs(const float* payload, int64_t payload_words, int64_t n) {
  float a, b;
  const int status = check_header(payload, payload_words, kCodecFp16Pairs, n, &a, &b);
  if (status != kOk) return status;
  if (payload_words != fp16_pairs_payload_words(n)) return kBadSize;
  return halves_finite(body_halves(payload), n) ? kOk : kBadWord;
}

}  // namespace

uint16_t float_to_half(float x) { return to_half(x, 0x477fe000u); }  // 65504
float half_to_float(uint16_t h) { return to_float(h); }

int fp16_encode(const float* grad, float* residual, int64_t n, float limit, uint16_t* half) {
  if (n < 0) return kBadParam;
  // with a residual, nothing may be written before the whole acc is known finite
  const bool finite = residual ? acc_all_finite(grad, residual, n)
                               : encode_plain(grad, n, bits(limit), half);
  if (!finite) {
    for (int64_t i = 0; i < n; ++i) half[i] = 0x7e00u;  // quiet NaN
    return kNonFinite;
  }
  if (residual) encode_ef(grad, residual, n, bits(limit), half);
  return kOk;
}

void fp16_widen(const uint16_t* half, int64_t n, float* out) { widen(half, n, out); }

int fp16_pairs_encode(const float* grad, float* residual, int64_t n, float limit,
                      float error_feedback, float* payload) {
  if (n < 0) return kBadParam;
  const int64_t words = fp16_pairs_payload_words(n);
  if (!count_fits_header(n) || !exact_in_f32(words - kHeaderWords)) {
    zero(payload, words);
    return kBadSize;
  }
  if (!(limit > 0.0f && limit <= 65504.0f) ||
      (error_feedback != 0.0f && error_feedback != 1.0f)) {
    zero(payload, words);
    return kBadParam;
  }
  const bool feedback = error_feedback == 1.0f;
  HalfWords* half = body_halves(payload);
  const bool finite = feedback ? acc_all_finite(grad, residual, n)
                               : encode_plain(grad, n, bits(limit), half);
  if (!finite) {
    zero(payload, words);
    return kNonFinite;
  }
  write_header(payload, kCodecFp16Pairs, n, limit, error_feedback, words - kHeaderWords);
  if (feedback) encode_ef(grad, residual, n, bits(limit), half);
  if (n % 2) half[n] = 0;
  return kOk;
}

int fp16_pairs_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  const int status = check_pairs(payload, payload_words, n);
  if (status != kOk) {
    zero(out, n);
    return status;
  }
  widen(body_halves(payload), n, out);
  return kOk;
}

int fp16_pairs_decode_add(const float* payload, int64_t payload_words, int64_t n,
                          float* acc) {
  const int status = check_pairs(payload, payload_words, n);
  if (status != kOk) return status;
  widen_add(body_halves(payload), n, acc);
  return kOk;
}

// The servers' row (codec_table.h): a = limit, b = error feedback (0 or 1).
KVX_REGISTER_CODEC(kFp16PairsRow, kCodecFp16Pairs,
    "fp16_pairs", fp16_pairs_decode, fp16_pairs_decode_add,
    [](int64_t n, float, float) { return fp16_pairs_payload_words(n); },
    fp16_pairs_encode);

}  // namespace kvx
