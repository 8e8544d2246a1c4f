// MXNet operators of kvstore_ext, registered through lib_api (MXNet >= 1.7, lib_api v11).
//
// Load with mx.library.load(path); each op then exists as mx.nd.<name>.  Every op is a
// thin shell around one kernel of kernels.h: parse and validate the attributes, check
// dtypes and shapes, run the kernel on the contiguous NDArray memory, report the status.
//
//   kvx_fp32_encode(grad)                              -> payload f32[8+n], status f32[1]
//   kvx_fp32_decode(payload; size | shape)             -> out f32[size], status
//   kvx_decode_slots(slots f32[W, S]; size)            -> sum f32[size], status f32[W]
//   kvx_fp32_decode_add(payload, acc*)                 -> status       (acc += decoded)
//   kvx_finite_check(x)                                -> status (1 if a NaN/Inf)
//   kvx_topk_encode(grad, residual*; k)                -> payload f32[8+k+k*F], status
//   kvx_topk_decode(payload; shape)                    -> out f32[shape], status
//   kvx_topk_decode_add(payload, acc*)                 -> status
//   kvx_filter_scores(x)                               -> scores f32[O]
//   kvx_acc_filter_scores(grad, residual)              -> scores f32[O] of grad + residual
//   kvx_acc_abs_sum(grad, residual)                    -> sum |grad + residual| f32[1]
//   kvx_topk_gather(grad, residual*, indices f32[k])   -> values f32[k*F], status
//   kvx_topk_scatter(values, indices; shape)           -> out f32[shape], status
//   kvx_ternary_encode(grad, residual*; scale=1, threshold=0)
//                                                      -> payload f32[8+ceil(n/15)], status
//   kvx_ternary_decode(payload; shape)                 -> out f32[shape], status
//   kvx_ternary_decode_add(payload, acc*)              -> status
//   kvx_ternary_encode_sum(grad, residual*; threshold, num_workers)
//                                                      -> words f32[ceil(n/D)], status
//   kvx_ternary_decode_sum(words f32; threshold, num_workers, shape)
//                                                      -> out f32[shape], status
//   kvx_twobit_encode(grad, residual*; threshold)      -> words f32[ceil(n/16)] (raw bits)
//   kvx_twobit_decode(words; threshold, shape)         -> out f32[shape]
//
// `*` marks an input updated in place (setMutateInputs).  O = shape[0] of the tensor,
// F = size / O.  Status values are those of python/kvx_ref/wire.py, as float32.  Inputs
// of any rank are read as flat arrays.  Every op has at least one output: lib_api v11
// rejects ops without outputs (storage-type inference fails), hence the status outputs
// of the *_decode_add ops.
//
// Decoders never fail on a malformed payload: they return zeros (or leave acc untouched)
// and a non-zero status, so that a server cannot be brought down by what it receives.
// Invalid attributes, dtypes or shapes are programming errors and fail the call
// (MXNetError in Python) with a message naming the op and the culprit.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "mxnet/lib_api.h"
#include "kernels.h"

using mxnet::ext::MXContext;
using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::OpResource;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
using mxnet::ext::kFloat32;

namespace {

using Attrs = std::unordered_map<std::string, std::string>;
using Shape = std::vector<unsigned int>;
using Shapes = std::vector<Shape>;

// ---- messages -------------------------------------------------------------------------

MXReturnValue fail(const char* op, const std::string& message) {
  MX_ERROR_MSG << op << ": " << message;
  return MX_FAIL;
}

const char* dtype_name(int dtype) {
  switch (dtype) {
    case mxnet::ext::kFloat32: return "float32";
    case mxnet::ext::kFloat64: return "float64";
    case mxnet::ext::kFloat16: return "float16";
    case mxnet::ext::kUint8: return "uint8";
    case mxnet::ext::kInt32: return "int32";
    case mxnet::ext::kInt8: return "int8";
    case mxnet::ext::kInt64: return "int64";
    default: return "unknown dtype";
  }
}

std::string shape_string(const Shape& shape) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << (shape.size() == 1 ? ",)" : ")");
  return s.str();
}

// ---- attribute parsing ----------------------------------------------------------------
//
// Attributes arrive as strings (Python's str() of each keyword argument).  Every parser
// returns false and fills `error` on bad input.

std::string trim(const std::string& s) {
  const char* space = " \t\n\r";
  const size_t begin = s.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(space) - begin + 1);
}

bool parse_int(const std::string& text, int64_t* value) {
  const std::string s = trim(text);
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *value = v;
  return true;
}

bool parse_real(const std::string& text, double* value) {
  const std::string s = trim(text);
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno == ERANGE || *end != '\0' || !std::isfinite(v)) return false;
  *value = v;
  return true;
}

// "(64, 32, 5, 5)", "(10,)", "[3, 4]" or "7"; every dimension a positive integer.
bool parse_shape(const std::string& text, std::vector<int64_t>* shape) {
  std::string s = trim(text);
  if (s.size() >= 2 && ((s.front() == '(' && s.back() == ')') ||
                        (s.front() == '[' && s.back() == ']')))
    s = s.substr(1, s.size() - 2);
  shape->clear();
  std::stringstream parts(s);
  std::string part;
  bool trailing_comma = false;
  while (std::getline(parts, part, ',')) {
    part = trim(part);
    if (part.size() > 1 && (part.back() == 'L' || part.back() == 'l')) part.pop_back();
    if (part.empty()) {
      if (trailing_comma || parts.peek() != EOF) return false;  // only "(n,)" may end so
      trailing_comma = true;
      continue;
    }
    int64_t dim = 0;
    if (trailing_comma || !parse_int(part, &dim) || dim < 1 ||
        dim > std::numeric_limits<unsigned int>::max())
      return false;
    shape->push_back(dim);
  }
  if (shape->empty()) return false;
  int64_t size = 1;
  for (int64_t dim : *shape) {
    if (size > (int64_t{1} << 48) / dim) return false;  // also bounds the wire's count
    size *= dim;
  }
  return true;
}

// Rejects unknown keys (typos would otherwise be silently ignored).  Keys starting with
// "__" are MXNet's own (e.g. __ext_shape__ in graphs) and are skipped.
bool check_keys(const Attrs& attrs, const std::vector<const char*>& allowed,
                std::string* error) {
  for (const auto& kv : attrs) {
    if (kv.first.compare(0, 2, "__") == 0) continue;
    bool known = false;
    for (const char* key : allowed) known = known || kv.first == key;
    if (!known) {
      std::ostringstream s;
      s << "unknown attribute '" << kv.first << "' (accepted:";
      if (allowed.empty()) s << " none";
      for (const char* key : allowed) s << " " << key;
      s << ")";
      *error = s.str();
      return false;
    }
  }
  return true;
}

