// Attribute parsing and checks shared by the plugin's operators; see op_util.h.
#include "op_util.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace kvx_ops {

namespace {

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

const std::string* find(const Attrs& attrs, const char* key) {
  const auto it = attrs.find(key);
  return it == attrs.end() ? nullptr : &it->second;
}

}  // namespace

MXReturnValue fail(const char* op, const std::string& message) {
  MX_ERROR_MSG << op << ": " << message;
  return MX_FAIL;
}

std::string shape_string(const Shape& shape) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << (shape.size() == 1 ? ",)" : ")");
  return s.str();
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

bool has(const Attrs& attrs, const char* key) { return find(attrs, key) != nullptr; }

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


bool flat_shape(const char* op, int64_t words, Shape* shape) {
  if (words < 1 || words > std::numeric_limits<unsigned int>::max()) {
    MX_ERROR_MSG << op << ": output of " << words << " elements is out of range";
    return false;
  }
  *shape = Shape{static_cast<unsigned int>(words)};
  return true;
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


bool residual_shape(const char* op, const Shapes& in) {
  return nonempty(op, in[0], "grad") && same_shape(op, in, 0, "grad", 1, "residual");
}

bool check_dtypes(const char* op, const std::vector<int>& types, const char* const* names,
                  size_t count, int dtype) {
  for (size_t i = 0; i < count; ++i) {
    if (types[i] != dtype) {
      MX_ERROR_MSG << op << ": input " << i << " (" << names[i] << ") must be "
                   << dtype_name(dtype) << ", got " << dtype_name(types[i]);
      return false;
    }
  }
  return true;
}

bool forward_dtypes(const char* op, const Tensors& tensors, size_t count, int dtype) {
  for (size_t i = 0; i < count; ++i) {
    if (tensors[i].dtype != dtype) {
      MX_ERROR_MSG << op << ": tensor " << i << " has dtype " << dtype_name(tensors[i].dtype)
                   << ", expected " << dtype_name(dtype);
      return false;
    }
  }
  return true;
}

}  // namespace kvx_ops
