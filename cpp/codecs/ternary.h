// Hylo's FC codec: each value of acc = grad + residual becomes -1, 0 or +1 (|acc| >= t),
// standing for -v, 0 or +v; the rest stays in the residual.  Codes + 1 travel as digits
// packed into float32 words: base 3 behind the header for the servers to decode, or
// base 2n+1 with no header for the homomorphic variant (the stock server adds words).
#ifndef KVX_CODECS_TERNARY_H_
#define KVX_CODECS_TERNARY_H_

#include <cstdint>

#include "wire.h"

namespace kvx {

constexpr float kCodecTernary = 3.0f;
constexpr int64_t kTernaryBase = 3;
constexpr int kTernaryDigits = 15;           // 3^15 <= 2^24 < 3^16
// Keeps the homomorphic base 2n+1 below 2^24: at least one digit a float32 word.
constexpr int64_t kMaxWorkers = 1 << 20;

inline int64_t ternary_payload_words(int64_t n) {
  return kHeaderWords + ceil_div(n, kTernaryDigits);
}
inline int64_t sum_base(int64_t num_workers) { return 2 * num_workers + 1; }
// Words of a homomorphic ternary payload; 0 when num_workers is out of range.
int64_t ternary_sum_words(int64_t n, int64_t num_workers);

// t = float32(threshold) if threshold > 0, else adaptive_threshold(.., scale); an
// adaptive t that overflows float32 is kNonFinite (residual untouched), a fixed one that
// does is kBadParam.  payload: ternary_payload_words(n) words.
// Delivery cap (adaptive t only): t = min(scale * mean|acc|, max|acc|), and when the cap
// decides (scale * mean|acc| >= max|acc|) a code stands for t under every value_rule.
// Why: with equal magnitudes (a constant or sign-only gradient, one element) nothing
// reached scale * mean|acc| for scale > 1, and the threshold grew with the residual, so
// nothing was ever sent.  Capped, the largest values are sent whole (residual 0); not
// capped, the largest |acc| = m > t shrinks to |m - v| < m (v = 2t < 2m for 'round').
// So every step whose acc is not all zero sends something.
// value_rule: what a nonzero code stands for; the header carries it, so
// decoders do not depend on the rule.
//   kValueThreshold: t (MXNet's 2-bit rule);
//   kValueRound: 2t, so that a code is acc rounded to the nearest multiple of 2t
//     (clipped to +-1) and a sent value's residual stays within +-t (Hylo's rule).
// Any other rule is kBadParam (1, a former rule that measured worse, is not reused,
// so that a request that names it fails rather than meaning another rule); a value
// beyond float32's range is kNonFinite (adaptive t) or kBadParam (fixed t).
enum TernaryValueRule { kValueThreshold = 0, kValueRound = 2 };
int ternary_encode(const float* grad, float* residual, int64_t n, double scale,
                   double threshold, float* payload, int value_rule = kValueThreshold);
int ternary_decode(const float* payload, int64_t payload_words, int64_t n, float* out);
int ternary_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc);

// Homomorphic ternary: fixed t, codes + 1 packed in base b = 2n+1 (n = num_workers) into
// float32 words, D digits a word with b^D <= 2^24, no header.  Float32 because MXNet's
// dist server sums float64 pushes in float32; the sum of n workers' words, in any order,
// stays an integer below b^D, exact in float32.  words: ternary_sum_words(n, num_workers).
// value > 0: selection by |acc| >= threshold, but a code stands for value
// (the residual keeps acc - code * value; decode the sum with threshold = value).
int ternary_encode_sum(const float* grad, float* residual, int64_t n, double threshold,
                       int64_t num_workers, float* words, double value = 0.0);
// Decodes the element-wise sum of num_workers payloads: out = (sum of codes) * t.
// kBadParam if num_words or a parameter is wrong, kBadWord if a word is not an integer
// in [0, b^D); out is zeroed then.
int ternary_decode_sum(const float* words, int64_t num_words, double threshold,
                       int64_t num_workers, int64_t n, float* out);

}  // namespace kvx

#endif  // KVX_CODECS_TERNARY_H_