const std::string* find(const Attrs& attrs, const char* key) {
  const auto it = attrs.find(key);
  return it == attrs.end() ? nullptr : &it->second;
}

bool get_int(const Attrs& attrs, const char* key, int64_t lo, int64_t hi, int64_t* value,
             std::string* error) {
  const std::string* text = find(attrs, key);
  if (text == nullptr) {
    *error = std::string("missing attribute '") + key + "'";
    return false;
  }
  if (!parse_int(*text, value) || *value < lo || *value > hi) {
    std::ostringstream s;
    s << "attribute " << key << "='" << *text << "' must be an integer in [" << lo << ", "
      << hi << "]";
    *error = s.str();
    return false;
  }
  return true;
}

// A finite real >= lo (or > lo when strict); `fallback` when absent and not required.
bool get_real(const Attrs& attrs, const char* key, double lo, bool strict, bool required,
              double fallback, double* value, std::string* error) {
  const std::string* text = find(attrs, key);
  if (text == nullptr) {
    if (required) {
      *error = std::string("missing attribute '") + key + "'";
      return false;
    }
    *value = fallback;
    return true;
  }
  if (!parse_real(*text, value) || (strict ? !(*value > lo) : !(*value >= lo))) {
    std::ostringstream s;
    s << "attribute " << key << "='" << *text << "' must be a finite number "
      << (strict ? "> " : ">= ") << lo;
    *error = s.str();
    return false;
  }
  return true;
}

bool get_shape(const Attrs& attrs, const char* key, std::vector<int64_t>* shape,
               std::string* error) {
  const std::string* text = find(attrs, key);
  if (text == nullptr) {
    *error = std::string("missing attribute '") + key + "'";
    return false;
  }
  if (!parse_shape(*text, shape)) {
    *error = std::string("attribute ") + key + "='" + *text +
             "' must be a shape of positive integers such as (64, 32, 5, 5)";
    return false;
  }
  return true;
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t product(const Shape& shape) {
  int64_t n = 1;
  for (unsigned int d : shape) n *= d;
  return n;
}

Shape to_shape(const std::vector<int64_t>& dims) {
  return Shape(dims.begin(), dims.end());
}

// 1-D output shape of `words` elements, checked against lib_api's 32-bit dimensions.
bool flat_shape(const char* op, int64_t words, Shape* shape) {
  if (words < 1 || words > std::numeric_limits<unsigned int>::max()) {
    MX_ERROR_MSG << op << ": output of " << words << " elements is out of range";
    return false;
  }
  *shape = Shape{static_cast<unsigned int>(words)};
  return true;
}

// ---- parameters of each op ------------------------------------------------------------
//
// One struct per attribute set, parsed the same way in parseAttrs, inferShape and
// forward (parsing is cheap next to the kernels).

struct NoParams {
  bool parse(const Attrs& attrs, std::string* error) { return check_keys(attrs, {}, error); }
};

struct Fp32DecodeParams {
  std::vector<int64_t> shape;
  bool parse(const Attrs& attrs, std::string* error) {
    if (!check_keys(attrs, {"size", "shape"}, error)) return false;
    const bool has_size = find(attrs, "size") != nullptr;
    const bool has_shape = find(attrs, "shape") != nullptr;
    if (has_size == has_shape) {
      *error = "give exactly one of the attributes 'size' or 'shape'";
      return false;
    }
    if (has_shape) return get_shape(attrs, "shape", &shape, error);
    int64_t size = 0;
    if (!get_int(attrs, "size", 1, std::numeric_limits<unsigned int>::max(), &size, error))
      return false;
    shape = {size};
    return true;
  }
};

struct ShapeParams {
  std::vector<int64_t> shape;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"shape"}, error) && get_shape(attrs, "shape", &shape, error);
  }
};

struct TopkParams {
  int64_t k = 0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"k"}, error) &&
           get_int(attrs, "k", 1, kvx::kExactF32, &k, error);
  }
};

struct TernaryParams {
  double scale = 1.0, threshold = 0.0, mean_value = 0.0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"scale", "threshold", "mean_value"}, error) &&
           get_real(attrs, "scale", 0.0, false, false, 1.0, &scale, error) &&
           get_real(attrs, "threshold", 0.0, false, false, 0.0, &threshold, error) &&
           get_real(attrs, "mean_value", 0.0, false, false, 0.0, &mean_value, error);
  }
};

struct SumParams {
  double threshold = 0.0;
  int64_t num_workers = 0;
  std::vector<int64_t> shape;  // decode only
  bool parse_common(const Attrs& attrs, std::string* error) {
    return get_real(attrs, "threshold", 0.0, false, true, 0.0, &threshold, error) &&
           get_int(attrs, "num_workers", 1, kvx::kMaxWorkers, &num_workers, error);
  }
};

struct SumEncodeParams : SumParams {
  double value = 0.0;     // > 0: what a code stands for (selection stays by threshold)
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

// MXNet's 2-bit compression requires threshold > 0; so do we.
struct TwoBitEncodeParams {
  double threshold = 0.0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"threshold"}, error) &&
           get_real(attrs, "threshold", 0.0, true, true, 0.0, &threshold, error);
  }
};

struct TwoBitDecodeParams {
  double threshold = 0.0;
  std::vector<int64_t> shape;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"threshold", "shape"}, error) &&
           get_real(attrs, "threshold", 0.0, true, true, 0.0, &threshold, error) &&
           get_shape(attrs, "shape", &shape, error);
  }
};

template <class Params>
bool parse_params(const char* op, const Attrs& attrs, Params* params) {
  std::string error;
  if (params->parse(attrs, &error)) return true;
  MX_ERROR_MSG << op << ": " << error;
  return false;
}

// ---- dtype and shape checks -----------------------------------------------------------

bool expect_dtype(const char* op, const std::vector<int>& types, size_t index,
                  const char* name, int dtype) {
  if (types[index] == dtype) return true;
  MX_ERROR_MSG << op << ": input " << index << " (" << name << ") must be "
               << dtype_name(dtype) << ", got " << dtype_name(types[index]);
  return false;
}

bool same_shape(const char* op, const Shapes& in, size_t a, const char* name_a, size_t b,
                const char* name_b) {
  if (in[a] == in[b]) return true;
  MX_ERROR_MSG << op << ": " << name_b << " " << shape_string(in[b]) << " must have the shape of "
               << name_a << " " << shape_string(in[a]);
  return false;
}

