// Sum of outer products; see outer.h.
#include "codecs/outer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "codec_table.h"
#include "kernel_util.h"
#include "stats.h"

namespace kvx {

// Columns of acc handled together: a tile of V (k rows of kTile floats) stays in cache
// while every row of acc takes its k updates.
constexpr int64_t kTile = 512;

int outer_encode(const float* u, const float* v, int64_t rows, int64_t capacity,
                 int64_t out, int64_t in, float* payload) {
  if (out < 1 || in < 1 || capacity < 0 || rows < 0 || rows > capacity) return kBadParam;
  const int64_t n = out * in;
  const int64_t words = outer_payload_words(n, capacity, out);
  const int64_t body = words - kHeaderWords;
  // n, k, out and the body length are float32 header words: they must be exact
  if (!count_fits_header(n) || !exact_in_f32(body) || !exact_in_f32(capacity) ||
      !exact_in_f32(out)) {
    zero(payload, words);
    return kBadSize;
  }
  zero(payload, words);
  if (!all_finite(u, rows * out) || !all_finite(v, rows * in)) return kNonFinite;
  write_header(payload, kCodecOuter, n, static_cast<float>(capacity), static_cast<float>(out),
               body);
  if (rows > 0) {
    std::memcpy(payload + kHeaderWords, u, static_cast<size_t>(rows * out) * sizeof(float));
    std::memcpy(payload + kHeaderWords + capacity * out, v,
                static_cast<size_t>(rows * in) * sizeof(float));
  }
  return kOk;
}

// Header, sizes and every body word checked: (k, out) or a status.
static int check_outer(const float* payload, int64_t payload_words, int64_t n, int64_t* k,
                       int64_t* out) {
  float a = 0.0f, b = 0.0f;
  int status = check_header(payload, payload_words, kCodecOuter, n, &a, &b);
  if (status != kOk) return status;
  if (!(a >= 0 && a < static_cast<float>(kExactF32) && a == std::floor(a) && b >= 1 &&
        b < static_cast<float>(kExactF32) && b == std::floor(b)))
    return kBadParam;
  *k = static_cast<int64_t>(a);
  *out = static_cast<int64_t>(b);
  if (n % *out) return kBadParam;
  if (payload_words != outer_payload_words(n, *k, *out)) return kBadSize;
  if (!all_finite(payload + kHeaderWords, payload_words - kHeaderWords)) return kBadWord;
  return kOk;
}

// y += a * x (a product, then a sum: -ffp-contract=off keeps it two roundings).
KVX_HOT static void axpy(float* __restrict__ y, float a, const float* __restrict__ x,
                         int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// Four rows at once: each value of x is loaded once for four updates (the loop is
// bound by loads and stores, not by arithmetic).
KVX_HOT static void axpy4(float* __restrict__ y0, float* __restrict__ y1,
                          float* __restrict__ y2, float* __restrict__ y3, const float* a,
                          const float* __restrict__ x, int64_t n) {
  const float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    y0[i] += a0 * xi;
    y1[i] += a1 * xi;
    y2[i] += a2 * xi;
    y3[i] += a3 * xi;
  }
}

int outer_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc) {
  int64_t k = 0, out = 0;
  const int status = check_outer(payload, payload_words, n, &k, &out);
  if (status != kOk) return status;
  const int64_t in = n / out;
  const float* u = payload + kHeaderWords;
  const float* v = u + k * out;
  // This payload's product is formed in `part` (a tile of four rows) and then added,
  // so that acc += decode(payload) exactly, as for every codec (and as the spec's
  // decode_slots adds each worker's decoded tensor).  A zero coefficient adds +-0 to a
  // partial sum that is never -0, so skipping zero rows (the padding) changes no bit.
  std::vector<float> part(static_cast<size_t>(4 * kTile));
  float* p = part.data();
  for (int64_t start = 0; start < in; start += kTile) {
    const int64_t width = std::min(kTile, in - start);
    int64_t o = 0;
    for (; o + 4 <= out; o += 4) {
      zero(p, 4 * kTile);
      for (int64_t j = 0; j < k; ++j) {
        const float coef[4] = {u[j * out + o], u[j * out + o + 1], u[j * out + o + 2],
                               u[j * out + o + 3]};
        if (coef[0] == 0.0f && coef[1] == 0.0f && coef[2] == 0.0f && coef[3] == 0.0f) continue;
        axpy4(p, p + kTile, p + 2 * kTile, p + 3 * kTile, coef, v + j * in + start, width);
      }
      for (int r = 0; r < 4; ++r) add_into(acc + (o + r) * in + start, p + r * kTile, width);
    }
    for (; o < out; ++o) {
      zero(p, width);
      for (int64_t j = 0; j < k; ++j) {
        const float coef = u[j * out + o];
        if (coef != 0.0f) axpy(p, coef, v + j * in + start, width);
      }
      add_into(acc + o * in + start, p, width);
    }
  }
  return kOk;
}

int outer_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  zero(out, n);
  const int status = outer_decode_add(payload, payload_words, n, out);
  if (status != kOk) zero(out, n);
  return status;
}

// The servers' row (codec_table.h): id, name, decoders, payload size.
KVX_REGISTER_CODEC(kOuterRow, kCodecOuter,
    "outer", outer_decode, outer_decode_add,
    [](int64_t n, float k, float out) -> int64_t {
      const int64_t rows = count_param(k), cols = count_param(out);
      return rows < 0 || cols < 1 ? -1 : outer_payload_words(n, rows, cols);
    },
    nullptr);

}  // namespace kvx
