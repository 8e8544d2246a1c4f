// What THC's MXNet operators share: their attributes and checks (cpp/ops/thc.cc, the
// scheme's ops; cpp/ops_test_thc.cc, its pieces for the differential tests).
#ifndef KVX_OPS_THC_H_
#define KVX_OPS_THC_H_

#include <string>
#include <vector>

#include "codecs/thc.h"
#include "op_util.h"

namespace kvx_ops {

// The scheme's four steps (kvstore_ext/codecs/thc.py) and, for the differential tests
// and the benchmark, its pieces: the randomized Hadamard transform and its inverse,
// quantise-and-pack, unpack-and-dequantise.  `norms` is the summed norm round (one slot
// per worker): M = max(norms), num_workers = its length.  `table` (optional, 0) is a
// table id of cpp/codecs/thc.h: 0 uniform, 1 THC's non-uniform table (levels = 16).

// Attributes shared by the THC ops; each op states which it reads.
struct ThcAttrs {
  kvx::ThcParams p;
  int64_t step = 0, rank = 0, num_workers = 0, summed = 0, size = 0;
  std::vector<int64_t> shape;
  bool quantiser(const Attrs& attrs, std::string* error) {  // levels, clamp, table=0
    return get_int(attrs, "levels", 2, kvx::kExactF32, &p.levels, error) &&
           get_real(attrs, "clamp", 0.0, true, true, 0.0, &p.clamp, error) &&
           (!has(attrs, "table") ||
            get_int(attrs, "table", 0, kvx::kThcTableCount - 1, &p.table, error));
  }
  bool seed_only(const Attrs& attrs, std::string* error) {
    int64_t seed = 0;
    if (!get_int(attrs, "seed", 0, int64_t{1} << 53, &seed, error)) return false;
    p.seed = static_cast<uint64_t>(seed);
    return true;
  }
  bool block(const Attrs& attrs, std::string* error) {
    return get_int(attrs, "block", kvx::kThcMinBlock, kvx::kThcMaxBlock, &p.block, error);
  }
  bool codec(const Attrs& attrs, std::string* error) {  // quantiser, seed, block
    return quantiser(attrs, error) && seed_only(attrs, error) && block(attrs, error);
  }
  bool get_step(const Attrs& attrs, std::string* error) {
    return get_int(attrs, "step", 0, kvx::kThcMaxStep - 1, &step, error);
  }
};

inline bool thc_valid(const char* op, const kvx::ThcParams& p, int64_t num_workers) {
  if (kvx::thc_params_valid(p, num_workers)) return true;
  MX_ERROR_MSG << op << ": levels=" << p.levels << ", table=" << p.table << ", clamp="
               << p.clamp << ", block=" << p.block << " and num_workers=" << num_workers
               << " need levels=" << kvx::kThcTableThcLevels << " for table="
               << kvx::kThcTableThc << ", a base g times num_workers plus 1 <= 2^24 (g = "
               << "levels-1, or " << kvx::kThcTableThcGrid << " for table=" << kvx::kThcTableThc
               << "), a power-of-two block and 0 < clamp <= " << kvx::kThcMaxClamp;
  return false;
}

// (norms): a non-empty vector, its length the worker count.
inline bool thc_norms(const char* op, const Shape& norms, int64_t* num_workers) {
  if (norms.size() != 1 || norms[0] < 1 || norms[0] > kvx::kThcMaxWorkers) {
    MX_ERROR_MSG << op << ": norms must be a vector of one norm per worker, got "
                 << shape_string(norms);
    return false;
  }
  *num_workers = norms[0];
  return true;
}

}  // namespace kvx_ops

#endif  // KVX_OPS_THC_H_