bool nonempty(const char* op, const Shape& shape, const char* name) {
  if (!shape.empty() && product(shape) > 0) return true;
  MX_ERROR_MSG << op << ": " << name << " " << shape_string(shape) << " must not be empty";
  return false;
}

// Rows (shape[0]) and row length of a tensor seen as filters x filter_size.
void filters_of(const Shape& shape, int64_t* filters, int64_t* filter_size) {
  *filters = shape[0];
  *filter_size = product(shape) / shape[0];
}

void filters_of(const std::vector<int64_t>& shape, int64_t* filters, int64_t* filter_size) {
  *filters = shape[0];
  *filter_size = product(shape) / shape[0];
}

// ---- forward helpers ------------------------------------------------------------------

float* f32(MXTensor& t) { return t.data<float>(); }

void set_status(MXTensor& out, int status) { f32(out)[0] = static_cast<float>(status); }

// Runs a forward body; a C++ exception (std::bad_alloc of the per-call scratch) becomes an
// MXNet error instead of unwinding through the C boundary.
template <class Body>
MXReturnValue guarded(const char* op, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return fail(op, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(op, "internal error");
  }
}

// Forward-time dtype re-check (inferType ran already; this guards direct misuse).
bool forward_dtypes(const char* op, const std::vector<MXTensor>& tensors,
                    const std::vector<int>& dtypes) {
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (static_cast<int>(tensors[i].dtype) != dtypes[i]) {
      MX_ERROR_MSG << op << ": tensor " << i << " has dtype " << dtype_name(tensors[i].dtype)
                   << ", expected " << dtype_name(dtypes[i]);
      return false;
    }
  }
  return true;
}

MXReturnValue mutate_second(const Attrs&, std::vector<int>* indices) {
  indices->push_back(1);
  return MX_SUCCESS;
}

// ============================ fp32 pass-through ========================================

constexpr const char* kFp32Encode = "kvx_fp32_encode";

MXReturnValue fp32_encode_parse(const Attrs& attrs, int* num_in, int* num_out) {
  NoParams p;
  if (!parse_params(kFp32Encode, attrs, &p)) return MX_FAIL;
  *num_in = 1;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue fp32_encode_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!expect_dtype(kFp32Encode, *in, 0, "grad", kFloat32)) return MX_FAIL;
  (*out)[0] = kFloat32;
  (*out)[1] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue fp32_encode_shape(const Attrs&, Shapes* in, Shapes* out) {
  if (!nonempty(kFp32Encode, (*in)[0], "grad")) return MX_FAIL;
  if (!flat_shape(kFp32Encode, kvx::fp32_payload_words(product((*in)[0])), &(*out)[0]))
    return MX_FAIL;
  (*out)[1] = Shape{1};
  return MX_SUCCESS;
}

MXReturnValue fp32_encode_forward(const Attrs&, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kFp32Encode, [&] {
    if (!forward_dtypes(kFp32Encode, *in, {kFloat32})) return MX_FAIL;
    MXTensor& grad = (*in)[0];
    set_status((*out)[1], kvx::fp32_encode(f32(grad), grad.size(), f32((*out)[0])));
    return MX_SUCCESS;
  });
}

constexpr const char* kFp32Decode = "kvx_fp32_decode";

MXReturnValue fp32_decode_parse(const Attrs& attrs, int* num_in, int* num_out) {
  Fp32DecodeParams p;
  if (!parse_params(kFp32Decode, attrs, &p)) return MX_FAIL;
  *num_in = 1;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue payload_decode_type(const char* op, std::vector<int>* in, std::vector<int>* out) {
  if (!expect_dtype(op, *in, 0, "payload", kFloat32)) return MX_FAIL;
  for (int& t : *out) t = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue fp32_decode_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  return payload_decode_type(kFp32Decode, in, out);
}

MXReturnValue fp32_decode_shape(const Attrs& attrs, Shapes*, Shapes* out) {
  Fp32DecodeParams p;
  if (!parse_params(kFp32Decode, attrs, &p)) return MX_FAIL;
  (*out)[0] = to_shape(p.shape);
  (*out)[1] = Shape{1};
  return MX_SUCCESS;
}

MXReturnValue fp32_decode_forward(const Attrs&, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kFp32Decode, [&] {
    if (!forward_dtypes(kFp32Decode, *in, {kFloat32})) return MX_FAIL;
    MXTensor& payload = (*in)[0];
    MXTensor& values = (*out)[0];
    set_status((*out)[1], kvx::fp32_decode(f32(payload), payload.size(), values.size(),
                                           f32(values)));
    return MX_SUCCESS;
  });
}

// Shared by the three *_decode_add ops: (payload, acc*) -> status.
MXReturnValue decode_add_parse(const char* op, const Attrs& attrs, int* num_in, int* num_out) {
  NoParams p;
  if (!parse_params(op, attrs, &p)) return MX_FAIL;
  *num_in = 2;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue decode_add_type(const char* op, std::vector<int>* in, std::vector<int>* out) {
  if (!expect_dtype(op, *in, 0, "payload", kFloat32) ||
      !expect_dtype(op, *in, 1, "acc", kFloat32))
    return MX_FAIL;
  (*out)[0] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue decode_add_shape(const char* op, Shapes* in, Shapes* out) {
  if (!nonempty(op, (*in)[1], "acc")) return MX_FAIL;
  (*out)[0] = Shape{1};
  return MX_SUCCESS;
}

using DecodeAddKernel = int (*)(const float*, int64_t, int64_t, float*);

MXReturnValue decode_add_forward(const char* op, DecodeAddKernel kernel,
                                 std::vector<MXTensor>* in, std::vector<MXTensor>* out) {
  return guarded(op, [&] {
    if (!forward_dtypes(op, *in, {kFloat32, kFloat32})) return MX_FAIL;
    MXTensor& payload = (*in)[0];
    MXTensor& acc = (*in)[1];
    set_status((*out)[0], kernel(f32(payload), payload.size(), acc.size(), f32(acc)));
    return MX_SUCCESS;
  });
}

constexpr const char* kFp32DecodeAdd = "kvx_fp32_decode_add";

MXReturnValue fp32_decode_add_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return decode_add_parse(kFp32DecodeAdd, attrs, num_in, num_out);
}
MXReturnValue fp32_decode_add_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  return decode_add_type(kFp32DecodeAdd, in, out);
}
MXReturnValue fp32_decode_add_shape(const Attrs&, Shapes* in, Shapes* out) {
  return decode_add_shape(kFp32DecodeAdd, in, out);
}
MXReturnValue fp32_decode_add_forward(const Attrs&, std::vector<MXTensor>* in,
                                      std::vector<MXTensor>* out, const OpResource&) {
  return decode_add_forward(kFp32DecodeAdd, kvx::fp32_decode_add, in, out);
}

