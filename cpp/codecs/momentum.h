// DGC's momentum correction around a codec (kvstore_ext/codecs/momentum.py), in the
// passes it needs: MXNet's operators took about nine passes over the tensor a step and
// a new tensor-sized array for most of them, and MXNet's CPU arrays are not pooled, so
// each of those faulted in fresh zeroed pages.  Each function computes in float32 what
// the operators did, element by element in the same order (no fused multiply-add), so
// the results are the same bits.
#ifndef KVX_CODECS_MOMENTUM_H_
#define KVX_CODECS_MOMENTUM_H_

#include <cstdint>

namespace kvx {

// u = velocity * m + grad (n elements; the product rounded to float32 before the sum).
void momentum_velocity(const float* velocity, const float* grad, int64_t n, float m,
                       float* u);

// x's rows (row_size elements each, rows of them) named by `sent` (count indices) are
// set to 0; an index outside [0, rows) names nothing (a codec's "nothing sent" is rows).
void zero_rows(const int64_t* sent, int64_t count, int64_t rows, int64_t row_size, float* x);

// After a round: out = total - m * delivered, then delivered = total where total is not
// NaN (a void round's NaN keeps the last delivered sum).  `out` may be `total`.
void momentum_deliver(const float* total, float* delivered, int64_t n, float m, float* out);

}  // namespace kvx

#endif  // KVX_CODECS_MOMENTUM_H_
