// Element top-k (the usual sparsification baseline): the k elements of
// acc = grad + residual with the largest |acc| are sent as (index, value) entries; the
// others stay in the residual, and the residual of a sent element becomes 0 (zero-fill,
// cheaper than decode-and-subtract and equal to it).  docs/schemes/topk.md states the payload.
#ifndef KVX_CODECS_ELEMENT_TOPK_H_
#define KVX_CODECS_ELEMENT_TOPK_H_

#include <cstdint>

#include "wire.h"

namespace kvx {

constexpr float kCodecElementTopk = 5.0f;

// An index is an exact float32 integer: one word while every index is below 2^24
// (n <= 2^24), else two (index mod 2^24, index div 2^24).  An entry is its index words,
// then the float32 value.
inline int64_t element_topk_index_words(int64_t n) { return n <= kExactF32 ? 1 : 2; }
// Two words an index stay exact, and n fits the header, for n < 2^48.
constexpr int64_t kElementTopkMaxElements = kExactTwoF32 - 1;
inline int64_t element_topk_payload_words(int64_t n, int64_t k) {
  return kHeaderWords + k * (element_topk_index_words(n) + 1);
}

// payload: element_topk_payload_words(n, k) words: header (a = k, b = 0, body = k
// entries), the entries by ascending index.  Ties in |acc| go to the lower index.
// 1 <= k <= n, else kBadParam.
int element_topk_encode(const float* grad, float* residual, int64_t n, int64_t k,
                        float* payload);
// How this thread's last element_topk_encode found its candidates: 1 from a sampled floor
// (tensors of 65,536 elements and more), 2 by the radix select (smaller tensors, or the
// sample's floor left fewer than k).  For the tests, which check both.
int element_topk_last_path();
int element_topk_decode(const float* payload, int64_t payload_words, int64_t n, float* out);
// acc[sent] += values (other elements are not touched).
int element_topk_decode_add(const float* payload, int64_t payload_words, int64_t n,
                            float* acc);
// sent[e] = the element index of this worker's own payload's entry e (e < k), for DGC's
// masking (kvstore_ext/codecs/momentum.py); n (nothing) for a word that is not an index
// (a void payload's zeroed entries still read as index 0, as the encoder left them).
// payload: element_topk_payload_words(n, k) words, not checked (it is the encoder's).
void element_topk_sent(const float* payload, int64_t n, int64_t k, int64_t* sent);

}  // namespace kvx

#endif  // KVX_CODECS_ELEMENT_TOPK_H_