// ============================ finite check ==============================================

constexpr const char* kFiniteCheck = "kvx_finite_check";

MXReturnValue finite_check_parse(const Attrs& attrs, int* num_in, int* num_out) {
  NoParams p;
  if (!parse_params(kFiniteCheck, attrs, &p)) return MX_FAIL;
  *num_in = 1;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue finite_check_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!expect_dtype(kFiniteCheck, *in, 0, "x", kFloat32)) return MX_FAIL;
  (*out)[0] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue finite_check_shape(const Attrs&, Shapes*, Shapes* out) {
  (*out)[0] = Shape{1};
  return MX_SUCCESS;
}

MXReturnValue finite_check_forward(const Attrs&, std::vector<MXTensor>* in,
                                   std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kFiniteCheck, [&] {
    if (!forward_dtypes(kFiniteCheck, *in, {kFloat32})) return MX_FAIL;
    MXTensor& x = (*in)[0];
    set_status((*out)[0], kvx::all_finite(f32(x), x.size()) ? kvx::kOk : kvx::kNonFinite);
    return MX_SUCCESS;
  });
}

// ============================ encoders with a residual ==================================
//
// (grad, residual*) -> ..., grad and residual float32 of the same non-empty shape.

MXReturnValue residual_type(const char* op, std::vector<int>* in) {
  if (!expect_dtype(op, *in, 0, "grad", kFloat32) ||
      !expect_dtype(op, *in, 1, "residual", kFloat32))
    return MX_FAIL;
  return MX_SUCCESS;
}

MXReturnValue residual_shape(const char* op, Shapes* in) {
  if (!nonempty(op, (*in)[0], "grad") || !same_shape(op, *in, 0, "grad", 1, "residual"))
    return MX_FAIL;
  return MX_SUCCESS;
}

// ============================ top-k =====================================================

constexpr const char* kTopkEncode = "kvx_topk_encode";

MXReturnValue topk_encode_parse(const Attrs& attrs, int* num_in, int* num_out) {
  TopkParams p;
  if (!parse_params(kTopkEncode, attrs, &p)) return MX_FAIL;
  *num_in = 2;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue topk_encode_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!residual_type(kTopkEncode, in)) return MX_FAIL;
  (*out)[0] = kFloat32;
  (*out)[1] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue topk_encode_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  TopkParams p;
  if (!parse_params(kTopkEncode, attrs, &p) || !residual_shape(kTopkEncode, in)) return MX_FAIL;
  int64_t filters, filter_size;
  filters_of((*in)[0], &filters, &filter_size);
  if (p.k > filters) {
    MX_ERROR_MSG << kTopkEncode << ": k=" << p.k << " exceeds the " << filters
                 << " filters (shape[0]) of grad " << shape_string((*in)[0]);
    return MX_FAIL;
  }
  if (!flat_shape(kTopkEncode, kvx::topk_payload_words(p.k, filter_size), &(*out)[0]))
    return MX_FAIL;
  (*out)[1] = Shape{1};
  return MX_SUCCESS;
}

MXReturnValue topk_encode_forward(const Attrs& attrs, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kTopkEncode, [&] {
    TopkParams p;
    if (!parse_params(kTopkEncode, attrs, &p) ||
        !forward_dtypes(kTopkEncode, *in, {kFloat32, kFloat32}))
      return MX_FAIL;
    MXTensor& grad = (*in)[0];
    int64_t filters, filter_size;
    filters_of(grad.shape, &filters, &filter_size);
    set_status((*out)[1], kvx::topk_encode(f32(grad), f32((*in)[1]), filters, filter_size, p.k,
                                           f32((*out)[0])));
    return MX_SUCCESS;
  });
}

constexpr const char* kTopkDecode = "kvx_topk_decode";

MXReturnValue shape_decode_parse(const char* op, const Attrs& attrs, int* num_in, int* num_out) {
  ShapeParams p;
  if (!parse_params(op, attrs, &p)) return MX_FAIL;
  *num_in = 1;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue shape_decode_shape(const char* op, const Attrs& attrs, Shapes* out) {
  ShapeParams p;
  if (!parse_params(op, attrs, &p)) return MX_FAIL;
  (*out)[0] = to_shape(p.shape);
  (*out)[1] = Shape{1};
  return MX_SUCCESS;
}

using DecodeKernel = int (*)(const float*, int64_t, int64_t, float*);

MXReturnValue shape_decode_forward(const char* op, DecodeKernel kernel,
                                   std::vector<MXTensor>* in, std::vector<MXTensor>* out) {
  return guarded(op, [&] {
    if (!forward_dtypes(op, *in, {kFloat32})) return MX_FAIL;
    MXTensor& payload = (*in)[0];
    MXTensor& values = (*out)[0];
    set_status((*out)[1], kernel(f32(payload), payload.size(), values.size(), f32(values)));
    return MX_SUCCESS;
  });
}

MXReturnValue topk_decode_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return shape_decode_parse(kTopkDecode, attrs, num_in, num_out);
}
MXReturnValue topk_decode_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  return payload_decode_type(kTopkDecode, in, out);
}
MXReturnValue topk_decode_shape(const Attrs& attrs, Shapes*, Shapes* out) {
  return shape_decode_shape(kTopkDecode, attrs, out);
}
MXReturnValue topk_decode_forward(const Attrs&, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource&) {
  return shape_decode_forward(kTopkDecode, kvx::topk_decode, in, out);
}

constexpr const char* kTopkDecodeAdd = "kvx_topk_decode_add";

MXReturnValue topk_decode_add_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return decode_add_parse(kTopkDecodeAdd, attrs, num_in, num_out);
}
MXReturnValue topk_decode_add_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  return decode_add_type(kTopkDecodeAdd, in, out);
}
MXReturnValue topk_decode_add_shape(const Attrs&, Shapes* in, Shapes* out) {
  return decode_add_shape(kTopkDecodeAdd, in, out);
}
MXReturnValue topk_decode_add_forward(const Attrs&, std::vector<MXTensor>* in,
                                      std::vector<MXTensor>* out, const OpResource&) {
  return decode_add_forward(kTopkDecodeAdd, kvx::topk_decode_add, in, out);
}

constexpr const char* kFilterScores = "kvx_filter_scores";

