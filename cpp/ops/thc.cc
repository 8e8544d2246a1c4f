// THC's MXNet operators: the scheme's steps (kvstore_ext/codecs/thc.py); its pieces,
// which only the differential tests use, are in cpp/ops_test_thc.cc.
//
//   kvx_thc_norm(grad, residual; rank, num_workers)    -> slots f32[W] (norm at rank), status
//   kvx_thc_encode(grad, residual*, norms f32[W]; levels, clamp, seed, block, step, rank,
//                  table=0)                            -> words f32[ceil(d/D)], status
//   kvx_thc_decode_sum(words, norms f32[W]; levels, clamp, seed, block, step, shape,
//                      table=0)                        -> out f32[shape], status
//
// `*` marks an input updated in place (setMutateInputs); op_util.h says how an op is
// declared and what encoders and decoders do on bad input (set_encoded, void_sum).
#include <algorithm>
#include <limits>
#include <vector>

#include "kernels.h"
#include "op_util.h"
#include "ops/thc.h"

using namespace kvx_ops;

namespace {

struct ThcNormParams : ThcAttrs {
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"rank", "num_workers"}, error) &&
           get_int(attrs, "num_workers", 1, kvx::kThcMaxWorkers, &num_workers, error) &&
           get_int(attrs, "rank", 0, kvx::kThcMaxWorkers - 1, &rank, error);
  }
};

// This worker's slot of the norm round: zeros but ||grad + residual|| at `rank`.
struct ThcNorm : OpSpec {
  static constexpr const char* name = "kvx_thc_norm";
  static constexpr const char* inputs[] = {"grad", "residual"};
  static constexpr int outputs = 2;
  using Params = ThcNormParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    if (p.rank >= p.num_workers) {
      MX_ERROR_MSG << name << ": rank=" << p.rank << " is not below num_workers="
                   << p.num_workers;
      return false;
    }
    (*out)[0] = Shape{static_cast<unsigned int>(p.num_workers)};
    (*out)[1] = Shape{1};
    return residual_shape(name, in);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    float norm = 0.0f;
    const int status = kvx::thc_norm(f32(in[0]), f32(in[1]), in[0].size(), &norm);
    float* slots = f32(out[0]);
    for (int64_t w = 0; w < p.num_workers; ++w) slots[w] = 0.0f;
    slots[p.rank] = norm;
    set_status(out[1], status);
  }
};

struct ThcEncodeParams : ThcAttrs {
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"levels", "clamp", "seed", "block", "step", "rank", "table"},
                      error) &&
           codec(attrs, error) && get_step(attrs, error) &&
           get_int(attrs, "rank", 0, kvx::kThcMaxWorkers - 1, &rank, error);
  }
};

// One worker's payload; the residual becomes acc minus its own contribution's decoding.
struct ThcEncode : OpSpec {
  static constexpr const char* name = "kvx_thc_encode";
  static constexpr const char* inputs[] = {"grad", "residual", "norms"};
  static constexpr int outputs = 2;
  static constexpr bool updates_second = true;
  using Params = ThcEncodeParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    int64_t workers;
    if (!residual_shape(name, in) || !thc_norms(name, in[2], &workers) ||
        !thc_valid(name, p.p, workers))
      return false;
    if (p.rank >= workers) {
      MX_ERROR_MSG << name << ": rank=" << p.rank << " for " << workers << " norms";
      return false;
    }
    (*out)[1] = Shape{1};
    return flat_shape(name, kvx::thc_sum_words(product(in[0]), p.p, workers), &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    set_status(out[1], kvx::thc_encode(f32(in[0]), f32(in[1]), in[0].size(), f32(in[2]),
                                       in[2].size(), p.rank, p.step, p.p, f32(out[0])));
  }
};

struct ThcDecodeParams : ThcAttrs {
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"levels", "clamp", "seed", "block", "step", "shape", "table"},
                      error) &&
           codec(attrs, error) && get_step(attrs, error) &&
           get_shape(attrs, "shape", &shape, error);
  }
};

// The sum over workers from the server's sum of their words; a malformed sum gives
// zeros and a status.
struct ThcDecodeSum : OpSpec {
  static constexpr const char* name = "kvx_thc_decode_sum";
  static constexpr const char* inputs[] = {"words", "norms"};
  static constexpr int outputs = 2;
  using Params = ThcDecodeParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    int64_t workers;
    if (!thc_norms(name, in[1], &workers) || !thc_valid(name, p.p, workers)) return false;
    const int64_t expected = kvx::thc_sum_words(product(p.shape), p.p, workers);
    if (product(in[0]) != expected) {
      MX_ERROR_MSG << name << ": words " << shape_string(in[0]) << " must hold " << expected
                   << " elements for shape " << shape_string(to_shape(p.shape)) << " and "
                   << workers << " workers";
      return false;
    }
    (*out)[0] = to_shape(p.shape);
    (*out)[1] = Shape{1};
    return true;
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    set_status(out[1], kvx::thc_decode_sum(f32(in[0]), in[0].size(), out[0].size(), f32(in[1]),
                                           in[1].size(), p.step, p.p, f32(out[0])));
  }
};

}  // namespace

KVX_REGISTER_OP(ThcNorm);
KVX_REGISTER_OP(ThcEncode);
KVX_REGISTER_OP(ThcDecodeSum);
