// AdaComp (Chen et al., AAAI 2018, arXiv 1712.02679): localized selection of gradient
// residues.  G = grad + residual is cut into bins of `bin` elements; an element j is sent
// when |H_j| >= max|G| of its bin, with H = G + grad (the residue plus the latest
// gradient, so elements that are still growing go first).  A sent element carries its
// index and the sign of H; every sent element stands for the same value, the tensor's
// scale (the mean over bins of max|G|).  The residual keeps G - sign * scale for the
// sent elements and G for the others.  docs/schemes/adacomp.md states the rule and the payload.
#ifndef KVX_CODECS_ADACOMP_H_
#define KVX_CODECS_ADACOMP_H_

#include <cstdint>

#include "wire.h"

namespace kvx {

constexpr float kCodecAdacomp = 4.0f;

// An entry is the code 2 * index + (H < 0) as exact float32 integers: one word while
// every code is below 2^24 (n <= 2^23), else two (code mod 2^24, code div 2^24).
inline int64_t adacomp_entry_words(int64_t n) { return 2 * n <= kExactF32 ? 1 : 2; }
// Payload of `count` entries (the slot is sized for `capacity` entries).
inline int64_t adacomp_payload_words(int64_t n, int64_t count) {
  return kHeaderWords + count * adacomp_entry_words(n);
}
// Two words a code stay exact for n <= 2^47.
constexpr int64_t kAdacompMaxElements = kExactTwoF32 / 2;

// payload: adacomp_payload_words(n, capacity) words: header (a = scale, b = count,
// body = count entries), the entries by ascending index, zeros after them.  At most
// `capacity` elements are sent: if more qualify, the `capacity` with the largest |H|
// (ties to the lower index) go and the others stay in the residual.
// 1 <= bin, 1 <= capacity <= n, else kBadParam.
int adacomp_encode(const float* grad, float* residual, int64_t n, int64_t bin,
                   int64_t capacity, float* payload);
// payload_words is the payload's own length (header + body), not the slot's.
int adacomp_decode(const float* payload, int64_t payload_words, int64_t n, float* out);
// acc[sent] += +-scale (other elements are not touched).
int adacomp_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc);
// sent[e] = the element index (code / 2) of this worker's own payload's entry e for the
// header's count entries, n (nothing) for the slot's unused entries after them and for a
// word that is not a code; for DGC's masking (kvstore_ext/codecs/momentum.py).
// payload: adacomp_payload_words(n, capacity) words, the encoder's (a void one: count 0).
void adacomp_sent(const float* payload, int64_t n, int64_t capacity, int64_t* sent);

}  // namespace kvx

#endif  // KVX_CODECS_ADACOMP_H_