MXReturnValue filter_scores_parse(const Attrs& attrs, int* num_in, int* num_out) {
  NoParams p;
  if (!parse_params(kFilterScores, attrs, &p)) return MX_FAIL;
  *num_in = 1;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue filter_scores_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!expect_dtype(kFilterScores, *in, 0, "x", kFloat32)) return MX_FAIL;
  (*out)[0] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue filter_scores_shape(const Attrs&, Shapes* in, Shapes* out) {
  if (!nonempty(kFilterScores, (*in)[0], "x")) return MX_FAIL;
  (*out)[0] = Shape{(*in)[0][0]};
  return MX_SUCCESS;
}

MXReturnValue filter_scores_forward(const Attrs&, std::vector<MXTensor>* in,
                                    std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kFilterScores, [&] {
    if (!forward_dtypes(kFilterScores, *in, {kFloat32})) return MX_FAIL;
    MXTensor& x = (*in)[0];
    int64_t filters, filter_size;
    filters_of(x.shape, &filters, &filter_size);
    std::vector<double> scores(static_cast<size_t>(filters));
    kvx::filter_scores(f32(x), filters, filter_size, scores.data());
    float* result = f32((*out)[0]);
    for (int64_t o = 0; o < filters; ++o) result[o] = static_cast<float>(scores[o]);
    return MX_SUCCESS;
  });
}

// Statistics of acc = grad + residual without forming acc (one pass, no temporary): what
// each worker contributes to the homomorphic agreement (kvstore_ext/agreement.py).
constexpr const char* kAccFilterScores = "kvx_acc_filter_scores";
constexpr const char* kAccAbsSum = "kvx_acc_abs_sum";

MXReturnValue acc_stat_parse(const char* op, const Attrs& attrs, int* num_in, int* num_out) {
  NoParams p;
  if (!parse_params(op, attrs, &p)) return MX_FAIL;
  *num_in = 2;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue acc_stat_type(const char* op, std::vector<int>* in, std::vector<int>* out) {
  if (!expect_dtype(op, *in, 0, "grad", kFloat32) ||
      !expect_dtype(op, *in, 1, "residual", kFloat32))
    return MX_FAIL;
  (*out)[0] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue acc_stat_shape(const char* op, Shapes* in, Shapes* out, int64_t length) {
  if (!nonempty(op, (*in)[0], "grad") || !same_shape(op, *in, 0, "grad", 1, "residual"))
    return MX_FAIL;
  (*out)[0] = Shape{length};
  return MX_SUCCESS;
}

MXReturnValue acc_filter_scores_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return acc_stat_parse(kAccFilterScores, attrs, num_in, num_out);
}
MXReturnValue acc_filter_scores_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  return acc_stat_type(kAccFilterScores, in, out);
}
MXReturnValue acc_filter_scores_shape(const Attrs&, Shapes* in, Shapes* out) {
  if ((*in)[0].empty()) return acc_stat_shape(kAccFilterScores, in, out, 0);
  return acc_stat_shape(kAccFilterScores, in, out, (*in)[0][0]);
}
MXReturnValue acc_filter_scores_forward(const Attrs&, std::vector<MXTensor>* in,
                                        std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kAccFilterScores, [&] {
    if (!forward_dtypes(kAccFilterScores, *in, {kFloat32, kFloat32})) return MX_FAIL;
    int64_t filters, filter_size;
    filters_of((*in)[0].shape, &filters, &filter_size);
    std::vector<double> scores(static_cast<size_t>(filters));
    kvx::acc_filter_scores(f32((*in)[0]), f32((*in)[1]), filters, filter_size, scores.data());
    float* result = f32((*out)[0]);
    for (int64_t o = 0; o < filters; ++o) result[o] = static_cast<float>(scores[o]);
    return MX_SUCCESS;
  });
}

MXReturnValue acc_abs_sum_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return acc_stat_parse(kAccAbsSum, attrs, num_in, num_out);
}
MXReturnValue acc_abs_sum_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  return acc_stat_type(kAccAbsSum, in, out);
}
MXReturnValue acc_abs_sum_shape(const Attrs&, Shapes* in, Shapes* out) {
  return acc_stat_shape(kAccAbsSum, in, out, 1);
}
MXReturnValue acc_abs_sum_forward(const Attrs&, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kAccAbsSum, [&] {
    if (!forward_dtypes(kAccAbsSum, *in, {kFloat32, kFloat32})) return MX_FAIL;
    const int64_t n = product((*in)[0].shape);
    f32((*out)[0])[0] = static_cast<float>(kvx::acc_abs_sum(f32((*in)[0]), f32((*in)[1]), n));
    return MX_SUCCESS;
  });
}

constexpr const char* kTopkGather = "kvx_topk_gather";

MXReturnValue topk_gather_parse(const Attrs& attrs, int* num_in, int* num_out) {
  NoParams p;
  if (!parse_params(kTopkGather, attrs, &p)) return MX_FAIL;
  *num_in = 3;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue topk_gather_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!residual_type(kTopkGather, in) ||
      !expect_dtype(kTopkGather, *in, 2, "indices", kFloat32))
    return MX_FAIL;
  (*out)[0] = kFloat32;
  (*out)[1] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue topk_gather_shape(const Attrs&, Shapes* in, Shapes* out) {
  if (!residual_shape(kTopkGather, in) || !nonempty(kTopkGather, (*in)[2], "indices"))
    return MX_FAIL;
  int64_t filters, filter_size;
  filters_of((*in)[0], &filters, &filter_size);
  const int64_t k = product((*in)[2]);
  if (k > filters) {
    MX_ERROR_MSG << kTopkGather << ": " << k << " indices for " << filters
                 << " filters (shape[0]) of grad " << shape_string((*in)[0]);
    return MX_FAIL;
  }
  if (!flat_shape(kTopkGather, k * filter_size, &(*out)[0])) return MX_FAIL;
  (*out)[1] = Shape{1};
  return MX_SUCCESS;
}

MXReturnValue topk_gather_forward(const Attrs&, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kTopkGather, [&] {
    if (!forward_dtypes(kTopkGather, *in, {kFloat32, kFloat32, kFloat32})) return MX_FAIL;
    MXTensor& grad = (*in)[0];
    MXTensor& indices = (*in)[2];
    int64_t filters, filter_size;
    filters_of(grad.shape, &filters, &filter_size);
    set_status((*out)[1], kvx::topk_gather(f32(grad), f32((*in)[1]), filters, filter_size,
                                           f32(indices), indices.size(), f32((*out)[0])));
    return MX_SUCCESS;
  });
}

constexpr const char* kTopkScatter = "kvx_topk_scatter";

