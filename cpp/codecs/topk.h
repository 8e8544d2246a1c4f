// Hylo's conv codec: the k output filters of acc = grad + residual with the largest L2
// norms (indices + values); the others stay in the residual.  Also the homomorphic
// variant, whose filter set is agreed beforehand (gather / scatter, no header).
#ifndef KVX_CODECS_TOPK_H_
#define KVX_CODECS_TOPK_H_

#include <cstdint>

#include "wire.h"

namespace kvx {

constexpr float kCodecTopk = 2.0f;

inline int64_t topk_payload_words(int64_t k, int64_t filter_size) {
  return kHeaderWords + k + k * filter_size;
}

// The tensor is `filters` x `filter_size` (shape[0] x the rest).  payload:
// topk_payload_words(k, filter_size) words: header (a = k, b = filter_size), k indices
// ascending, then the k selected filters of acc.  New residual: acc with them zeroed.
int topk_encode(const float* grad, float* residual, int64_t filters, int64_t filter_size,
                int64_t k, float* payload);
int topk_decode(const float* payload, int64_t payload_words, int64_t n, float* out);
// acc[sent filters] += values (other elements are not touched).
int topk_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc);

// Homomorphic variant: the filter set `indices` (k float32 integers, strictly ascending,
// in [0, filters)) is agreed beforehand; kBadIndex (values zeroed, residual untouched)
// otherwise.  values: k * filter_size.
int topk_gather(const float* grad, float* residual, int64_t filters, int64_t filter_size,
                const float* indices, int64_t k, float* values);
// out (filters x filter_size) = 0 except the rows `indices`, which get `values`.
// kBadIndex (out zeroed) if the indices are not as for topk_gather.
int topk_scatter(const float* values, const float* indices, int64_t k, int64_t filters,
                 int64_t filter_size, float* out);

}  // namespace kvx

#endif  // KVX_CODECS_TOPK_H_
