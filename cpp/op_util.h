// What every MXNet operator of the plugin shares (lib_api v11): attribute parsing, dtype
// and shape checks, and OpSpec, the template that turns one small struct per op into
// lib_api's four callbacks.  An op is declared as
//
//   struct MyOp : OpSpec {
//     static constexpr const char* name = "kvx_my_op";
//     static constexpr const char* inputs[] = {"grad", "residual"};   // input_dtype
//     static constexpr int outputs = 2;      // float32 (the first: first_output_dtype)
//     static constexpr bool updates_second = true;    // input 1 updated in place
//     using Params = MyParams;                        // parse(attrs, &error); NoParams
//     static bool shape(const Params&, const Shapes& in, Shapes* out);
//     static void forward(const Params&, Tensors& in, Tensors& out);
//   };
//   KVX_REGISTER_OP(MyOp);
//
// Invalid attributes, dtypes or shapes are programming errors and fail the call
// (MXNetError in Python) with a message naming the op and the culprit; shape() reports
// its own errors with MX_ERROR_MSG.  Every op has at least one output: lib_api v11
// rejects ops without outputs (storage-type inference fails).
#ifndef KVX_OP_UTIL_H_
#define KVX_OP_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "mxnet/lib_api.h"
#include "wire.h"

namespace kvx_ops {

using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;

using Attrs = std::unordered_map<std::string, std::string>;
using Shape = std::vector<unsigned int>;
using Shapes = std::vector<Shape>;
using Tensors = std::vector<MXTensor>;

std::string shape_string(const Shape& shape);

// ---- attributes: strings (Python's str() of each keyword argument) ------------------
//
// Every getter returns false and fills `error` on bad input.

// Rejects unknown keys (typos would otherwise be silently ignored); "__" keys are
// MXNet's own.
bool check_keys(const Attrs& attrs, const std::vector<const char*>& allowed,
                std::string* error);
bool has(const Attrs& attrs, const char* key);
bool get_int(const Attrs& attrs, const char* key, int64_t lo, int64_t hi, int64_t* value,
             std::string* error);
// A finite real >= lo (or > lo when strict); `fallback` when absent and not required.
bool get_real(const Attrs& attrs, const char* key, double lo, bool strict, bool required,
              double fallback, double* value, std::string* error);
// "(64, 32, 5, 5)", "(10,)", "[3, 4]" or "7"; every dimension a positive integer.
bool get_shape(const Attrs& attrs, const char* key, std::vector<int64_t>* shape,
               std::string* error);

struct NoParams {
  bool parse(const Attrs& attrs, std::string* error) { return check_keys(attrs, {}, error); }
};

struct ShapeParams {
  std::vector<int64_t> shape;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"shape"}, error) && get_shape(attrs, "shape", &shape, error);
  }
};

// ---- shapes -------------------------------------------------------------------------

int64_t product(const std::vector<int64_t>& shape);
int64_t product(const Shape& shape);
Shape to_shape(const std::vector<int64_t>& dims);
// 1-D output shape of `words` elements, checked against lib_api's 32-bit dimensions.
bool flat_shape(const char* op, int64_t words, Shape* shape);
bool same_shape(const char* op, const Shapes& in, size_t a, const char* name_a, size_t b,
                const char* name_b);
bool nonempty(const char* op, const Shape& shape, const char* name);
// (grad, residual): float32 of the same non-empty shape.
bool residual_shape(const char* op, const Shapes& in);
// Rows (shape[0]) and row length of a tensor seen as filters x filter_size.
template <class Dims>
void filters_of(const Dims& shape, int64_t* filters, int64_t* filter_size) {
  *filters = shape[0];
  *filter_size = product(shape) / shape[0];
}

// ---- forward helpers ----------------------------------------------------------------

