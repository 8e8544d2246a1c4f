// PowerSGD's worker-side arithmetic that MXNet's operators do in more passes
// (kvstore_ext/codecs/powersgd.py, steps 4, 5 and 7): the residual a worker keeps, and
// the orthonormalisation of P and Q with the void check of a NaN or Inf.
#ifndef KVX_CODECS_POWERSGD_H_
#define KVX_CODECS_POWERSGD_H_

#include <cstdint>

namespace kvx {

// Step 1: acc = grad + residual (n elements; residual null: acc = grad, a copy).  Returns
// kNonFinite if grad holds a NaN or Inf (acc is still written: the step voids itself on
// the engine, powersgd.py), else kOk: the gradient's finite check rides along, one pass
// where MXNet's add (several times a copy's time) and a check took two.
int powersgd_acc(const float* grad, const float* residual, int64_t n, float* acc);

// residual = acc - p q^T, with acc and residual rows x cols, p rows x rank and q
// cols x rank, all row-major; each element's rank products are added in k order, in
// float32.  One pass over acc and the residual: MXNet's gemm in place on acc and a copy
// into the residual made two.  rank >= 1; acc and residual must not alias.
void lowrank_residual(const float* acc, const float* p, const float* q, int64_t rows,
                      int64_t cols, int64_t rank, float* residual);

// q = the explicit Q factor of the Householder QR of a (rows x rank, row-major, finite,
// 1 <= rank <= rows), row-major too: LAPACK's geqr2 then org2r (the reflections and
// sign convention of MXNet's linalg.gelqf of a^T and of NumPy's qr), computed in double
// and rounded once.  Its columns are orthonormal whatever a's rank: a column that is
// zero below the diagonal gets the identity reflection (tau = 0).  Deterministic: every
// sum is taken in a fixed order, so every worker gets the same bits from the same a.
// a and q may alias.
void householder_q(const float* a, int64_t rows, int64_t rank, float* q);

// Step 4: p_hat = householder_q(p), or householder_q of zeros (the first rank columns of
// the identity) if p holds a NaN or Inf.  Returns kNonFinite in that case, else kOk.
int powersgd_p_hat(const float* p, int64_t rows, int64_t rank, float* p_hat);

// Step 7: q_next = q_old if the step is void (void_in != 0, NaN included, or q_sum
// holds a NaN or Inf), else householder_q(q_sum).  Returns kNonFinite if void, else kOk.
// q_next may alias q_old or q_sum.
int powersgd_next_q(const float* q_old, const float* q_sum, float void_in, int64_t rows,
                    int64_t rank, float* q_next);

}  // namespace kvx

#endif  // KVX_CODECS_POWERSGD_H_
