// Statistics of gradients; see stats.h.
#include "stats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernel_util.h"

namespace kvx {

// ---- NumPy-order float64 summation ----------------------------------------------------
//
// NumPy 1.x reduces a contiguous float64 array in chunks of its buffer size (8192
// elements), adding each chunk's pairwise sum (blocks of <= 128 summed with 8 interleaved
// accumulators, larger ranges split in two at a multiple of 8) to the running total.
// Reproducing that order gives the reference's thresholds and filter scores exactly, so
// top-k ties and near-ties resolve identically.  The 8-accumulator leaf is also what
// makes the loop vectorisable without reassociating anything.

constexpr int64_t kNumpyChunk = 8192;
constexpr int64_t kPairwiseBlock = 128;

// Pairwise leaf over [begin, begin + n), n <= 128, term(i) giving the float64 summand.
template <class Term>
KVX_INLINE double pairwise_leaf(const Term& term, int64_t begin, int64_t n) {
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; ++i) res += term(begin + i);
    return res;
  }
  double r[8];
  for (int j = 0; j < 8; ++j) r[j] = term(begin + j);
  int64_t i = 8;
  for (; i < n - (n % 8); i += 8)
    for (int j = 0; j < 8; ++j) r[j] += term(begin + i + j);
  double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
  for (; i < n; ++i) res += term(begin + i);
  return res;
}

// Pairwise sum of one chunk (n <= 8192): NumPy's recursion, run with an explicit stack
// so that everything inlines into the caller's (vectorised, target-cloned) body.
template <class Term>
KVX_INLINE double pairwise_chunk(const Term& term, int64_t begin, int64_t n) {
  if (n <= kPairwiseBlock) return pairwise_leaf(term, begin, n);
  struct Frame { int64_t begin, n; bool expanded; };
  Frame stack[64];
  double values[64];
  int frames = 0, nvalues = 0;
  stack[frames++] = {begin, n, false};
  while (frames > 0) {
    Frame& f = stack[frames - 1];
    if (f.n <= kPairwiseBlock) {
      values[nvalues++] = pairwise_leaf(term, f.begin, f.n);
      --frames;
    } else if (!f.expanded) {
      f.expanded = true;
      int64_t half = f.n / 2;
      half -= half % 8;
      const Frame right = {f.begin + half, f.n - half, false};
      const Frame left = {f.begin, half, false};
      stack[frames++] = right;  // evaluated second
      stack[frames++] = left;   // evaluated first
    } else {
      const double right = values[--nvalues];
      const double left = values[--nvalues];
      values[nvalues++] = left + right;
      --frames;
    }
  }
  return values[0];
}

template <class Term>
KVX_INLINE double numpy_sum(const Term& term, int64_t begin, int64_t n) {
  double total = 0.0;
  for (int64_t c = 0; c < n; c += kNumpyChunk)
    total += pairwise_chunk(term, begin + c, std::min(kNumpyChunk, n - c));
  return total;
}

// ---- statistics -----------------------------------------------------------------------

// Exponent bits all ones <=> NaN or Inf.  Integer OR-reduction, so it vectorises: the
// sum (bits & exp) + 2^23 reaches bit 31 exactly when the exponent is all ones.
KVX_INLINE uint32_t nonfinite_bit(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & 0x7f800000u) + 0x00800000u;
}

KVX_HOT bool all_finite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= nonfinite_bit(x[i]);
  return (bad & 0x80000000u) == 0;
}

KVX_HOT bool acc_all_finite(const float* grad, const float* residual, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= nonfinite_bit(grad[i] + residual[i]);
  return (bad & 0x80000000u) == 0;
}

KVX_HOT double acc_abs_sum(const float* grad, const float* residual, int64_t n) {
  auto term = [grad, residual](int64_t i) {
    return std::fabs(static_cast<double>(grad[i] + residual[i]));
  };
  return numpy_sum(term, 0, n);
}

// Finite non-negative floats order as their bit patterns: an integer max reduction,
// which vectorises where a float one (NaN rules) does not.
KVX_HOT float acc_abs_max(const float* grad, const float* residual, int64_t n) {
  uint32_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float a = grad[i] + residual[i];
    uint32_t bits;
    std::memcpy(&bits, &a, sizeof bits);
    bits &= 0x7fffffffu;
    best = bits > best ? bits : best;
  }
  float m;
  std::memcpy(&m, &best, sizeof m);
  return m;
}

float adaptive_threshold(double abs_sum, int64_t n, double scale) {
  return static_cast<float>(scale * (abs_sum / static_cast<double>(n)));
}

KVX_HOT void filter_scores(const float* x, int64_t filters, int64_t filter_size,
                           double* scores) {
  auto term = [x](int64_t i) {
    const double v = x[i];
    return v * v;  // exact: a float32 squared fits in a float64 mantissa
  };
  for (int64_t o = 0; o < filters; ++o) scores[o] = numpy_sum(term, o * filter_size, filter_size);
}

KVX_HOT void acc_filter_scores(const float* grad, const float* residual, int64_t filters,
                               int64_t filter_size, double* scores) {
  auto term = [grad, residual](int64_t i) {
    const double v = grad[i] + residual[i];
    return v * v;
  };
  for (int64_t o = 0; o < filters; ++o) scores[o] = numpy_sum(term, o * filter_size, filter_size);
}

void topk_select(const double* scores, int64_t filters, int64_t k, int64_t* indices) {
  std::vector<int64_t> order(static_cast<size_t>(filters));
  std::iota(order.begin(), order.end(), int64_t{0});
  // Strict total order: larger score first, then lower index.
  auto before = [scores](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  if (k < filters) std::nth_element(order.begin(), order.begin() + k, order.end(), before);
  std::sort(order.begin(), order.begin() + k);
  std::copy(order.begin(), order.begin() + k, indices);
}

}  // namespace kvx
