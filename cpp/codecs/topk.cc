// Conv filter selection (top-k); see topk.h.
#include "codecs/topk.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "codec_table.h"
#include "kernel_util.h"
#include "stats.h"

namespace kvx {

// residual += grad (filters that stay in the residual).
KVX_HOT static void keep_in_residual(const float* grad, float* residual, int64_t n) {
  for (int64_t i = 0; i < n; ++i) residual[i] = grad[i] + residual[i];
}

// out = grad + residual; residual = 0 (filters that are sent).
KVX_HOT static void send_from_residual(const float* grad, float* residual, int64_t n,
                                       float* out) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = grad[i] + residual[i];
    residual[i] = 0.0f;
  }
}

// Checks agreed or received filter indices: integral, in [0, rows), strictly ascending.
static bool indices_valid(const float* indices, int64_t k, int64_t rows) {
  double previous = -1.0;
  for (int64_t i = 0; i < k; ++i) {
    const double v = indices[i];
    if (!(v >= 0.0 && v < static_cast<double>(rows) && v == std::floor(v) && v > previous))
      return false;
    previous = v;
  }
  return true;
}

// Pass 2 of every filter codec: rows listed in `sent` (ascending) go to `values` and are
// zeroed in the residual; runs of rows in between get residual = acc.
static void split_rows(const float* grad, float* residual, int64_t filters,
                       int64_t filter_size, const int64_t* sent, int64_t k, float* values) {
  int64_t row = 0;
  for (int64_t s = 0; s < k; ++s) {
    const int64_t next = sent[s];
    keep_in_residual(grad + row * filter_size, residual + row * filter_size,
                     (next - row) * filter_size);
    send_from_residual(grad + next * filter_size, residual + next * filter_size, filter_size,
                       values + s * filter_size);
    row = next + 1;
  }
  keep_in_residual(grad + row * filter_size, residual + row * filter_size,
                   (filters - row) * filter_size);
}

int topk_encode(const float* grad, float* residual, int64_t filters, int64_t filter_size,
                int64_t k, float* payload) {
  if (filters < 1 || filter_size < 1 || k < 1 || k > filters) {
    if (k >= 0 && filter_size >= 0) zero(payload, topk_payload_words(k, filter_size));
    return kBadParam;
  }
  const int64_t body = k + k * filter_size;
  // Indices, k, F and the body length are float32 words: they must be exact.
  if (filters > kExactF32 || filter_size > kExactF32 || !exact_in_f32(body) ||
      !count_fits_header(filters * filter_size)) {
    zero(payload, kHeaderWords + body);
    return kBadSize;
  }
  std::vector<double> scores(static_cast<size_t>(filters));
  acc_filter_scores(grad, residual, filters, filter_size, scores.data());
  for (double s : scores) {
    if (!std::isfinite(s)) {  // a float32 square sum cannot overflow float64
      zero(payload, kHeaderWords + body);
      return kNonFinite;
    }
  }
  std::vector<int64_t> sent(static_cast<size_t>(k));
  topk_select(scores.data(), filters, k, sent.data());
  write_header(payload, kCodecTopk, filters * filter_size, static_cast<float>(k),
               static_cast<float>(filter_size), body);
  for (int64_t i = 0; i < k; ++i) payload[kHeaderWords + i] = static_cast<float>(sent[i]);
  split_rows(grad, residual, filters, filter_size, sent.data(), k, payload + kHeaderWords + k);
  return kOk;
}

// Header parameters and indices of a top-k payload; on kOk, *k and *f are set.
static int topk_check(const float* payload, int64_t payload_words, int64_t n, int64_t* k,
                      int64_t* f) {
  float a, b;
  const int status = check_header(payload, payload_words, kCodecTopk, n, &a, &b);
  if (status != kOk) return status;
  // Same tests as the spec, in float64; finite and range tests first so that the
  // integer conversions below are defined.
  const double kd = a, fd = b, nd = static_cast<double>(n);
  if (!(std::isfinite(kd) && std::isfinite(fd) && kd == std::floor(kd) &&
        fd == std::floor(fd) && kd >= 1.0 && fd >= 1.0 && kd * fd <= nd &&
        static_cast<double>(payload_words) == static_cast<double>(kHeaderWords) + kd + kd * fd))
    return kBadParam;
  *k = static_cast<int64_t>(kd);
  *f = static_cast<int64_t>(fd);
  if (n % *f != 0) return kBadParam;
  if (!indices_valid(payload + kHeaderWords, *k, n / *f)) return kBadIndex;
  return kOk;
}

int topk_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  int64_t k = 0, f = 0;
  const int status = topk_check(payload, payload_words, n, &k, &f);
  zero(out, n);
  if (status != kOk) return status;
  const float* indices = payload + kHeaderWords;
  const float* values = indices + k;
  for (int64_t s = 0; s < k; ++s) {
    const int64_t row = static_cast<int64_t>(indices[s]);
    std::memcpy(out + row * f, values + s * f, static_cast<size_t>(f) * sizeof(float));
  }
  return kOk;
}

int topk_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc) {
  int64_t k = 0, f = 0;
  const int status = topk_check(payload, payload_words, n, &k, &f);
  if (status != kOk) return status;
  const float* indices = payload + kHeaderWords;
  const float* values = indices + k;
  for (int64_t s = 0; s < k; ++s)
    add_into(acc + static_cast<int64_t>(indices[s]) * f, values + s * f, f);
  return kOk;
}

int topk_gather(const float* grad, float* residual, int64_t filters, int64_t filter_size,
                const float* indices, int64_t k, float* values) {
  if (filters < 1 || filter_size < 1 || k < 0 || k > filters) {
    if (k >= 0 && filter_size >= 0) zero(values, k * filter_size);
    return kBadParam;
  }
  if (!indices_valid(indices, k, filters)) {
    zero(values, k * filter_size);
    return kBadIndex;
  }
  if (!acc_all_finite(grad, residual, filters * filter_size)) {
    zero(values, k * filter_size);
    return kNonFinite;
  }
  std::vector<int64_t> sent(static_cast<size_t>(k));
  for (int64_t s = 0; s < k; ++s) sent[s] = static_cast<int64_t>(indices[s]);
  split_rows(grad, residual, filters, filter_size, sent.data(), k, values);
  return kOk;
}

int topk_scatter(const float* values, const float* indices, int64_t k, int64_t filters,
                 int64_t filter_size, float* out) {
  if (filters < 1 || filter_size < 1 || k < 0 || k > filters) {
    if (filters >= 0 && filter_size >= 0) zero(out, filters * filter_size);
    return kBadParam;
  }
  zero(out, filters * filter_size);
  if (!indices_valid(indices, k, filters)) return kBadIndex;
  for (int64_t s = 0; s < k; ++s)
    std::memcpy(out + static_cast<int64_t>(indices[s]) * filter_size, values + s * filter_size,
                static_cast<size_t>(filter_size) * sizeof(float));
  return kOk;
}

// The servers' row (codec_table.h): id, name, decoders, payload size.
KVX_REGISTER_CODEC(kTopkRow, kCodecTopk,
    "topk", topk_decode, topk_decode_add,
    [](int64_t, float k, float filter_size) -> int64_t {
      const int64_t rows = count_param(k), row = count_param(filter_size);
      return rows < 0 || row < 0 ? -1 : topk_payload_words(rows, row);
    },
    nullptr);

}  // namespace kvx
