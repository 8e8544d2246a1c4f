// PowerSGD's worker-side arithmetic that MXNet's operators do in more passes
// (kvstore_ext/codecs/powersgd.py, step 5): the residual a worker keeps.
#ifndef KVX_CODECS_POWERSGD_H_
#define KVX_CODECS_POWERSGD_H_

#include <cstdint>

namespace kvx {

// residual = acc - p q^T, with acc and residual rows x cols, p rows x rank and q
// cols x rank, all row-major; each element's rank products are added in k order, in
// float32.  One pass over acc and the residual: MXNet's gemm in place on acc and a copy
// into the residual made two.  rank >= 1; acc and residual must not alias.
void lowrank_residual(const float* acc, const float* p, const float* q, int64_t rows,
                      int64_t cols, int64_t rank, float* residual);

}  // namespace kvx

#endif  // KVX_CODECS_POWERSGD_H_
