// Statistics of acc = grad + residual that the workers of a homomorphic round sum to
// agree on parameters (kvstore_ext/codecs/agreed.py, additive.py).
//
//   kvx_acc_filter_scores(grad, residual)              -> scores f32[O] of grad + residual
//   kvx_acc_abs_sum(grad, residual)                    -> sum |grad + residual| f32[1]
//   kvx_acc_abs_max(grad, residual)                    -> max |grad + residual| f32[1]
//                                  (NaN or Inf if some element of grad + residual is)
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

// Statistics of acc = grad + residual without forming acc (one pass, no temporary): what
// each worker contributes to the homomorphic agreement (kvstore_ext/codecs/additive.py).
struct AccStat : OpSpec {
  static constexpr const char* inputs[] = {"grad", "residual"};
  static constexpr int outputs = 1;
};

struct AccFilterScores : AccStat {
  static constexpr const char* name = "kvx_acc_filter_scores";
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    if (!residual_shape(name, in)) return false;
    (*out)[0] = Shape{in[0][0]};
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    write_filter_scores(in[0], out[0], [&](int64_t filters, int64_t size, double* scores) {
      kvx::acc_filter_scores(f32(in[0]), f32(in[1]), filters, size, scores);
    });
  }
};

struct AccAbsSum : AccStat {
  static constexpr const char* name = "kvx_acc_abs_sum";
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = Shape{1};
    return residual_shape(name, in);
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    const int64_t n = product(in[0].shape);
    f32(out[0])[0] = static_cast<float>(kvx::acc_abs_sum(f32(in[0]), f32(in[1]), n));
  }
};

// max |acc|: the homomorphic FC's delivery cap (codecs/additive.py) sums it over workers.
struct AccAbsMax : AccStat {
  static constexpr const char* name = "kvx_acc_abs_max";
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = Shape{1};
    return residual_shape(name, in);
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    f32(out[0])[0] = kvx::acc_abs_max(f32(in[0]), f32(in[1]), product(in[0].shape));
  }
};

}  // namespace

KVX_REGISTER_OP(AccFilterScores);
KVX_REGISTER_OP(AccAbsSum);
KVX_REGISTER_OP(AccAbsMax);
