// PowerSGD's residual; see powersgd.h.  Not decoded by the servers (its rounds are sums
// the stock server adds), so no row of the codec table.
#include "codecs/powersgd.h"

#include <vector>

#include "kernel_util.h"

namespace kvx {

namespace {

// One row: product[j] = sum_k p_row[k] q^T[k][j], then out[j] = acc[j] - product[j].
// Over j innermost, so that GCC vectorises every loop.
KVX_HOT void residual_row(const float* acc, const float* p_row, const float* q_t,
                          int64_t cols, int64_t rank, float* product, float* out) {
  for (int64_t j = 0; j < cols; ++j) product[j] = p_row[0] * q_t[j];
  for (int64_t k = 1; k < rank; ++k) {
    const float pk = p_row[k];
    const float* qk = q_t + k * cols;
    for (int64_t j = 0; j < cols; ++j) product[j] += pk * qk[j];
  }
  for (int64_t j = 0; j < cols; ++j) out[j] = acc[j] - product[j];
}

}  // namespace

void lowrank_residual(const float* acc, const float* p, const float* q, int64_t rows,
                      int64_t cols, int64_t rank, float* residual) {
  std::vector<float> q_t(static_cast<size_t>(rank * cols)), product(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t k = 0; k < rank; ++k) q_t[k * cols + j] = q[j * rank + k];
  for (int64_t i = 0; i < rows; ++i)
    residual_row(acc + i * cols, p + i * rank, q_t.data(), cols, rank, product.data(),
                 residual + i * cols);
}

}  // namespace kvx