MXReturnValue topk_scatter_parse(const Attrs& attrs, int* num_in, int* num_out) {
  ShapeParams p;
  if (!parse_params(kTopkScatter, attrs, &p)) return MX_FAIL;
  *num_in = 2;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue topk_scatter_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!expect_dtype(kTopkScatter, *in, 0, "values", kFloat32) ||
      !expect_dtype(kTopkScatter, *in, 1, "indices", kFloat32))
    return MX_FAIL;
  (*out)[0] = kFloat32;
  (*out)[1] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue topk_scatter_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  ShapeParams p;
  if (!parse_params(kTopkScatter, attrs, &p) || !nonempty(kTopkScatter, (*in)[1], "indices"))
    return MX_FAIL;
  int64_t filters, filter_size;
  filters_of(p.shape, &filters, &filter_size);
  const int64_t k = product((*in)[1]);
  if (k > filters || product((*in)[0]) != k * filter_size) {
    MX_ERROR_MSG << kTopkScatter << ": values " << shape_string((*in)[0]) << " and indices "
                 << shape_string((*in)[1]) << " do not describe k <= " << filters
                 << " filters of " << filter_size << " elements of shape "
                 << shape_string(to_shape(p.shape));
    return MX_FAIL;
  }
  (*out)[0] = to_shape(p.shape);
  (*out)[1] = Shape{1};
  return MX_SUCCESS;
}

// Invalid indices give zeros and status kBadIndex.
MXReturnValue topk_scatter_forward(const Attrs&, std::vector<MXTensor>* in,
                                   std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kTopkScatter, [&] {
    if (!forward_dtypes(kTopkScatter, *in, {kFloat32, kFloat32})) return MX_FAIL;
    MXTensor& indices = (*in)[1];
    MXTensor& result = (*out)[0];
    int64_t filters, filter_size;
    filters_of(result.shape, &filters, &filter_size);
    set_status((*out)[1], kvx::topk_scatter(f32((*in)[0]), f32(indices), indices.size(),
                                            filters, filter_size, f32(result)));
    return MX_SUCCESS;
  });
}

// ============================ ternary ===================================================

constexpr const char* kTernaryEncode = "kvx_ternary_encode";

MXReturnValue ternary_encode_parse(const Attrs& attrs, int* num_in, int* num_out) {
  TernaryParams p;
  if (!parse_params(kTernaryEncode, attrs, &p)) return MX_FAIL;
  *num_in = 2;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue ternary_encode_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!residual_type(kTernaryEncode, in)) return MX_FAIL;
  (*out)[0] = kFloat32;
  (*out)[1] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue ternary_encode_shape(const Attrs&, Shapes* in, Shapes* out) {
  if (!residual_shape(kTernaryEncode, in) ||
      !flat_shape(kTernaryEncode, kvx::ternary_payload_words(product((*in)[0])), &(*out)[0]))
    return MX_FAIL;
  (*out)[1] = Shape{1};
  return MX_SUCCESS;
}

MXReturnValue ternary_encode_forward(const Attrs& attrs, std::vector<MXTensor>* in,
                                     std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kTernaryEncode, [&] {
    TernaryParams p;
    if (!parse_params(kTernaryEncode, attrs, &p) ||
        !forward_dtypes(kTernaryEncode, *in, {kFloat32, kFloat32}))
      return MX_FAIL;
    MXTensor& grad = (*in)[0];
    set_status((*out)[1], kvx::ternary_encode(f32(grad), f32((*in)[1]), grad.size(), p.scale,
                                              p.threshold, f32((*out)[0]),
                                              p.mean_value != 0.0));
    return MX_SUCCESS;
  });
}

constexpr const char* kTernaryDecode = "kvx_ternary_decode";

MXReturnValue ternary_decode_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return shape_decode_parse(kTernaryDecode, attrs, num_in, num_out);
}
MXReturnValue ternary_decode_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  return payload_decode_type(kTernaryDecode, in, out);
}
MXReturnValue ternary_decode_shape(const Attrs& attrs, Shapes*, Shapes* out) {
  return shape_decode_shape(kTernaryDecode, attrs, out);
}
MXReturnValue ternary_decode_forward(const Attrs&, std::vector<MXTensor>* in,
                                     std::vector<MXTensor>* out, const OpResource&) {
  return shape_decode_forward(kTernaryDecode, kvx::ternary_decode, in, out);
}

constexpr const char* kTernaryDecodeAdd = "kvx_ternary_decode_add";

MXReturnValue ternary_decode_add_parse(const Attrs& attrs, int* num_in, int* num_out) {
  return decode_add_parse(kTernaryDecodeAdd, attrs, num_in, num_out);
}
MXReturnValue ternary_decode_add_type(const Attrs&, std::vector<int>* in,
                                      std::vector<int>* out) {
  return decode_add_type(kTernaryDecodeAdd, in, out);
}
MXReturnValue ternary_decode_add_shape(const Attrs&, Shapes* in, Shapes* out) {
  return decode_add_shape(kTernaryDecodeAdd, in, out);
}
MXReturnValue ternary_decode_add_forward(const Attrs&, std::vector<MXTensor>* in,
                                         std::vector<MXTensor>* out, const OpResource&) {
  return decode_add_forward(kTernaryDecodeAdd, kvx::ternary_decode_add, in, out);
}

// ============================ homomorphic ternary =======================================

constexpr const char* kSumEncode = "kvx_ternary_encode_sum";

MXReturnValue sum_encode_parse(const Attrs& attrs, int* num_in, int* num_out) {
  SumEncodeParams p;
  if (!parse_params(kSumEncode, attrs, &p)) return MX_FAIL;
  *num_in = 2;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue sum_encode_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!residual_type(kSumEncode, in)) return MX_FAIL;
  (*out)[0] = kFloat32;
  (*out)[1] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue sum_encode_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  SumEncodeParams p;
  if (!parse_params(kSumEncode, attrs, &p) || !residual_shape(kSumEncode, in) ||
      !flat_shape(kSumEncode, kvx::ternary_sum_words(product((*in)[0]), p.num_workers),
                  &(*out)[0]))
    return MX_FAIL;
  (*out)[1] = Shape{1};
  return MX_SUCCESS;
}

MXReturnValue sum_encode_forward(const Attrs& attrs, std::vector<MXTensor>* in,
                                 std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kSumEncode, [&] {
    SumEncodeParams p;
    if (!parse_params(kSumEncode, attrs, &p) ||
        !forward_dtypes(kSumEncode, *in, {kFloat32, kFloat32}))
      return MX_FAIL;
    MXTensor& grad = (*in)[0];
    set_status((*out)[1], kvx::ternary_encode_sum(f32(grad), f32((*in)[1]), grad.size(),
                                                  p.threshold, p.num_workers, f32((*out)[0]),
                                                  p.value));
    return MX_SUCCESS;
  });
}