inline float* f32(MXTensor& t) { return t.data<float>(); }
inline void set_status(MXTensor& out, int status) { f32(out)[0] = static_cast<float>(status); }
// A per-filter statistic of `x` seen as filters x filter_size (filters_of): `score(filters,
// filter_size, double* scores)` computes it in double, and `out` (f32[filters]) gets it
// rounded to float32.  The filter-score ops (kvx_acc_filter_scores, kvx_filter_scores)
// differ only in `score`.
template <class Score>
void write_filter_scores(const MXTensor& x, MXTensor& out, Score score) {
  int64_t filters, filter_size;
  filters_of(x.shape, &filters, &filter_size);
  std::vector<double> scores(static_cast<size_t>(filters));
  score(filters, filter_size, scores.data());
  float* result = f32(out);
  for (int64_t o = 0; o < filters; ++o) result[o] = static_cast<float>(scores[o]);
}
// The outputs of an encoder whose payload starts with a header: the status, and on any
// failure a void payload (first word NaN; the kernel zeroed the rest), which the servers'
// decode_slots read as kVoid.  So a worker may push a payload before it reads the status
// (kvstore_ext/store.py, deferred checks): a bad gradient voids the sum on every worker
// instead of adding zeros to it.
inline void set_encoded(MXTensor& payload, MXTensor& status, int code) {
  set_status(status, code);
  if (code != 0 && payload.size() > 0)
    f32(payload)[0] = std::numeric_limits<float>::quiet_NaN();
}

// A decoder of a summed additive payload (homomorphic Sum rounds): a sum whose first word
// is NaN had a void contribution (an encoder that failed wrote one: set_encoded), so the
// step is void on every worker: the output is NaN everywhere and the status kVoid.  So a
// worker may decode a sum before it reads the sum's first word (kvstore_ext/codecs/
// agreed.py, deferred checks).  Returns true if the sum was void.
inline bool void_sum(MXTensor& summed, MXTensor& out, MXTensor& status) {
  if (summed.size() == 0 || !std::isnan(f32(summed)[0])) return false;
  std::fill(f32(out), f32(out) + out.size(), std::numeric_limits<float>::quiet_NaN());
  set_status(status, kvx::kVoid);
  return true;
}

// Every one of the first `count` inputs has `dtype` (the op's input_dtype).
bool check_dtypes(const char* op, const std::vector<int>& types, const char* const* names,
                  size_t count, int dtype);
// Forward-time re-check (inferType ran already; this guards direct misuse).
bool forward_dtypes(const char* op, const Tensors& tensors, size_t count, int dtype);
MXReturnValue fail(const char* op, const std::string& message);

// ---- one struct per op --------------------------------------------------------------

struct OpSpec {
  static constexpr bool updates_second = false;
  static constexpr bool sparse_input = false;  // inputs may be row_sparse (kvx_rows_dense)
  static constexpr bool any_dtype = false;     // inputs of any dtype (kvx_after reads none)
  // float32 but for the float16 ops (cpp/ops/fp16.cc)
  static constexpr int input_dtype = mxnet::ext::kFloat32;         // every input's
  static constexpr int first_output_dtype = mxnet::ext::kFloat32;  // the others: float32
  using Params = NoParams;
};

template <class S>
struct Op {
  static constexpr size_t kInputs = sizeof(S::inputs) / sizeof(S::inputs[0]);

