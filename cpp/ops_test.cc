// MXNet operators that only tests and benchmarks use (kvstore_ext does not): the
// per-codec decoders that servers reach through kvx_decode_slots, one filter statistic,
// and MXNet's 2-bit layout.  Built into the test library libkvx_test_ops (CMake
// KVX_TEST_OPS, on by default), not into the plugin: tests load it (tests/conftest.py).
//
//   kvx_fp32_decode(payload; size | shape)             -> out f32[size], status
//   kvx_fp32_decode_add(payload, acc*)                 -> status       (acc += decoded)
//   kvx_topk_decode(payload; shape)                    -> out f32[shape], status
//   kvx_topk_decode_add(payload, acc*)                 -> status
//   kvx_ternary_decode(payload; shape)                 -> out f32[shape], status
//   kvx_ternary_decode_add(payload, acc*)              -> status
//   kvx_adacomp_decode(payload; shape)                 -> out f32[shape], status
//   kvx_adacomp_decode_add(payload, acc*)              -> status
//   kvx_element_topk_decode(payload; shape)            -> out f32[shape], status
//   kvx_element_topk_decode_add(payload, acc*)         -> status
//   kvx_outer_decode(payload; shape)                   -> out f32[shape], status
//   kvx_outer_decode_add(payload, acc*)                -> status
//   kvx_filter_scores(x)                               -> scores f32[O]
//   kvx_twobit_encode(grad, residual*; threshold)      -> words f32[ceil(n/16)] (raw bits)
//   kvx_twobit_decode(words; threshold, shape)         -> out f32[shape]
//
// The *_decode_add ops have a status output because lib_api v11 rejects ops without
// outputs.
#include <limits>
#include <vector>

#include "kernels.h"
#include "op_util.h"

using namespace kvx_ops;

namespace {

// payload -> (out of the attribute shape, status).
template <kvx::DecodeFn kKernel, class ParamsT = ShapeParams>
struct DecodeOp : OpSpec {
  static constexpr const char* inputs[] = {"payload"};
  static constexpr int outputs = 2;
  using Params = ParamsT;
  static bool shape(const Params& p, const Shapes&, Shapes* out) {
    (*out)[0] = to_shape(p.shape);
    (*out)[1] = Shape{1};
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    set_status(out[1], kKernel(f32(in[0]), in[0].size(), out[0].size(), f32(out[0])));
  }
};

// (payload, acc*) -> status; acc += decoded.  Self names the op (for messages).
template <class Self, kvx::DecodeFn kKernel>
struct DecodeAddOp : OpSpec {
  static constexpr const char* inputs[] = {"payload", "acc"};
  static constexpr int outputs = 1;
  static constexpr bool updates_second = true;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = Shape{1};
    return nonempty(Self::name, in[1], "acc");
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    set_status(out[0], kKernel(f32(in[0]), in[0].size(), in[1].size(), f32(in[1])));
  }
};

// fp32 may give its size instead of a shape.
struct Fp32DecodeParams {
  std::vector<int64_t> shape;
  bool parse(const Attrs& attrs, std::string* error) {
    if (!check_keys(attrs, {"size", "shape"}, error)) return false;
    if (has(attrs, "size") == has(attrs, "shape")) {
      *error = "give exactly one of the attributes 'size' or 'shape'";
      return false;
    }
    if (has(attrs, "shape")) return get_shape(attrs, "shape", &shape, error);
    int64_t size = 0;
    if (!get_int(attrs, "size", 1, std::numeric_limits<unsigned int>::max(), &size, error))
      return false;
    shape = {size};
    return true;
  }
};

struct Fp32Decode : DecodeOp<kvx::fp32_decode, Fp32DecodeParams> {
  static constexpr const char* name = "kvx_fp32_decode";
};
struct Fp32DecodeAdd : DecodeAddOp<Fp32DecodeAdd, kvx::fp32_decode_add> {
  static constexpr const char* name = "kvx_fp32_decode_add";
};
struct TopkDecode : DecodeOp<kvx::topk_decode> {
  static constexpr const char* name = "kvx_topk_decode";
};
struct TopkDecodeAdd : DecodeAddOp<TopkDecodeAdd, kvx::topk_decode_add> {
  static constexpr const char* name = "kvx_topk_decode_add";
};
struct TernaryDecode : DecodeOp<kvx::ternary_decode> {
  static constexpr const char* name = "kvx_ternary_decode";
};
struct TernaryDecodeAdd : DecodeAddOp<TernaryDecodeAdd, kvx::ternary_decode_add> {
  static constexpr const char* name = "kvx_ternary_decode_add";
};

