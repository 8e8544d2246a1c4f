#include "kernel_util.h"

namespace kvx {

KVX_HOT void add_into(float* acc, const float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += values[i];
}

#ifdef KVX_AVX2
PackLanes::PackLanes() {
  for (int mask = 0; mask < 256; ++mask) {
    int at = 0;
    for (int lane = 0; lane < 8; ++lane)
      if (mask & (1 << lane)) lanes[mask][at++] = lane;
    while (at < 8) lanes[mask][at++] = 0;
  }
}
const PackLanes kPackLanes;
#endif

}  // namespace kvx