  static bool parse_params(const Attrs& attrs, typename S::Params* p) {
    std::string error;
    if (p->parse(attrs, &error)) return true;
    MX_ERROR_MSG << S::name << ": " << error;
    return false;
  }
  static MXReturnValue parse(const Attrs& attrs, int* num_in, int* num_out) {
    typename S::Params p;
    if (!parse_params(attrs, &p)) return MX_FAIL;
    *num_in = static_cast<int>(kInputs);
    *num_out = S::outputs;
    return MX_SUCCESS;
  }
  static MXReturnValue type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
    if (!S::any_dtype && !check_dtypes(S::name, *in, S::inputs, kInputs, S::input_dtype))
      return MX_FAIL;
    for (int& t : *out) t = mxnet::ext::kFloat32;
    (*out)[0] = S::first_output_dtype;
    return MX_SUCCESS;
  }
  static MXReturnValue shape(const Attrs& attrs, Shapes* in, Shapes* out) {
    typename S::Params p;
    return parse_params(attrs, &p) && S::shape(p, *in, out) ? MX_SUCCESS : MX_FAIL;
  }
  // A C++ exception (std::bad_alloc of a kernel's scratch) becomes an MXNet error
  // instead of unwinding through the C boundary.
  static MXReturnValue forward(const Attrs& attrs, Tensors* in, Tensors* out,
                               const mxnet::ext::OpResource&) {
    try {
      typename S::Params p;
      if (!parse_params(attrs, &p) ||
          (!S::any_dtype && !forward_dtypes(S::name, *in, kInputs, S::input_dtype)))
        return MX_FAIL;
      S::forward(p, *in, *out);
      return MX_SUCCESS;
    } catch (const std::exception& e) {
      return fail(S::name, std::string("internal error: ") + e.what());
    } catch (...) {
      return fail(S::name, "internal error");
    }
  }
  static MXReturnValue mutate_second(const Attrs&, std::vector<int>* indices) {
    indices->push_back(1);
    return MX_SUCCESS;
  }
  // Inputs keep their storage (the op reads row_sparse itself); outputs are dense.
  static MXReturnValue storage(const Attrs&, std::vector<int>*, std::vector<int>* out) {
    for (int& t : *out) t = mxnet::ext::kDefaultStorage;
    return MX_SUCCESS;
  }
  static mxnet::ext::CustomOp& define() {
    auto& op = mxnet::ext::Registry<mxnet::ext::CustomOp>::get()->add(S::name);
    op.setParseAttrs(parse).setInferType(type).setInferShape(shape).setForward(forward, "cpu");
    if (S::updates_second) op.setMutateInputs(mutate_second);
    if (S::sparse_input) op.setInferSType(storage);
    return op;
  }
};

// An encoder of acc = grad + residual: outputs (payload, status), the residual updated
// in place.
struct Encoder : OpSpec {
  static constexpr const char* inputs[] = {"grad", "residual"};
  static constexpr int outputs = 2;
  static constexpr bool updates_second = true;
};

// The count attribute `attr` (k, capacity) of an op on grad fits its n elements.
inline bool count_fits(const char* op, const char* attr, int64_t count, const Shape& grad) {
  const int64_t n = product(grad);
  if (count <= n) return true;
  MX_ERROR_MSG << op << ": " << attr << "=" << count << " exceeds the " << n
               << " elements of grad " << shape_string(grad);
  return false;
}

// The elements a worker's own sparse payload sent (kvx_element_topk_sent,
// kvx_adacomp_sent), for DGC's masking (kvstore_ext/codecs/momentum.py): one op, where
// reading the entries with MXNet's operators costs five to nine of them a chunk, each with
// its Python.  `Payload` names the op and its count attribute and gives the payload's
// size, the largest n its indices reach, and the kernel.
template <class Payload>
struct SentElements : OpSpec {
  static constexpr const char* name = Payload::sent_op;
  static constexpr const char* inputs[] = {"payload"};
  static constexpr int outputs = 1;
  static constexpr int first_output_dtype = mxnet::ext::kInt64;
  struct Params {
    int64_t n = 0, count = 0;
    bool parse(const Attrs& attrs, std::string* error) {
      return check_keys(attrs, {"n", Payload::count_attr}, error) &&
             get_int(attrs, "n", 1, Payload::max_elements, &n, error) &&
             get_int(attrs, Payload::count_attr, 1, kvx::kExactF32, &count, error);
    }
  };
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    if (p.count > p.n || product(in[0]) != Payload::payload_words(p.n, p.count)) {
      MX_ERROR_MSG << name << ": payload " << shape_string(in[0]) << " is not the payload "
                   << "of " << Payload::count_attr << "=" << p.count << " of n=" << p.n
                   << " elements";
      return false;
    }
    (*out)[0] = Shape{static_cast<unsigned int>(p.count)};
    return true;
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    Payload::sent(f32(in[0]), p.n, p.count, out[0].data<int64_t>());
  }
};

}  // namespace kvx_ops

#define KVX_REGISTER_OP(Spec) \
  [[maybe_unused]] static const auto& kvx_registered_##Spec = kvx_ops::Op<Spec>::define()

#endif  // KVX_OP_UTIL_H_
