// The top-k family's MXNet operators: filter top-k (Hylo's conv layers, server-decoded
// or homomorphic: gather the agreed filters, scatter their sum) and element top-k.
//
//   kvx_topk_encode(grad, residual*; k)                -> payload f32[8+k+k*F], status
//   kvx_topk_gather(grad, residual*, indices f32[k])   -> values f32[k*F], status
//   kvx_topk_scatter(values, indices; shape)           -> out f32[shape], status
//   kvx_element_topk_encode(grad, residual*; k)        -> payload f32[8+k*E], status
//                                  (E = 2 words an entry, 3 above 2^24 elements)
//   kvx_element_topk_sent(payload; n, k)               -> sent i64[k]: the elements the
//                                  payload sends (n: none), for DGC's masking
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

// ---- top-k ----------------------------------------------------------------------------

struct TopkParams {
  int64_t k = 0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"k"}, error) && get_int(attrs, "k", 1, kvx::kExactF32, &k, error);
  }
};

struct TopkEncode : Encoder {
  static constexpr const char* name = "kvx_topk_encode";
  using Params = TopkParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    if (!residual_shape(name, in)) return false;
    int64_t filters, filter_size;
    filters_of(in[0], &filters, &filter_size);
    if (p.k > filters) {
      MX_ERROR_MSG << name << ": k=" << p.k << " exceeds the " << filters
                   << " filters (shape[0]) of grad " << shape_string(in[0]);
      return false;
    }
    (*out)[1] = Shape{1};
    return flat_shape(name, kvx::topk_payload_words(p.k, filter_size), &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    int64_t filters, filter_size;
    filters_of(in[0].shape, &filters, &filter_size);
    const int code = kvx::topk_encode(f32(in[0]), f32(in[1]), filters, filter_size, p.k,
                                      f32(out[0]));
    set_encoded(out[0], out[1], code);
  }
};

struct TopkGather : OpSpec {
  static constexpr const char* name = "kvx_topk_gather";
  static constexpr const char* inputs[] = {"grad", "residual", "indices"};
  static constexpr int outputs = 2;
  static constexpr bool updates_second = true;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    if (!residual_shape(name, in) || !nonempty(name, in[2], "indices")) return false;
    int64_t filters, filter_size;
    filters_of(in[0], &filters, &filter_size);
    const int64_t k = product(in[2]);
    if (k > filters) {
      MX_ERROR_MSG << name << ": " << k << " indices for " << filters
                   << " filters (shape[0]) of grad " << shape_string(in[0]);
      return false;
    }
    (*out)[1] = Shape{1};
    return flat_shape(name, k * filter_size, &(*out)[0]);
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    int64_t filters, filter_size;
    filters_of(in[0].shape, &filters, &filter_size);
    set_encoded(out[0], out[1], kvx::topk_gather(f32(in[0]), f32(in[1]), filters,
                                                 filter_size, f32(in[2]), in[2].size(),
                                                 f32(out[0])));
  }
};

// A void sum of values (first word NaN) gives NaN and status kVoid (op_util.h, void_sum);
// invalid indices give zeros and status kBadIndex.
struct TopkScatter : OpSpec {
  static constexpr const char* name = "kvx_topk_scatter";
  static constexpr const char* inputs[] = {"values", "indices"};
  static constexpr int outputs = 2;
  using Params = ShapeParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    if (!nonempty(name, in[1], "indices")) return false;
    int64_t filters, filter_size;
    filters_of(p.shape, &filters, &filter_size);
    const int64_t k = product(in[1]);
    if (k > filters || product(in[0]) != k * filter_size) {
      MX_ERROR_MSG << name << ": values " << shape_string(in[0]) << " and indices "
                   << shape_string(in[1]) << " do not describe k <= " << filters
                   << " filters of " << filter_size << " elements of shape "
                   << shape_string(to_shape(p.shape));
      return false;
    }
    (*out)[0] = to_shape(p.shape);
    (*out)[1] = Shape{1};
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    if (void_sum(in[0], out[0], out[1])) return;
    int64_t filters, filter_size;
    filters_of(out[0].shape, &filters, &filter_size);
    set_status(out[1], kvx::topk_scatter(f32(in[0]), f32(in[1]), in[1].size(), filters,
                                         filter_size, f32(out[0])));
  }
};

// ---- element top-k ------------------------------------------------------------------------

struct ElementTopkEncode : Encoder {
  static constexpr const char* name = "kvx_element_topk_encode";
  using Params = TopkParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    if (!residual_shape(name, in) || !count_fits(name, "k", p.k, in[0])) return false;
    (*out)[1] = Shape{1};
    return flat_shape(name, kvx::element_topk_payload_words(product(in[0]), p.k),
                      &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    const int code = kvx::element_topk_encode(f32(in[0]), f32(in[1]), in[0].size(), p.k,
                                              f32(out[0]));
    set_encoded(out[0], out[1], code);
  }
};

// kvx_element_topk_sent (op_util.h, SentElements): for kvstore_ext/codecs/element_topk.py's
// sent_rows.
struct ElementTopkPayload {
  static constexpr const char* sent_op = "kvx_element_topk_sent";
  static constexpr const char* count_attr = "k";
  static constexpr int64_t max_elements = kvx::kElementTopkMaxElements;
  static int64_t payload_words(int64_t n, int64_t k) {
    return kvx::element_topk_payload_words(n, k);
  }
  static void sent(const float* payload, int64_t n, int64_t k, int64_t* out) {
    kvx::element_topk_sent(payload, n, k, out);
  }
};
using ElementTopkSent = SentElements<ElementTopkPayload>;

}  // namespace

KVX_REGISTER_OP(TopkEncode);
KVX_REGISTER_OP(TopkGather);
KVX_REGISTER_OP(TopkScatter);
KVX_REGISTER_OP(ElementTopkEncode);
KVX_REGISTER_OP(ElementTopkSent);