constexpr const char* kSumDecode = "kvx_ternary_decode_sum";

MXReturnValue sum_decode_parse(const Attrs& attrs, int* num_in, int* num_out) {
  SumDecodeParams p;
  if (!parse_params(kSumDecode, attrs, &p)) return MX_FAIL;
  *num_in = 1;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue sum_decode_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!expect_dtype(kSumDecode, *in, 0, "words", kFloat32)) return MX_FAIL;
  (*out)[0] = kFloat32;
  (*out)[1] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue sum_decode_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  SumDecodeParams p;
  if (!parse_params(kSumDecode, attrs, &p)) return MX_FAIL;
  const int64_t expected = kvx::ternary_sum_words(product(p.shape), p.num_workers);
  if (product((*in)[0]) != expected) {
    MX_ERROR_MSG << kSumDecode << ": words " << shape_string((*in)[0]) << " must hold "
                 << expected << " elements for shape " << shape_string(to_shape(p.shape))
                 << " and num_workers=" << p.num_workers;
    return MX_FAIL;
  }
  (*out)[0] = to_shape(p.shape);
  (*out)[1] = Shape{1};
  return MX_SUCCESS;
}

// A word that is not an integer in [0, base^D) gives zeros and status kBadWord.
MXReturnValue sum_decode_forward(const Attrs& attrs, std::vector<MXTensor>* in,
                                 std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kSumDecode, [&] {
    SumDecodeParams p;
    if (!parse_params(kSumDecode, attrs, &p) || !forward_dtypes(kSumDecode, *in, {kFloat32}))
      return MX_FAIL;
    MXTensor& words = (*in)[0];
    MXTensor& result = (*out)[0];
    set_status((*out)[1], kvx::ternary_decode_sum(f32(words), words.size(), p.threshold,
                                                  p.num_workers, result.size(), f32(result)));
    return MX_SUCCESS;
  });
}

// ============================ MXNet 2-bit ===============================================

constexpr const char* kTwoBitEncode = "kvx_twobit_encode";

MXReturnValue twobit_encode_parse(const Attrs& attrs, int* num_in, int* num_out) {
  TwoBitEncodeParams p;
  if (!parse_params(kTwoBitEncode, attrs, &p)) return MX_FAIL;
  *num_in = 2;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue twobit_encode_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!residual_type(kTwoBitEncode, in)) return MX_FAIL;
  (*out)[0] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue twobit_encode_shape(const Attrs&, Shapes* in, Shapes* out) {
  if (!residual_shape(kTwoBitEncode, in) ||
      !flat_shape(kTwoBitEncode, kvx::twobit_words(product((*in)[0])), &(*out)[0]))
    return MX_FAIL;
  return MX_SUCCESS;
}

MXReturnValue twobit_encode_forward(const Attrs& attrs, std::vector<MXTensor>* in,
                                    std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kTwoBitEncode, [&] {
    TwoBitEncodeParams p;
    if (!parse_params(kTwoBitEncode, attrs, &p) ||
        !forward_dtypes(kTwoBitEncode, *in, {kFloat32, kFloat32}))
      return MX_FAIL;
    MXTensor& grad = (*in)[0];
    // The float32 output only carries the raw 32-bit words.
    kvx::twobit_encode(f32(grad), f32((*in)[1]), grad.size(), p.threshold,
                       (*out)[0].data<uint32_t>());
    return MX_SUCCESS;
  });
}

constexpr const char* kTwoBitDecode = "kvx_twobit_decode";

MXReturnValue twobit_decode_parse(const Attrs& attrs, int* num_in, int* num_out) {
  TwoBitDecodeParams p;
  if (!parse_params(kTwoBitDecode, attrs, &p)) return MX_FAIL;
  *num_in = 1;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue twobit_decode_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!expect_dtype(kTwoBitDecode, *in, 0, "words", kFloat32)) return MX_FAIL;
  (*out)[0] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue twobit_decode_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  TwoBitDecodeParams p;
  if (!parse_params(kTwoBitDecode, attrs, &p)) return MX_FAIL;
  const int64_t expected = kvx::twobit_words(product(p.shape));
  if (product((*in)[0]) != expected) {
    MX_ERROR_MSG << kTwoBitDecode << ": words " << shape_string((*in)[0]) << " must hold "
                 << expected << " elements for shape " << shape_string(to_shape(p.shape));
    return MX_FAIL;
  }
  (*out)[0] = to_shape(p.shape);
  return MX_SUCCESS;
}

MXReturnValue twobit_decode_forward(const Attrs& attrs, std::vector<MXTensor>* in,
                                    std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kTwoBitDecode, [&] {
    TwoBitDecodeParams p;
    if (!parse_params(kTwoBitDecode, attrs, &p) ||
        !forward_dtypes(kTwoBitDecode, *in, {kFloat32}))
      return MX_FAIL;
    MXTensor& result = (*out)[0];
    kvx::twobit_decode((*in)[0].data<uint32_t>(), result.size(), p.threshold, f32(result));
    return MX_SUCCESS;
  });
}

// ============================ server-decode aggregation ================================

constexpr const char* kDecodeSlots = "kvx_decode_slots";

struct DecodeSlotsParams {
  int64_t size = 0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"size"}, error) &&
           get_int(attrs, "size", 1, std::numeric_limits<unsigned int>::max(), &size, error);
  }
};

MXReturnValue decode_slots_parse(const Attrs& attrs, int* num_in, int* num_out) {
  DecodeSlotsParams p;
  if (!parse_params(kDecodeSlots, attrs, &p)) return MX_FAIL;
  *num_in = 1;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue decode_slots_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  if (!expect_dtype(kDecodeSlots, *in, 0, "slots", kFloat32)) return MX_FAIL;
  (*out)[0] = kFloat32;
  (*out)[1] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue decode_slots_shape(const Attrs& attrs, Shapes* in, Shapes* out) {
  DecodeSlotsParams p;
  if (!parse_params(kDecodeSlots, attrs, &p)) return MX_FAIL;
  const Shape& slots = (*in)[0];
  if (slots.size() != 2 || slots[0] < 1 || slots[1] < 1) {
    MX_ERROR_MSG << kDecodeSlots << ": slots must be 2-D (workers, slot words), got "
                 << shape_string(slots);
    return MX_FAIL;
  }
  (*out)[0] = Shape{static_cast<unsigned int>(p.size)};
  (*out)[1] = Shape{slots[0]};
  return MX_SUCCESS;
}

MXReturnValue decode_slots_forward(const Attrs&, std::vector<MXTensor>* in,
                                   std::vector<MXTensor>* out, const OpResource&) {
  return guarded(kDecodeSlots, [&] {
    if (!forward_dtypes(kDecodeSlots, *in, {kFloat32})) return MX_FAIL;
    MXTensor& slots = (*in)[0];
    MXTensor& acc = (*out)[0];
    kvx::decode_slots(f32(slots), slots.shape[0], slots.shape[1], f32(acc), acc.size(),
                      f32((*out)[1]));
    return MX_SUCCESS;
  });
}

}  // namespace

