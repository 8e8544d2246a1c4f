// PowerSGD's worker-side op (kvstore_ext/codecs/powersgd.py, step 5).
//
//   kvx_lowrank_residual(acc f32[R, C], residual*, p f32[R, r], q f32[C, r], status f32[1])
//                      -> f32[1], zero; residual = acc - p q^T if status is 0, else
//                         residual unchanged (a void step keeps it)
//
// `*` marks an input updated in place (setMutateInputs).
#include "kernels.h"
#include "op_util.h"

using namespace kvx_ops;

namespace {

struct LowrankResidual : OpSpec {
  static constexpr const char* name = "kvx_lowrank_residual";
  static constexpr const char* inputs[] = {"acc", "residual", "p", "q", "status"};
  static constexpr int outputs = 1;
  static constexpr bool updates_second = true;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    const Shape &acc = in[0], &p = in[2], &q = in[3];
    if (acc.size() != 2 || p.size() != 2 || q.size() != 2 || acc[0] < 1 || acc[1] < 1 ||
        p[0] != acc[0] || q[0] != acc[1] || p[1] != q[1] || p[1] < 1 ||
        product(in[1]) != product(acc) || product(in[4]) != 1) {
      MX_ERROR_MSG << name << ": acc (R, C), residual of R * C elements, p (R, r), q (C, r)"
                   << " and status of one element, got acc " << shape_string(acc)
                   << ", residual " << shape_string(in[1]) << ", p " << shape_string(p)
                   << ", q " << shape_string(q) << ", status " << shape_string(in[4]);
      return false;
    }
    (*out)[0] = Shape{1};
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    if (f32(in[4])[0] == 0.0f)
      kvx::lowrank_residual(f32(in[0]), f32(in[2]), f32(in[3]), in[0].shape[0],
                            in[0].shape[1], in[2].shape[1], f32(in[1]));
    set_status(out[0], kvx::kOk);
  }
};

}  // namespace

KVX_REGISTER_OP(LowrankResidual);
