// The operators every scheme shares: the finite check, the float32 payload, the
// servers' decode-and-sum, reading a Gather round's rows, and ordering a push after a
// pull.
//
//   kvx_finite_check(x)                                -> status (1 if a NaN/Inf)
//   kvx_fp32_encode(grad)                              -> payload f32[8+n], status f32[1]
//   kvx_codec_encode(grad, residual*; codec, a=0, b=0) -> payload f32[payload words], status
//                                  (any codec whose table row has an encoder)
//   kvx_decode_slots(slots f32[W, S]; size)            -> sum f32[size], status f32[W]
//   kvx_rows_dense(rows f32[R, C] (row_sparse or dense); size) -> out f32[size]
//   kvx_after(before, x*)  (any dtypes)                -> f32[1], zero; x is unchanged
//
// `*` marks an input updated in place (setMutateInputs); op_util.h says how an op is
// declared and what encoders and decoders do on bad input (set_encoded, void_sum).
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "kernels.h"
#include "op_util.h"

using namespace kvx_ops;

namespace {

struct FiniteCheck : OpSpec {
  static constexpr const char* name = "kvx_finite_check";
  static constexpr const char* inputs[] = {"x"};
  static constexpr int outputs = 1;
  static bool shape(const Params&, const Shapes&, Shapes* out) {
    (*out)[0] = Shape{1};
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    set_status(out[0], kvx::all_finite(f32(in[0]), in[0].size()) ? kvx::kOk : kvx::kNonFinite);
  }
};

struct Fp32Encode : OpSpec {
  static constexpr const char* name = "kvx_fp32_encode";
  static constexpr const char* inputs[] = {"grad"};
  static constexpr int outputs = 2;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[1] = Shape{1};
    return nonempty(name, in[0], "grad") &&
           flat_shape(name, kvx::fp32_payload_words(product(in[0])), &(*out)[0]);
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    set_encoded(out[0], out[1], kvx::fp32_encode(f32(in[0]), in[0].size(), f32(out[0])));
  }
};

// ---- any codec of the table with an encoder (codec_table.h, CodecSpec::encode) ----------

struct CodecEncodeParams {
  const kvx::CodecSpec* codec = nullptr;
  double a = 0.0, b = 0.0;
  bool parse(const Attrs& attrs, std::string* error) {
    int64_t id = 0;
    if (!check_keys(attrs, {"codec", "a", "b"}, error) ||
        !get_int(attrs, "codec", 1, kvx::kExactF32 - 1, &id, error))
      return false;
    codec = kvx::find_codec(static_cast<float>(id));
    if (codec == nullptr || codec->encode == nullptr) {
      *error = "codec " + std::to_string(id) + " has no encoder in the codec table";
      return false;
    }
    const double low = -std::numeric_limits<float>::max();
    return get_real(attrs, "a", low, false, false, 0.0, &a, error) &&
           get_real(attrs, "b", low, false, false, 0.0, &b, error);
  }
};

struct CodecEncode : Encoder {
  static constexpr const char* name = "kvx_codec_encode";
  using Params = CodecEncodeParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    if (!residual_shape(name, in)) return false;
    const int64_t words = p.codec->payload_words(product(in[0]), static_cast<float>(p.a),
                                                 static_cast<float>(p.b));
    if (words < kvx::kHeaderWords) {
      MX_ERROR_MSG << name << ": codec " << p.codec->name << " has no payload for a=" << p.a
                   << ", b=" << p.b << " and grad " << shape_string(in[0]);
      return false;
    }
    (*out)[1] = Shape{1};
    return flat_shape(name, words, &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    set_encoded(out[0], out[1],
                p.codec->encode(f32(in[0]), f32(in[1]), in[0].size(), static_cast<float>(p.a),
                                static_cast<float>(p.b), f32(out[0])));
  }
};

// ---- server-decode aggregation ----------------------------------------------------------

struct SizeParams {
  int64_t size = 0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"size"}, error) &&
           get_int(attrs, "size", 1, std::numeric_limits<unsigned int>::max(), &size, error);
  }
};

