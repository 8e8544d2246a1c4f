// DGC's momentum correction around a codec (kvstore_ext/codecs/momentum.py), a step in
// three ops instead of about nine MXNet operators (codecs/momentum.h says why):
//
//   kvx_momentum_velocity(velocity, grad; momentum)  -> u f32 of grad's shape:
//                         u = velocity * momentum + grad
//   kvx_zero_rows(sent i64[k], x*; rows)  -> f32[1], zero: x, as rows of x.size / rows
//                         elements, gets 0 on the rows `sent` names (an index outside
//                         [0, rows) names nothing); k reads and writes of a row, no pass
//   kvx_momentum_deliver(total, delivered*; momentum) -> out (f32 of total's shape):
//                         out = total - momentum * delivered, then delivered = total,
//                         or as it was where total is NaN (out may be given as total)
//
// `*` marks an input updated in place (setMutateInputs).
#include <stdexcept>
#include <string>

#include "kernels.h"
#include "op_util.h"

using namespace kvx_ops;

namespace {

struct MomentumParams {
  double momentum = 0.0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"momentum"}, error) &&
           get_real(attrs, "momentum", 0.0, false, true, 0.0, &momentum, error);
  }
};

// Two inputs of as many elements; the output(s) take the first one's shape.
bool paired(const char* op, const Shapes& in, const char* a, const char* b) {
  if (product(in[0]) == product(in[1])) return true;
  MX_ERROR_MSG << op << ": " << a << " and " << b << " must hold as many elements, got "
               << shape_string(in[0]) << " and " << shape_string(in[1]);
  return false;
}

struct MomentumVelocity : OpSpec {
  static constexpr const char* name = "kvx_momentum_velocity";
  static constexpr const char* inputs[] = {"velocity", "grad"};
  static constexpr int outputs = 1;
  using Params = MomentumParams;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = in[1];
    return paired(name, in, "velocity", "grad");
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    kvx::momentum_velocity(f32(in[0]), f32(in[1]), in[1].size(),
                           static_cast<float>(p.momentum), f32(out[0]));
  }
};

struct RowsParams {
  int64_t rows = 0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"rows"}, error) &&
           get_int(attrs, "rows", 1, int64_t{1} << 62, &rows, error);
  }
};

struct ZeroRows : OpSpec {
  static constexpr const char* name = "kvx_zero_rows";
  static constexpr const char* inputs[] = {"sent", "x"};
  static constexpr int outputs = 1;
  static constexpr bool updates_second = true;
  static constexpr bool any_dtype = true;    // sent: int64, x: float32 (checked below)
  using Params = RowsParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    (*out)[0] = Shape{1};
    if (in[0].size() == 1 && product(in[1]) % p.rows == 0) return true;
    MX_ERROR_MSG << name << ": sent must be 1-D and x's elements a multiple of rows="
                 << p.rows << ", got sent " << shape_string(in[0]) << " and x "
                 << shape_string(in[1]);
    return false;
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    if (in[0].dtype != mxnet::ext::kInt64 || in[1].dtype != mxnet::ext::kFloat32)
      throw std::invalid_argument("kvx_zero_rows: sent must be int64 and x float32");
    kvx::zero_rows(static_cast<const int64_t*>(in[0].data_ptr), in[0].size(), p.rows,
                   in[1].size() / p.rows, f32(in[1]));
    set_status(out[0], kvx::kOk);
  }
};

struct MomentumDeliver : OpSpec {
  static constexpr const char* name = "kvx_momentum_deliver";
  static constexpr const char* inputs[] = {"total", "delivered"};
  static constexpr int outputs = 1;
  static constexpr bool updates_second = true;
  using Params = MomentumParams;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = in[0];
    return paired(name, in, "total", "delivered");
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    kvx::momentum_deliver(f32(in[0]), f32(in[1]), in[0].size(),
                          static_cast<float>(p.momentum), f32(out[0]));
  }
};

}  // namespace

KVX_REGISTER_OP(MomentumVelocity);
KVX_REGISTER_OP(ZeroRows);
KVX_REGISTER_OP(MomentumDeliver);
