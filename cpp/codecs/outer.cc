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

// acc is formed in tiles of kRows rows by kCols columns, each held in registers while
// every row j of U and V adds to it, then added to acc once: the loop is bound by
// arithmetic, not by loads and stores of acc.  Columns are taken kTile at a time so that
// V's part (k rows of kTile floats) stays in cache while every tile of rows passes it.
constexpr int64_t kTile = 512;
constexpr int kRows = 4;
constexpr int kCols = 16;

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

// Eight floats, loaded and stored unaligned (GCC's vector extension: AVX2 registers in
// the avx2 clone, SSE pairs in the baseline one).
typedef float Floats8 __attribute__((vector_size(32), aligned(4)));

// acc[r][x] += sum over t of u[js[t]][r] * v[js[t]][x] for kRows rows and kCols columns:
// u and v point at the tile's first row and column (strides out and in), the products
// summed in js's order from +0 in registers (a product, then a sum: -ffp-contract=off
// keeps it two roundings), then added to acc.  Eight named sums, not an array: GCC kept
// an array of them (or a template over the row count) in memory, several times slower.
KVX_HOT static void tile_full(const float* __restrict__ u, int64_t out,
                              const float* __restrict__ v, int64_t in, const int64_t* js,
                              int64_t count, float* __restrict__ acc) {
  Floats8 s00 = {}, s01 = {}, s10 = {}, s11 = {}, s20 = {}, s21 = {}, s30 = {}, s31 = {};
  for (int64_t t = 0; t < count; ++t) {
    const float* uj = u + js[t] * out;
    const float* vj = v + js[t] * in;
    Floats8 x0, x1;
    __builtin_memcpy(&x0, vj, sizeof x0);
    __builtin_memcpy(&x1, vj + 8, sizeof x1);
    const float a0 = uj[0], a1 = uj[1], a2 = uj[2], a3 = uj[3];
    s00 += x0 * a0; s01 += x1 * a0;
    s10 += x0 * a1; s11 += x1 * a1;
    s20 += x0 * a2; s21 += x1 * a2;
    s30 += x0 * a3; s31 += x1 * a3;
  }
  const Floats8 sums[kRows][2] = {{s00, s01}, {s10, s11}, {s20, s21}, {s30, s31}};
  for (int r = 0; r < kRows; ++r) {
    for (int h = 0; h < 2; ++h) {
      Floats8 y;
      __builtin_memcpy(&y, acc + r * in + 8 * h, sizeof y);
      y += sums[r][h];
      __builtin_memcpy(acc + r * in + 8 * h, &y, sizeof y);
    }
  }
}

// The same for a tile at the edges: rows <= kRows, cols <= kCols, the same order.
static void tile_edge(const float* u, int64_t out, const float* v, int64_t in,
                      const int64_t* js, int64_t count, int rows, int cols, float* acc) {
  float sums[kRows][kCols] = {};
  for (int64_t t = 0; t < count; ++t) {
    for (int r = 0; r < rows; ++r) {
      const float a = u[js[t] * out + r];
      for (int x = 0; x < cols; ++x) sums[r][x] += a * v[js[t] * in + x];
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int x = 0; x < cols; ++x) acc[r * in + x] += sums[r][x];
}

int outer_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc) {
  int64_t k = 0, out = 0;
  const int status = check_outer(payload, payload_words, n, &k, &out);
  if (status != kOk) return status;
  const int64_t in = n / out;
  const float* u = payload + kHeaderWords;
  const float* v = u + k * out;
  // This payload's product is summed in registers and then added, so that
  // acc += decode(payload) exactly, as for every codec (and as the spec's decode_slots
  // adds each worker's decoded tensor).  Rows j whose coefficients for a tile's rows are
  // all zero (the padding) are skipped: each adds +-0 to a sum that is never -0, so no
  // bit changes.  js lists, for each tile of rows, the rows j it takes.
  const int64_t row_tiles = (out + kRows - 1) / kRows;
  std::vector<int64_t> js(static_cast<size_t>(row_tiles * k));
  std::vector<int64_t> counts(static_cast<size_t>(row_tiles));
  for (int64_t b = 0; b < row_tiles; ++b) {
    const int64_t o = b * kRows, rows = std::min<int64_t>(kRows, out - o);
    int64_t count = 0;
    for (int64_t j = 0; j < k; ++j) {
      bool any = false;
      for (int64_t r = 0; r < rows; ++r) any |= u[j * out + o + r] != 0.0f;
      if (any) js[b * k + count++] = j;
    }
    counts[b] = count;
  }
  for (int64_t start = 0; start < in; start += kTile) {
    const int64_t end = std::min(in, start + kTile);
    for (int64_t b = 0; b < row_tiles; ++b) {
      const int64_t o = b * kRows;
      const int rows = static_cast<int>(std::min<int64_t>(kRows, out - o));
      const int64_t* rows_j = js.data() + b * k;
      int64_t i = start;
      if (rows == kRows) {
        for (; i + kCols <= end; i += kCols)
          tile_full(u + o, out, v + i, in, rows_j, counts[b], acc + o * in + i);
      }
      for (; i < end; i += kCols)
        tile_edge(u + o, out, v + i, in, rows_j, counts[b], rows,
                  static_cast<int>(std::min<int64_t>(kCols, end - i)), acc + o * in + i);
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
