// DGC's momentum correction; see momentum.h.
#include "codecs/momentum.h"

#include "kernel_util.h"

namespace kvx {

KVX_HOT void momentum_velocity(const float* velocity, const float* grad, int64_t n, float m,
                               float* u) {
  for (int64_t i = 0; i < n; ++i) {
    const float carried = velocity[i] * m;
    u[i] = carried + grad[i];
  }
}

void zero_rows(const int64_t* sent, int64_t count, int64_t rows, int64_t row_size, float* x) {
  for (int64_t j = 0; j < count; ++j)
    if (sent[j] >= 0 && sent[j] < rows) zero(x + sent[j] * row_size, row_size);
}

KVX_HOT void momentum_deliver(const float* total, float* delivered, int64_t n, float m,
                              float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float t = total[i], previous = delivered[i];
    const float carried = m * previous;
    out[i] = t - carried;
    delivered[i] = t == t ? t : previous;
  }
}

}  // namespace kvx
