// Statistics of a gradient (or of acc = grad + residual without forming it) that the
// encoders and the homomorphic agreement need.  Float64 sums run in NumPy's order, so
// they equal python/kvx_ref's bit for bit.
#ifndef KVX_STATS_H_
#define KVX_STATS_H_

#include <cstdint>

namespace kvx {

// True when no element is NaN or +-Inf.
bool all_finite(const float* x, int64_t n);
// True when no element of grad + residual (in float32) is NaN or +-Inf.
bool acc_all_finite(const float* grad, const float* residual, int64_t n);
// sum |grad + residual| accumulated in float64, in NumPy's order (see stats.cc), so
// that it equals np.abs(acc.astype(np.float64)).sum() exactly.  Non-finite iff some
// acc element is non-finite.
double acc_abs_sum(const float* grad, const float* residual, int64_t n);
// t = float32(scale * (abs_sum / n)), the spec's adaptive threshold.
float adaptive_threshold(double abs_sum, int64_t n, double scale);
// max |grad + residual| (0 for n == 0), exact; NaN if some element of grad + residual
// is NaN, else Inf if some is infinite.
float acc_abs_max(const float* grad, const float* residual, int64_t n);
// Squared L2 norm of each of the `filters` rows of `filter_size` elements, in float64,
// summed in NumPy's order.
void filter_scores(const float* x, int64_t filters, int64_t filter_size, double* scores);
void acc_filter_scores(const float* grad, const float* residual, int64_t filters,
                       int64_t filter_size, double* scores);
// Indices of the k largest scores (ties to the lower index), written ascending.
// Scores must be comparable (no NaN).  1 <= k <= filters.
void topk_select(const double* scores, int64_t filters, int64_t k, int64_t* indices);

}  // namespace kvx

#endif  // KVX_STATS_H_
