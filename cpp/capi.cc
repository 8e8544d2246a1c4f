// extern "C" wrappers of the kernels: raw pointers and sizes in, status out.  No C++
// exception may cross this boundary (ctypes callers would abort), hence the guard.
#include "capi.h"

#include <new>

#include "kernels.h"

namespace {

constexpr int kInternalError = -1;

template <class Fn>
int guarded(Fn&& fn) {
  try {
    return fn();
  } catch (...) {  // std::bad_alloc from per-call scratch
    return kInternalError;
  }
}

}  // namespace

int kvx_abi_version(void) { return KVX_ABI_VERSION; }
float kvx_header_magic(void) { return kvx::kMagic; }
float kvx_header_version(void) { return kvx::kVersion; }
int64_t kvx_header_words(void) { return kvx::kHeaderWords; }

int kvx_status_count(void) { return kvx::kStatusCount; }
const char* kvx_status_name(int status) {
  return status == kInternalError ? "internal error" : kvx::status_name(status);
}
const char* kvx_status_symbol(int status) {
  return status >= 0 && status < kvx::kStatusCount ? kvx::kStatuses[status].symbol : nullptr;
}

int kvx_codec_count(void) { return kvx::codec_count(); }
static const kvx::CodecSpec* codec_at(int index) {
  return index >= 0 && index < kvx::codec_count() ? &kvx::codec_at(index) : nullptr;
}
int kvx_codec_id(int index) {
  const kvx::CodecSpec* codec = codec_at(index);
  return codec ? static_cast<int>(codec->id) : -1;
}
const char* kvx_codec_name(int index) {
  const kvx::CodecSpec* codec = codec_at(index);
  return codec ? codec->name : nullptr;
}
int64_t kvx_codec_payload_words(int index, int64_t n, float a, float b) {
  const kvx::CodecSpec* codec = codec_at(index);
  return codec ? codec->payload_words(n, a, b) : -1;
}

int64_t kvx_fp32_payload_words(int64_t n) { return kvx::fp32_payload_words(n); }
int64_t kvx_topk_payload_words(int64_t k, int64_t filter_size) {
  return kvx::topk_payload_words(k, filter_size);
}
int64_t kvx_ternary_payload_words(int64_t n) { return kvx::ternary_payload_words(n); }
int64_t kvx_ternary_sum_words(int64_t n, int64_t num_workers) {
  return kvx::ternary_sum_words(n, num_workers);
}
int64_t kvx_twobit_words(int64_t n) { return kvx::twobit_words(n); }

int kvx_finite_check(const float* x, int64_t n) {
  return kvx::all_finite(x, n) ? kvx::kOk : kvx::kNonFinite;
}

int kvx_filter_scores(const float* x, int64_t filters, int64_t filter_size, double* scores) {
  if (filters < 0 || filter_size < 0) return kvx::kBadParam;
  kvx::filter_scores(x, filters, filter_size, scores);
  return kvx::kOk;
}

int kvx_fp32_encode(const float* grad, int64_t n, float* payload) {
  return kvx::fp32_encode(grad, n, payload);
}
int kvx_fp32_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  return kvx::fp32_decode(payload, payload_words, n, out);
}
int kvx_fp32_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc) {
  return kvx::fp32_decode_add(payload, payload_words, n, acc);
}

int kvx_topk_encode(const float* grad, float* residual, int64_t filters, int64_t filter_size,
                    int64_t k, float* payload) {
  return guarded([&] {
    return kvx::topk_encode(grad, residual, filters, filter_size, k, payload);
  });
}
int kvx_topk_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  return kvx::topk_decode(payload, payload_words, n, out);
}
int kvx_topk_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc) {
  return kvx::topk_decode_add(payload, payload_words, n, acc);
}
int kvx_topk_gather(const float* grad, float* residual, int64_t filters, int64_t filter_size,
                    const float* indices, int64_t k, float* values) {
  return guarded([&] {
    return kvx::topk_gather(grad, residual, filters, filter_size, indices, k, values);
  });
}
int kvx_topk_scatter(const float* values, const float* indices, int64_t k, int64_t filters,
                     int64_t filter_size, float* out) {
  return kvx::topk_scatter(values, indices, k, filters, filter_size, out);
}

int kvx_ternary_encode(const float* grad, float* residual, int64_t n, double scale,
                       double threshold, float* payload) {
  return kvx::ternary_encode(grad, residual, n, scale, threshold, payload);
}
int kvx_ternary_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  return kvx::ternary_decode(payload, payload_words, n, out);
}
int kvx_ternary_decode_add(const float* payload, int64_t payload_words, int64_t n,
                           float* acc) {
  return kvx::ternary_decode_add(payload, payload_words, n, acc);
}
int kvx_ternary_encode_sum(const float* grad, float* residual, int64_t n, double threshold,
                           int64_t num_workers, float* words) {
  return kvx::ternary_encode_sum(grad, residual, n, threshold, num_workers, words);
}
int kvx_ternary_decode_sum(const float* words, int64_t num_words, double threshold,
                           int64_t num_workers, int64_t n, float* out) {
  return guarded([&] {  // the decoding table is allocated per call
    return kvx::ternary_decode_sum(words, num_words, threshold, num_workers, n, out);
  });
}

int kvx_twobit_encode(const float* grad, float* residual, int64_t n, double threshold,
                      uint32_t* words) {
  return kvx::twobit_encode(grad, residual, n, threshold, words);
}
int kvx_twobit_decode(const uint32_t* words, int64_t n, double threshold, float* out) {
  return kvx::twobit_decode(words, n, threshold, out);
}
