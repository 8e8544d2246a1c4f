// The outer-product codec's MXNet operator (dAD, rank-dAD; decoded through the codec
// table).
//

//
// `*` marks an input updated in place (setMutateInputs); op_util.h says how an op is
// declared and what encoders and decoders do on bad input (set_encoded, void_sum).
#include <algorithm>
#include <limits>
#include <vector>

#include "kernels.h"
#include "op_util.h"

using namespace kvx_ops;

namespace {

// ---- outer products (dAD, rank-dAD) ------------------------------------------------------

// kvx_outer_encode(u, v; capacity) -> (payload, status): u (rows x out) and v (rows x in)
// behind the header, padded with zero rows to `capacity` (the key's fixed size).
struct OuterParams {
  int64_t capacity = 0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"capacity"}, error) &&
           get_int(attrs, "capacity", 1, kvx::kExactF32, &capacity, error);
  }
};

struct OuterEncode : OpSpec {
  static constexpr const char* name = "kvx_outer_encode";
  static constexpr const char* inputs[] = {"u", "v"};
  static constexpr int outputs = 2;
  using Params = OuterParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    if (in[0].size() != 2 || in[1].size() != 2 || in[0][0] != in[1][0] || in[0][1] < 1 ||
        in[1][1] < 1) {
      MX_ERROR_MSG << name << ": u (rows x out) and v (rows x in) must be 2-D with the same "
                   << "rows, got " << shape_string(in[0]) << " and " << shape_string(in[1]);
      return false;
    }
    if (in[0][0] > p.capacity) {
      MX_ERROR_MSG << name << ": " << in[0][0] << " rows exceed capacity=" << p.capacity;
      return false;
    }
    (*out)[1] = Shape{1};
    return flat_shape(name, kvx::outer_payload_words(in[0][1] * in[1][1], p.capacity, in[0][1]),
                      &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    const int code = kvx::outer_encode(f32(in[0]), f32(in[1]), in[0].shape[0], p.capacity,
                                       in[0].shape[1], in[1].shape[1], f32(out[0]));
    set_encoded(out[0], out[1], code);
  }
};

}  // namespace

KVX_REGISTER_OP(OuterEncode);
