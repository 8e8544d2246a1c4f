// PowerSGD's worker-side ops (kvstore_ext/codecs/powersgd.py, steps 1, 4, 5 and 7).
//
//   kvx_powersgd_acc(grad, residual)  -> acc f32 of grad's shape, status f32[1]:
//                         acc = grad + residual (residual of as many elements); status
//                         is kNonFinite (1) if grad holds NaN/Inf, else 0
//   kvx_powersgd_p_hat(p f32[R, r])    -> p_hat f32[R, r], void f32[1]: void is 1 if p
//                         holds NaN/Inf, else 0; p_hat = orthonormal columns of p
//                         (Householder QR), or of zeros if void
//   kvx_powersgd_next_q(q_old f32[C, r], q_sum f32[C, r], void_in f32[1])
//                      -> q_next f32[C, r], void f32[1]: void is 1 if void_in is not 0
//                         or q_sum holds NaN/Inf, else 0; q_next = q_old if void, else
//                         orthonormal columns of q_sum
//   kvx_lowrank_residual(acc f32[R, C], residual*, p f32[R, r], q f32[C, r], status f32[1])
//                      -> f32[1], zero; residual = acc - p q^T if status is 0, else
//                         residual unchanged (a void step keeps it)
//
// `*` marks an input updated in place (setMutateInputs).
#include "kernels.h"
#include "op_util.h"

using namespace kvx_ops;

namespace {

struct PowerSGDAcc : OpSpec {
  static constexpr const char* name = "kvx_powersgd_acc";
  static constexpr const char* inputs[] = {"grad", "residual"};
  static constexpr int outputs = 2;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    if (product(in[0]) != product(in[1])) {
      MX_ERROR_MSG << name << ": grad and residual must hold as many elements, got "
                   << shape_string(in[0]) << " and " << shape_string(in[1]);
      return false;
    }
    (*out)[0] = in[0];
    (*out)[1] = Shape{1};
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    set_status(out[1], kvx::powersgd_acc(f32(in[0]), f32(in[1]), in[0].size(), f32(out[0])));
  }
};

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

// (rows, rank) with 1 <= rank <= rows: a matrix whose columns can be orthonormal.
bool tall_matrix(const char* op, const Shape& m, const char* what) {
  if (m.size() == 2 && m[0] >= 1 && m[1] >= 1 && m[1] <= m[0]) return true;
  MX_ERROR_MSG << op << ": " << what << " must be (rows, rank) with 1 <= rank <= rows, got "
               << shape_string(m);
  return false;
}

struct PowerSGDPHat : OpSpec {
  static constexpr const char* name = "kvx_powersgd_p_hat";
  static constexpr const char* inputs[] = {"p"};
  static constexpr int outputs = 2;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    if (!tall_matrix(name, in[0], "p")) return false;
    (*out)[0] = in[0];
    (*out)[1] = Shape{1};
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    set_status(out[1], kvx::powersgd_p_hat(f32(in[0]), in[0].shape[0], in[0].shape[1],
                                           f32(out[0])));
  }
};

struct PowerSGDNextQ : OpSpec {
  static constexpr const char* name = "kvx_powersgd_next_q";
  static constexpr const char* inputs[] = {"q_old", "q_sum", "void_in"};
  static constexpr int outputs = 2;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    if (!tall_matrix(name, in[0], "q_old") || !same_shape(name, in, 0, "q_old", 1, "q_sum"))
      return false;
    if (product(in[2]) != 1) {
      MX_ERROR_MSG << name << ": void_in must hold one element, got " << shape_string(in[2]);
      return false;
    }
    (*out)[0] = in[0];
    (*out)[1] = Shape{1};
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    set_status(out[1], kvx::powersgd_next_q(f32(in[0]), f32(in[1]), f32(in[2])[0],
                                            in[0].shape[0], in[0].shape[1], f32(out[0])));
  }
};

}  // namespace

KVX_REGISTER_OP(PowerSGDAcc);
KVX_REGISTER_OP(LowrankResidual);
KVX_REGISTER_OP(PowerSGDPHat);
KVX_REGISTER_OP(PowerSGDNextQ);
