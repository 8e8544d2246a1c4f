// dAD's capture (kvstore_ext/dad.py) as an operator of the plugin:
//
//   kvx_dad_capture(a, out; layer) -> out's copy.  Backward: D = the output's gradient
//                         passes on unchanged, `a` gets a zero gradient, and the pair
//                         (A, D), both seen as rows x last dimension, is appended to the
//                         rows of `layer` (an integer) kept here until taken (capi.h).
//
// Why in C++: the same capture as a Python CustomOp runs on MXNet's custom-operator
// thread under the GIL in every forward and backward, and the graph waits for it (a
// cnn512 pass 1.14x a plain one against 1.05x with this operator,
// bench/results/dad_capture_cost_cnn512.json).  Here it is one engine op each way, a
// copy of the layer's output and of its rows.
//
// lib_api's dispatcher ignores the gradient request: an output with nothing to write
// (the gradient of data that needs none) may come without memory, so every write checks
// for it; `a`'s gradient is written, never added to (MXNet sums a node's gradients in
// its own buffers unless MXNET_EXEC_ENABLE_ADDTO=1, under which kvstore_ext/dad.py
// takes its Python capture).
#include <algorithm>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "capi.h"
#include "op_util.h"

using namespace kvx_ops;

namespace {

// The rows of one layer since its last take: A (rows x in) and D (rows x out).
struct Rows {
  int64_t rows = 0, in = 0, out = 0;
  std::vector<float> a, d;
};

// Backward passes of several devices run on the engine's threads at once.
std::mutex rows_mutex;
std::unordered_map<int64_t, Rows> pending;

void append_rows(int64_t layer, MXTensor& a, MXTensor& d) {
  const int64_t in = a.shape.back(), out = d.shape.back();
  const int64_t rows = in > 0 ? a.size() / in : 0;
  if (out <= 0 || d.size() / out != rows)
    throw std::invalid_argument("a and the output's gradient hold different row counts");
  std::lock_guard<std::mutex> lock(rows_mutex);
  Rows& r = pending[layer];
  if (r.rows > 0 && (r.in != in || r.out != out))
    throw std::invalid_argument("the layer's row widths changed between passes");
  r.in = in;
  r.out = out;
  r.rows += rows;
  r.a.insert(r.a.end(), a.data<float>(), a.data<float>() + a.size());
  r.d.insert(r.d.end(), d.data<float>(), d.data<float>() + d.size());
}

struct LayerParams {
  int64_t layer = 0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"layer"}, error) &&
           get_int(attrs, "layer", 0, int64_t{1} << 62, &layer, error);
  }
};

struct DadCapture : OpSpec {
  static constexpr const char* name = "kvx_dad_capture";
  static constexpr const char* inputs[] = {"a", "out"};
  static constexpr int outputs = 1;
  using Params = LayerParams;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = in[1];
    if (!in[0].empty() && !in[1].empty()) return true;
    MX_ERROR_MSG << name << ": a and out need at least one dimension, got "
                 << shape_string(in[0]) << " and " << shape_string(in[1]);
    return false;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    std::memcpy(f32(out[0]), f32(in[1]), in[1].size() * sizeof(float));
  }
};

// inputs: D (the output's gradient), a, out; outputs: a's gradient, out's gradient.
MXReturnValue capture_backward(const Attrs& attrs, Tensors* in, Tensors* out,
                               const mxnet::ext::OpResource&) {
  try {
    LayerParams p;
    if (!Op<DadCapture>::parse_params(attrs, &p)) return MX_FAIL;
    MXTensor& d = (*in)[0];
    append_rows(p.layer, (*in)[1], d);
    MXTensor& grad_a = (*out)[0];
    MXTensor& grad_out = (*out)[1];
    if (grad_a.data_ptr != nullptr)
      std::memset(grad_a.data_ptr, 0, grad_a.size() * sizeof(float));
    if (grad_out.data_ptr != nullptr)
      std::memcpy(grad_out.data_ptr, d.data_ptr, d.size() * sizeof(float));
    return MX_SUCCESS;
  } catch (const std::exception& e) {
    return fail(DadCapture::name, e.what());
  }
}

[[maybe_unused]] const auto& kvx_registered_dad_capture =
    Op<DadCapture>::define().setBackward(capture_backward, "cpu");

}  // namespace

int64_t kvx_dad_pending(int64_t layer, int64_t* in, int64_t* out) {
  std::lock_guard<std::mutex> lock(rows_mutex);
  auto found = pending.find(layer);
  if (found == pending.end()) {
    *in = *out = 0;
    return 0;
  }
  *in = found->second.in;
  *out = found->second.out;
  return found->second.rows;
}

int kvx_dad_copy(int64_t layer, int64_t rows, int take, float* a, float* d) {
  std::lock_guard<std::mutex> lock(rows_mutex);
  auto found = pending.find(layer);
  if (rows < 0 || (rows > 0 && (found == pending.end() || found->second.rows < rows)))
    return kvx::kBadParam;
  if (rows == 0) return kvx::kOk;
  Rows& r = found->second;
  const auto a_end = r.a.begin() + rows * r.in, d_end = r.d.begin() + rows * r.out;
  std::copy(r.a.begin(), a_end, a);
  std::copy(r.d.begin(), d_end, d);
  if (take) {
    r.a.erase(r.a.begin(), a_end);
    r.d.erase(r.d.begin(), d_end);
    r.rows -= rows;
    if (r.rows == 0) pending.erase(found);
  }
  return kvx::kOk;
}

void kvx_dad_forget(int64_t layer) {
  std::lock_guard<std::mutex> lock(rows_mutex);
  pending.erase(layer);
}
