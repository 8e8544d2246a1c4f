// The ternary family's MXNet operators: server-decoded (header) and homomorphic
// (codes summed by the stock server) ternary.
//
//   kvx_ternary_encode(grad, residual*; scale=1, threshold=0, value_rule=0)
//                                                      -> payload f32[8+ceil(n/15)], status
//   kvx_ternary_encode_sum(grad, residual*; threshold, num_workers, value=0)
//                                                      -> words f32[ceil(n/D)], status
//   kvx_ternary_decode_sum(words f32; threshold, num_workers, shape)
//                                                      -> out f32[shape], status
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

// ---- ternary --------------------------------------------------------------------------

struct TernaryParams {
  double scale = 1.0, threshold = 0.0;
  int64_t value_rule = kvx::kValueThreshold;  // kvx::TernaryValueRule
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"scale", "threshold", "value_rule"}, error) &&
           get_real(attrs, "scale", 0.0, false, false, 1.0, &scale, error) &&
           get_real(attrs, "threshold", 0.0, false, false, 0.0, &threshold, error) &&
           (!has(attrs, "value_rule") ||
            (get_int(attrs, "value_rule", kvx::kValueThreshold, kvx::kValueRound, &value_rule,
                     error) &&
             known_rule(error)));
  }
  // kvx::TernaryValueRule: 0 (t) or 2 (2t); 1 was a former rule and is refused
  bool known_rule(std::string* error) const {
    if (value_rule == kvx::kValueThreshold || value_rule == kvx::kValueRound) return true;
    *error = "attribute value_rule='" + std::to_string(value_rule) +
             "' must be 0 (a code stands for t) or 2 (2t)";
    return false;
  }
};

struct TernaryEncode : Encoder {
  static constexpr const char* name = "kvx_ternary_encode";
  using Params = TernaryParams;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[1] = Shape{1};
    return residual_shape(name, in) &&
           flat_shape(name, kvx::ternary_payload_words(product(in[0])), &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    const int code = kvx::ternary_encode(f32(in[0]), f32(in[1]), in[0].size(), p.scale,
                                         p.threshold, f32(out[0]),
                                         static_cast<int>(p.value_rule));
    set_encoded(out[0], out[1], code);
  }
};

// Homomorphic ternary: threshold and num_workers are agreed by all workers.
struct SumParams {
  double threshold = 0.0, value = 0.0;  // value > 0: what a code stands for
  int64_t num_workers = 0;
  std::vector<int64_t> shape;  // decode only
  bool parse_common(const Attrs& attrs, std::string* error) {
    return get_real(attrs, "threshold", 0.0, false, true, 0.0, &threshold, error) &&
           get_int(attrs, "num_workers", 1, kvx::kMaxWorkers, &num_workers, error);
  }
};

struct SumEncodeParams : SumParams {
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"threshold", "num_workers", "value"}, error) &&
           parse_common(attrs, error) &&
           get_real(attrs, "value", 0.0, false, false, 0.0, &value, error);
  }
};

struct SumDecodeParams : SumParams {
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"threshold", "num_workers", "shape"}, error) &&
           parse_common(attrs, error) && get_shape(attrs, "shape", &shape, error);
  }
};

struct TernaryEncodeSum : Encoder {
  static constexpr const char* name = "kvx_ternary_encode_sum";
  using Params = SumEncodeParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    (*out)[1] = Shape{1};
    return residual_shape(name, in) &&
           flat_shape(name, kvx::ternary_sum_words(product(in[0]), p.num_workers), &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    set_encoded(out[0], out[1],
                kvx::ternary_encode_sum(f32(in[0]), f32(in[1]), in[0].size(), p.threshold,
                                        p.num_workers, f32(out[0]), p.value));
  }
};

// A void sum (first word NaN) gives NaN and status kVoid (op_util.h, void_sum); any other
// word that is not an integer in [0, base^D) gives zeros and status kBadWord.
struct TernaryDecodeSum : OpSpec {
  static constexpr const char* name = "kvx_ternary_decode_sum";
  static constexpr const char* inputs[] = {"words"};
  static constexpr int outputs = 2;
  using Params = SumDecodeParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    const int64_t expected = kvx::ternary_sum_words(product(p.shape), p.num_workers);
    if (product(in[0]) != expected) {
      MX_ERROR_MSG << name << ": words " << shape_string(in[0]) << " must hold " << expected
                   << " elements for shape " << shape_string(to_shape(p.shape))
                   << " and num_workers=" << p.num_workers;
      return false;
    }
    (*out)[0] = to_shape(p.shape);
    (*out)[1] = Shape{1};
    return true;
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    if (void_sum(in[0], out[0], out[1])) return;
    set_status(out[1], kvx::ternary_decode_sum(f32(in[0]), in[0].size(), p.threshold,
                                               p.num_workers, out[0].size(), f32(out[0])));
  }
};

}  // namespace

KVX_REGISTER_OP(TernaryEncode);
KVX_REGISTER_OP(TernaryEncodeSum);
KVX_REGISTER_OP(TernaryDecodeSum);
