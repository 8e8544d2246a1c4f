#include "kernel_util.h"

namespace kvx {

KVX_HOT void add_into(float* acc, const float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += values[i];
}

}  // namespace kvx
