// PowerSGD's residual and orthonormalisation; see powersgd.h.  Not decoded by the servers (its rounds are sums
// the stock server adds), so no row of the codec table.
#include "codecs/powersgd.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "kernel_util.h"
#include "stats.h"
#include "wire.h"

namespace kvx {

namespace {

KVX_HOT uint32_t add_and_check(const float* grad, const float* residual, int64_t n,
                               float* acc) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &grad[i], sizeof u);
    bad |= static_cast<uint32_t>((u & 0x7fffffffu) >= 0x7f800000u);
    acc[i] = grad[i] + residual[i];
  }
  return bad;
}

KVX_HOT uint32_t copy_and_check(const float* grad, int64_t n, float* acc) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &grad[i], sizeof u);
    bad |= static_cast<uint32_t>((u & 0x7fffffffu) >= 0x7f800000u);
    acc[i] = grad[i];
  }
  return bad;
}

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

int powersgd_acc(const float* grad, const float* residual, int64_t n, float* acc) {
  if (n < 0) return kBadParam;
  const uint32_t bad = residual ? add_and_check(grad, residual, n, acc)
                                : copy_and_check(grad, n, acc);
  return bad ? kNonFinite : kOk;
}

void lowrank_residual(const float* acc, const float* p, const float* q, int64_t rows,
                      int64_t cols, int64_t rank, float* residual) {
  std::vector<float> q_t(static_cast<size_t>(rank * cols)), product(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t k = 0; k < rank; ++k) q_t[k * cols + j] = q[j * rank + k];
  for (int64_t i = 0; i < rows; ++i)
    residual_row(acc + i * cols, p + i * rank, q_t.data(), cols, rank, product.data(),
                 residual + i * cols);
}

namespace {

// sum_i a[i] b[i] in double, over four interleaved partial sums added in a fixed order
// (fast, and the same bits every run).
double dot(const double* a, const double* b, int64_t n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// Applies H = I - tau v v^T, v = [1; below] (below: the rows - j - 1 words under row j
// of the reflector's column), to rows j.. of column c, from the left.
void reflect(const double* below, double tau, int64_t j, int64_t rows, double* c) {
  if (tau == 0.0) return;
  const double s = tau * (c[j] + dot(below, c + j + 1, rows - j - 1));
  c[j] -= s;
  for (int64_t i = j + 1; i < rows; ++i) c[i] -= s * below[i - j - 1];
}

// w (rows x rank, column-major) := its explicit Householder Q factor: LAPACK's geqr2
// (slarfg's reflections: beta = -sign(alpha) |(alpha, x)|, tau = (beta - alpha) / beta,
// v = [1; x / (alpha - beta)], and tau = 0 when x is zero) then org2r.  In double, every
// value bounded by its column's norm, so float32 input needs no scaling against overflow.
void q_factor(int64_t rows, int64_t rank, double* w) {
  std::vector<double> tau(static_cast<size_t>(rank));
  for (int64_t j = 0; j < rank; ++j) {
    double* col = w + j * rows;
    double* below = col + j + 1;
    const int64_t n_below = rows - j - 1;
    const double below_norm2 = dot(below, below, n_below);
    if (below_norm2 == 0.0) {
      tau[j] = 0.0;
      continue;
    }
    const double alpha = col[j];
    const double beta = -std::copysign(std::sqrt(alpha * alpha + below_norm2), alpha);
    tau[j] = (beta - alpha) / beta;
    const double scale = 1.0 / (alpha - beta);
    for (int64_t i = 0; i < n_below; ++i) below[i] *= scale;
    col[j] = beta;
    for (int64_t k = j + 1; k < rank; ++k) reflect(below, tau[j], j, rows, w + k * rows);
  }
  for (int64_t j = rank - 1; j >= 0; --j) {
    double* col = w + j * rows;
    for (int64_t k = j + 1; k < rank; ++k) reflect(col + j + 1, tau[j], j, rows, w + k * rows);
    for (int64_t i = j + 1; i < rows; ++i) col[i] *= -tau[j];
    col[j] = 1.0 - tau[j];
    for (int64_t i = 0; i < j; ++i) col[i] = 0.0;
  }
}

// q (rows x rank, row-major float32) = w (column-major double), rounded.
void store_rows(const std::vector<double>& w, int64_t rows, int64_t rank, float* q) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < rank; ++j) q[i * rank + j] = static_cast<float>(w[j * rows + i]);
}

}  // namespace

void householder_q(const float* a, int64_t rows, int64_t rank, float* q) {
  std::vector<double> w(static_cast<size_t>(rows * rank));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < rank; ++j) w[j * rows + i] = a[i * rank + j];
  q_factor(rows, rank, w.data());
  store_rows(w, rows, rank, q);
}

int powersgd_p_hat(const float* p, int64_t rows, int64_t rank, float* p_hat) {
  if (all_finite(p, rows * rank)) {
    householder_q(p, rows, rank, p_hat);
    return kOk;
  }
  std::vector<double> w(static_cast<size_t>(rows * rank), 0.0);
  q_factor(rows, rank, w.data());
  store_rows(w, rows, rank, p_hat);
  return kNonFinite;
}

int powersgd_next_q(const float* q_old, const float* q_sum, float void_in, int64_t rows,
                    int64_t rank, float* q_next) {
  if (void_in == 0.0f && all_finite(q_sum, rows * rank)) {
    householder_q(q_sum, rows, rank, q_next);
    return kOk;
  }
  if (q_next != q_old)
    std::memmove(q_next, q_old, static_cast<size_t>(rows * rank) * sizeof(float));
  return kNonFinite;
}

}  // namespace kvx
