// A sum of outer products, sum_j u_j v_j^T, sent as its factors: dAD's and rank-dAD's
// payload (kvstore_ext/schemes/dad.py).  For a Dense layer's weight gradient
// (out x in), dAD sends U = the layer's output deltas D (rows x out) and V = its input
// activations A (rows x in), whose product U^T V is the exact gradient; rank-dAD sends
// the r factors of a power iteration.  The servers form U^T V and sum over workers.
// docs/schemes/dad.md states the payload.
#ifndef KVX_CODECS_OUTER_H_
#define KVX_CODECS_OUTER_H_

#include <cstdint>

#include "wire.h"

namespace kvx {

constexpr float kCodecOuter = 6.0f;

// Header: n = out * in, a = k (rows of U and V, the key's capacity), b = out; body:
// U (k x out, row-major), then V (k x in).  -1 if out does not divide n.
inline int64_t outer_payload_words(int64_t n, int64_t k, int64_t out) {
  if (k < 0 || out < 1 || n < 1 || n % out) return -1;
  return kHeaderWords + k * (out + n / out);
}

// payload: outer_payload_words(out * in, capacity, out) words.  The first `rows` rows
// of U and V are u (rows x out) and v (rows x in); rows up to `capacity` are zero (they
// add nothing).  kBadParam unless 0 <= rows <= capacity, out >= 1, in >= 1;
// kNonFinite (payload zeroed) if u or v holds NaN/Inf.
int outer_encode(const float* u, const float* v, int64_t rows, int64_t capacity,
                 int64_t out, int64_t in, float* payload);
// out (n floats, out x in) = U^T V.
int outer_decode(const float* payload, int64_t payload_words, int64_t n, float* out);
// acc += U^T V: each element's product summed in row order j = 0, 1, ... (float32, no
// FMA), then added to acc, as python/kvx_ref/dad.py; a non-finite word is kBadWord (acc
// untouched).
int outer_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc);

}  // namespace kvx

#endif  // KVX_CODECS_OUTER_H_
