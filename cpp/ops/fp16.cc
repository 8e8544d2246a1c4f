// float16 in sum mode (kvstore_ext/codecs/fp16.py): a worker's halves in one op.
//
//   kvx_fp16_encode(grad, residual*; limit)  -> half f16[n], status f32[1]
//   kvx_fp16_round(grad; limit)              -> half f16[n], status f32[1]
//                                  (no error feedback: nothing kept)
//   kvx_fp16_widen(half f16)                 -> f32 of half's shape (MXNet's cast was
//                                  slower below 10^7 elements: bench/fp16_kernels.py)
//
// A NaN or Inf in acc makes every half NaN and leaves the residual as it was
// (codecs/fp16.h): the worker pushes the halves before anyone reads the status, and the
// NaN sum voids the step on every worker.
#include <string>

#include "kernels.h"
#include "op_util.h"

using namespace kvx_ops;

namespace {

struct Fp16Params {
  double limit = 0.0;
  bool parse(const Attrs& attrs, std::string* error) {
    if (!check_keys(attrs, {"limit"}, error) ||
        !get_real(attrs, "limit", 0.0, true, true, 0.0, &limit, error))
      return false;
    if (limit <= 65504.0) return true;
    *error = "attribute limit='" + attrs.at("limit") + "' exceeds float16's 65504";
    return false;
  }
};

uint16_t* halves(MXTensor& t) { return static_cast<uint16_t*>(t.data_ptr); }

struct Fp16Encode : Encoder {
  static constexpr const char* name = "kvx_fp16_encode";
  static constexpr int first_output_dtype = mxnet::ext::kFloat16;
  using Params = Fp16Params;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = in[0];
    (*out)[1] = Shape{1};
    return residual_shape(name, in);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    set_status(out[1], kvx::fp16_encode(f32(in[0]), f32(in[1]), in[0].size(),
                                        static_cast<float>(p.limit), halves(out[0])));
  }
};

struct Fp16Round : OpSpec {
  static constexpr const char* name = "kvx_fp16_round";
  static constexpr const char* inputs[] = {"grad"};
  static constexpr int outputs = 2;
  static constexpr int first_output_dtype = mxnet::ext::kFloat16;
  using Params = Fp16Params;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = in[0];
    (*out)[1] = Shape{1};
    return nonempty(name, in[0], "grad");
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    set_status(out[1], kvx::fp16_encode(f32(in[0]), nullptr, in[0].size(),
                                        static_cast<float>(p.limit), halves(out[0])));
  }
};

struct Fp16Widen : OpSpec {
  static constexpr const char* name = "kvx_fp16_widen";
  static constexpr const char* inputs[] = {"half"};
  static constexpr int outputs = 1;
  static constexpr int input_dtype = mxnet::ext::kFloat16;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = in[0];
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    kvx::fp16_widen(halves(in[0]), in[0].size(), f32(out[0]));
  }
};

}  // namespace

KVX_REGISTER_OP(Fp16Encode);
KVX_REGISTER_OP(Fp16Widen);
KVX_REGISTER_OP(Fp16Round);