struct DecodeSlots : OpSpec {
  static constexpr const char* name = "kvx_decode_slots";
  static constexpr const char* inputs[] = {"slots"};
  static constexpr int outputs = 2;
  using Params = SizeParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    const Shape& slots = in[0];
    if (slots.size() != 2 || slots[0] < 1 || slots[1] < 1) {
      MX_ERROR_MSG << name << ": slots must be 2-D (workers, slot words), got "
                   << shape_string(slots);
      return false;
    }
    (*out)[0] = Shape{static_cast<unsigned int>(p.size)};
    (*out)[1] = Shape{slots[0]};
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    kvx::decode_slots(f32(in[0]), in[0].shape[0], in[0].shape[1], f32(out[0]), out[0].size(),
                      f32(out[1]));
  }
};

// kvx_rows_dense(rows; size): the first `size` values of a (rows x width) array read
// densely, in row-major order; rows a row_sparse input does not hold read as zeros.
// What a worker makes of a Gather round's pulled rows (kvstore_ext/transport/ps.py):
// MXNet's cast_storage zero-fills every row and then copies the ones held (two passes
// over the key, plus a copy of the slice taken after); this is one copy.
struct RowsDense : OpSpec {
  static constexpr const char* name = "kvx_rows_dense";
  static constexpr const char* inputs[] = {"rows"};
  static constexpr int outputs = 1;
  static constexpr bool sparse_input = true;
  using Params = SizeParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    const Shape& rows = in[0];
    if (rows.size() != 2 || p.size > static_cast<int64_t>(rows[0]) * rows[1]) {
      MX_ERROR_MSG << name << ": rows must be 2-D with at least size=" << p.size
                   << " values, got " << shape_string(rows);
      return false;
    }
    (*out)[0] = Shape{static_cast<unsigned int>(p.size)};
    return true;
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    float* dense = f32(out[0]);
    const int64_t width = in[0].shape[1];
    if (in[0].stype != mxnet::ext::kRowSparseStorage) {
      std::copy(f32(in[0]), f32(in[0]) + p.size, dense);
      return;
    }
    const auto* rows = static_cast<const mxnet::ext::MXSparse*>(in[0].data_ptr);
    const float* data = static_cast<const float*>(rows->data);
    // row_sparse rows are sorted and unique; anything else is read row by row over zeros
    bool sorted = true;
    for (int64_t i = 1; i < rows->indices_len; ++i)
      sorted = sorted && rows->indices[i] > rows->indices[i - 1];
    int64_t next = 0;  // values before it are written
    if (!sorted) {
      std::fill_n(dense, p.size, 0.0f);
      next = p.size;
    }
    for (int64_t i = 0; i < rows->indices_len; ++i) {
      const int64_t begin = rows->indices[i] * width;
      if (rows->indices[i] < 0 || begin >= p.size) continue;
      if (begin > next) std::fill_n(dense + next, begin - next, 0.0f);
      const int64_t count = std::min(width, p.size - begin);
      std::copy(data + i * width, data + i * width + count, dense + begin);
      next = std::max(next, begin + count);
    }
    if (next < p.size) std::fill_n(dense + next, p.size - next, 0.0f);
  }
};

// kvx_after(before, x*): does nothing, but declares that it writes x after reading
// `before`, so that MXNet's engine runs whatever reads x next (a push) after whatever
// writes `before` now (the pull of the key's previous round).  MXNet's dist_sync pushes
// a CPU array in place; a worker pushing a fresh array every step without reading its
// results would otherwise send step s+1 before step s's round closed, and the server
// would merge both into one round (kvstore_ext/transport/ps.py).
struct After : OpSpec {
  static constexpr const char* name = "kvx_after";
  static constexpr const char* inputs[] = {"before", "x"};
  static constexpr int outputs = 1;
  static constexpr bool updates_second = true;
  static constexpr bool any_dtype = true;
  static bool shape(const Params&, const Shapes&, Shapes* out) {
    (*out)[0] = Shape{1};
    return true;
  }
  static void forward(const Params&, Tensors&, Tensors& out) { set_status(out[0], kvx::kOk); }
};

}  // namespace

KVX_REGISTER_OP(CodecEncode);
KVX_REGISTER_OP(FiniteCheck);
KVX_REGISTER_OP(Fp32Encode);
KVX_REGISTER_OP(DecodeSlots);
KVX_REGISTER_OP(RowsDense);
KVX_REGISTER_OP(After);
