// AdaComp's MXNet operators (encode, the elements sent; the servers decode through the
// codec table).
//
//   kvx_adacomp_encode(grad, residual*; bin, capacity) -> payload f32[8+capacity*E], status
//                                  (E = 1 word an entry, 2 above 2^23 elements)
//   kvx_adacomp_sent(payload; n, capacity)             -> sent i64[capacity]: the elements
//                                  the payload sends, n for unused entries (DGC's masking)
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

// ---- AdaComp --------------------------------------------------------------------------

struct AdacompParams {
  int64_t bin = 0, capacity = 0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"bin", "capacity"}, error) &&
           get_int(attrs, "bin", 1, kvx::kExactF32, &bin, error) &&
           get_int(attrs, "capacity", 1, kvx::kExactF32, &capacity, error);
  }
};

// The payload is sized for `capacity` entries; the header's body length says how many
// were sent (the rest is zeros).
struct AdacompEncode : Encoder {
  static constexpr const char* name = "kvx_adacomp_encode";
  using Params = AdacompParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    if (!residual_shape(name, in) || !count_fits(name, "capacity", p.capacity, in[0]))
      return false;
    (*out)[1] = Shape{1};
    return flat_shape(name, kvx::adacomp_payload_words(product(in[0]), p.capacity),
                      &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    const int code = kvx::adacomp_encode(f32(in[0]), f32(in[1]), in[0].size(), p.bin,
                                         p.capacity, f32(out[0]));
    set_encoded(out[0], out[1], code);
  }
};

// kvx_adacomp_sent (op_util.h, SentElements): for kvstore_ext/codecs/adacomp.py's
// sent_rows.
struct AdacompPayload {
  static constexpr const char* sent_op = "kvx_adacomp_sent";
  static constexpr const char* count_attr = "capacity";
  static constexpr int64_t max_elements = kvx::kAdacompMaxElements;
  static int64_t payload_words(int64_t n, int64_t capacity) {
    return kvx::adacomp_payload_words(n, capacity);
  }
  static void sent(const float* payload, int64_t n, int64_t capacity, int64_t* out) {
    kvx::adacomp_sent(payload, n, capacity, out);
  }
};
using AdacompSent = SentElements<AdacompPayload>;

}  // namespace

KVX_REGISTER_OP(AdacompEncode);
KVX_REGISTER_OP(AdacompSent);