struct AdacompDecode : DecodeOp<kvx::adacomp_decode> {
  static constexpr const char* name = "kvx_adacomp_decode";
};
struct AdacompDecodeAdd : DecodeAddOp<AdacompDecodeAdd, kvx::adacomp_decode_add> {
  static constexpr const char* name = "kvx_adacomp_decode_add";
};

struct ElementTopkDecode : DecodeOp<kvx::element_topk_decode> {
  static constexpr const char* name = "kvx_element_topk_decode";
};
struct ElementTopkDecodeAdd : DecodeAddOp<ElementTopkDecodeAdd, kvx::element_topk_decode_add> {
  static constexpr const char* name = "kvx_element_topk_decode_add";
};

struct OuterDecode : DecodeOp<kvx::outer_decode> {
  static constexpr const char* name = "kvx_outer_decode";
};
struct OuterDecodeAdd : DecodeAddOp<OuterDecodeAdd, kvx::outer_decode_add> {
  static constexpr const char* name = "kvx_outer_decode_add";
};

struct FilterScores : OpSpec {
  static constexpr const char* name = "kvx_filter_scores";
  static constexpr const char* inputs[] = {"x"};
  static constexpr int outputs = 1;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    if (!nonempty(name, in[0], "x")) return false;
    (*out)[0] = Shape{in[0][0]};
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    write_filter_scores(in[0], out[0], [&](int64_t filters, int64_t size, double* scores) {
      kvx::filter_scores(f32(in[0]), filters, size, scores);
    });
  }
};

// ---- MXNet's 2-bit layout: the float32 words only carry the raw 32-bit patterns --------

// MXNet's 2-bit compression requires threshold > 0; so do we.
struct TwoBitParams {
  double threshold = 0.0;
  std::vector<int64_t> shape;  // decode only
  bool parse_threshold(const Attrs& attrs, std::string* error) {
    return get_real(attrs, "threshold", 0.0, true, true, 0.0, &threshold, error);
  }
};
struct TwoBitEncodeParams : TwoBitParams {
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"threshold"}, error) && parse_threshold(attrs, error);
  }
};
struct TwoBitDecodeParams : TwoBitParams {
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"threshold", "shape"}, error) && parse_threshold(attrs, error) &&
           get_shape(attrs, "shape", &shape, error);
  }
};

struct TwoBitEncode : OpSpec {
  static constexpr const char* name = "kvx_twobit_encode";
  static constexpr const char* inputs[] = {"grad", "residual"};
  static constexpr int outputs = 1;
  static constexpr bool updates_second = true;
  using Params = TwoBitEncodeParams;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    return residual_shape(name, in) &&
           flat_shape(name, kvx::twobit_words(product(in[0])), &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    kvx::twobit_encode(f32(in[0]), f32(in[1]), in[0].size(), p.threshold,
                       out[0].data<uint32_t>());
  }
};

struct TwoBitDecode : OpSpec {
  static constexpr const char* name = "kvx_twobit_decode";
  static constexpr const char* inputs[] = {"words"};
  static constexpr int outputs = 1;
  using Params = TwoBitDecodeParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    const int64_t expected = kvx::twobit_words(product(p.shape));
    if (product(in[0]) != expected) {
      MX_ERROR_MSG << name << ": words " << shape_string(in[0]) << " must hold " << expected
                   << " elements for shape " << shape_string(to_shape(p.shape));
      return false;
    }
    (*out)[0] = to_shape(p.shape);
    return true;
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    kvx::twobit_decode(in[0].data<uint32_t>(), out[0].size(), p.threshold, f32(out[0]));
  }
};

}  // namespace

KVX_REGISTER_OP(Fp32Decode);
KVX_REGISTER_OP(Fp32DecodeAdd);
KVX_REGISTER_OP(TopkDecode);
KVX_REGISTER_OP(TopkDecodeAdd);
KVX_REGISTER_OP(TernaryDecode);
KVX_REGISTER_OP(TernaryDecodeAdd);
KVX_REGISTER_OP(AdacompDecode);
KVX_REGISTER_OP(AdacompDecodeAdd);
KVX_REGISTER_OP(ElementTopkDecode);
KVX_REGISTER_OP(ElementTopkDecodeAdd);
KVX_REGISTER_OP(OuterDecode);
KVX_REGISTER_OP(OuterDecodeAdd);
KVX_REGISTER_OP(FilterScores);
KVX_REGISTER_OP(TwoBitEncode);
KVX_REGISTER_OP(TwoBitDecode);