// ============================ registration ==============================================

REGISTER_OP(kvx_fp32_encode)
    .setParseAttrs(fp32_encode_parse)
    .setInferType(fp32_encode_type)
    .setInferShape(fp32_encode_shape)
    .setForward(fp32_encode_forward, "cpu");

REGISTER_OP(kvx_fp32_decode)
    .setParseAttrs(fp32_decode_parse)
    .setInferType(fp32_decode_type)
    .setInferShape(fp32_decode_shape)
    .setForward(fp32_decode_forward, "cpu");

REGISTER_OP(kvx_fp32_decode_add)
    .setParseAttrs(fp32_decode_add_parse)
    .setInferType(fp32_decode_add_type)
    .setInferShape(fp32_decode_add_shape)
    .setMutateInputs(mutate_second)
    .setForward(fp32_decode_add_forward, "cpu");

REGISTER_OP(kvx_finite_check)
    .setParseAttrs(finite_check_parse)
    .setInferType(finite_check_type)
    .setInferShape(finite_check_shape)
    .setForward(finite_check_forward, "cpu");

REGISTER_OP(kvx_topk_encode)
    .setParseAttrs(topk_encode_parse)
    .setInferType(topk_encode_type)
    .setInferShape(topk_encode_shape)
    .setMutateInputs(mutate_second)
    .setForward(topk_encode_forward, "cpu");

REGISTER_OP(kvx_topk_decode)
    .setParseAttrs(topk_decode_parse)
    .setInferType(topk_decode_type)
    .setInferShape(topk_decode_shape)
    .setForward(topk_decode_forward, "cpu");

REGISTER_OP(kvx_topk_decode_add)
    .setParseAttrs(topk_decode_add_parse)
    .setInferType(topk_decode_add_type)
    .setInferShape(topk_decode_add_shape)
    .setMutateInputs(mutate_second)
    .setForward(topk_decode_add_forward, "cpu");

REGISTER_OP(kvx_filter_scores)
    .setParseAttrs(filter_scores_parse)
    .setInferType(filter_scores_type)
    .setInferShape(filter_scores_shape)
    .setForward(filter_scores_forward, "cpu");

REGISTER_OP(kvx_acc_filter_scores)
    .setParseAttrs(acc_filter_scores_parse)
    .setInferType(acc_filter_scores_type)
    .setInferShape(acc_filter_scores_shape)
    .setForward(acc_filter_scores_forward, "cpu");

REGISTER_OP(kvx_acc_abs_sum)
    .setParseAttrs(acc_abs_sum_parse)
    .setInferType(acc_abs_sum_type)
    .setInferShape(acc_abs_sum_shape)
    .setForward(acc_abs_sum_forward, "cpu");

REGISTER_OP(kvx_topk_gather)
    .setParseAttrs(topk_gather_parse)
    .setInferType(topk_gather_type)
    .setInferShape(topk_gather_shape)
    .setMutateInputs(mutate_second)
    .setForward(topk_gather_forward, "cpu");

REGISTER_OP(kvx_topk_scatter)
    .setParseAttrs(topk_scatter_parse)
    .setInferType(topk_scatter_type)
    .setInferShape(topk_scatter_shape)
    .setForward(topk_scatter_forward, "cpu");

REGISTER_OP(kvx_ternary_encode)
    .setParseAttrs(ternary_encode_parse)
    .setInferType(ternary_encode_type)
    .setInferShape(ternary_encode_shape)
    .setMutateInputs(mutate_second)
    .setForward(ternary_encode_forward, "cpu");

REGISTER_OP(kvx_ternary_decode)
    .setParseAttrs(ternary_decode_parse)
    .setInferType(ternary_decode_type)
    .setInferShape(ternary_decode_shape)
    .setForward(ternary_decode_forward, "cpu");

REGISTER_OP(kvx_ternary_decode_add)
    .setParseAttrs(ternary_decode_add_parse)
    .setInferType(ternary_decode_add_type)
    .setInferShape(ternary_decode_add_shape)
    .setMutateInputs(mutate_second)
    .setForward(ternary_decode_add_forward, "cpu");

REGISTER_OP(kvx_ternary_encode_sum)
    .setParseAttrs(sum_encode_parse)
    .setInferType(sum_encode_type)
    .setInferShape(sum_encode_shape)
    .setMutateInputs(mutate_second)
    .setForward(sum_encode_forward, "cpu");

REGISTER_OP(kvx_ternary_decode_sum)
    .setParseAttrs(sum_decode_parse)
    .setInferType(sum_decode_type)
    .setInferShape(sum_decode_shape)
    .setForward(sum_decode_forward, "cpu");

REGISTER_OP(kvx_twobit_encode)
    .setParseAttrs(twobit_encode_parse)
    .setInferType(twobit_encode_type)
    .setInferShape(twobit_encode_shape)
    .setMutateInputs(mutate_second)
    .setForward(twobit_encode_forward, "cpu");

REGISTER_OP(kvx_twobit_decode)
    .setParseAttrs(twobit_decode_parse)
    .setInferType(twobit_decode_type)
    .setInferShape(twobit_decode_shape)
    .setForward(twobit_decode_forward, "cpu");

// lib_api v11 ships with MXNet 1.7+; MXNet passes its version as 10000*major + 100*minor.
MXReturnValue initialize(int version) {
  if (version >= 10700) return MX_SUCCESS;
  MX_ERROR_MSG << "kvx_ops needs MXNet >= 1.7 (lib_api v11), found version " << version;
  return MX_FAIL;
}

REGISTER_OP(kvx_decode_slots)
    .setParseAttrs(decode_slots_parse)
    .setInferType(decode_slots_type)
    .setInferShape(decode_slots_shape)
    .setForward(decode_slots_forward, "cpu");
