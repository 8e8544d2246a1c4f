// THC's pieces as MXNet operators, for the differential tests and the benchmark only
// (the test library libkvx_test_ops, not the plugin): the randomized Hadamard transform
// and its inverse, quantise-and-pack, unpack-and-dequantise.
//
//   kvx_thc_rotate(x, norms; seed, step, block)        -> z f32[d], status
//   kvx_thc_unrotate(z, norms; seed, step, block, shape) -> out f32[shape], status
//   kvx_thc_quantize(z; levels, clamp, seed, step, rank, num_workers, table=0)
//                                                      -> words f32[ceil(d/D)], status
//   kvx_thc_dequantize(words; levels, clamp, num_workers, summed, size, table=0)
//                                                      -> values f32[size], status
//                                  (d = padded size, D digits a word, table 0 uniform,
//                                   1 THC's non-uniform table: cpp/codecs/thc.h)
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

struct ThcRotateParams : ThcAttrs {
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"seed", "step", "block"}, error) && seed_only(attrs, error) &&
           get_step(attrs, error) && block(attrs, error);
  }
};

// z f32[d]: x padded, scaled by sqrt(d) / (M sqrt(B)), signed and transformed.
struct ThcRotate : OpSpec {
  static constexpr const char* name = "kvx_thc_rotate";
  static constexpr const char* inputs[] = {"x", "norms"};
  static constexpr int outputs = 2;
  using Params = ThcRotateParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    int64_t workers;
    (*out)[1] = Shape{1};
    return nonempty(name, in[0], "x") && thc_norms(name, in[1], &workers) &&
           flat_shape(name, kvx::thc_padded_size(product(in[0]), p.p.block), &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    float m = 0.0f;
    int status = kvx::kBadParam;
    if (kvx::thc_max_norm(f32(in[1]), in[1].size(), &m))
      status = kvx::thc_rotate(f32(in[0]), in[0].size(), m, p.p.seed, p.step, p.p.block,
                               f32(out[0]));
    if (status != kvx::kOk) std::fill(f32(out[0]), f32(out[0]) + out[0].size(), 0.0f);
    set_status(out[1], status);
  }
};

struct ThcUnrotateParams : ThcAttrs {
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"seed", "step", "block", "shape"}, error) &&
           seed_only(attrs, error) && get_step(attrs, error) && block(attrs, error) &&
           get_shape(attrs, "shape", &shape, error);
  }
};

// out f32[shape]: the inverse of kvx_thc_rotate.
struct ThcUnrotate : OpSpec {
  static constexpr const char* name = "kvx_thc_unrotate";
  static constexpr const char* inputs[] = {"z", "norms"};
  static constexpr int outputs = 2;
  using Params = ThcUnrotateParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    int64_t workers;
    const int64_t d = kvx::thc_padded_size(product(p.shape), p.p.block);
    if (!thc_norms(name, in[1], &workers)) return false;
    if (product(in[0]) != d) {
      MX_ERROR_MSG << name << ": z " << shape_string(in[0]) << " must hold " << d
                   << " elements for shape " << shape_string(to_shape(p.shape));
      return false;
    }
    (*out)[0] = to_shape(p.shape);
    (*out)[1] = Shape{1};
    return true;
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    float m = 0.0f;
    int status = kvx::kBadParam;
    if (kvx::thc_max_norm(f32(in[1]), in[1].size(), &m))
      status = kvx::thc_unrotate(f32(in[0]), out[0].size(), m, p.p.seed, p.step, p.p.block,
                                 f32(out[0]));
    if (status != kvx::kOk) std::fill(f32(out[0]), f32(out[0]) + out[0].size(), 0.0f);
    set_status(out[1], status);
  }
};

struct ThcQuantizeParams : ThcAttrs {
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs,
                      {"levels", "clamp", "seed", "step", "rank", "num_workers", "table"},
                      error) &&
           quantiser(attrs, error) && seed_only(attrs, error) && get_step(attrs, error) &&
           get_int(attrs, "num_workers", 1, kvx::kThcMaxWorkers, &num_workers, error) &&
           get_int(attrs, "rank", 0, kvx::kThcMaxWorkers - 1, &rank, error);
  }
};

// words: the digits of z (clamped, stochastically rounded to the table) packed for
// num_workers.
struct ThcQuantize : OpSpec {
  static constexpr const char* name = "kvx_thc_quantize";
  static constexpr const char* inputs[] = {"z"};
  static constexpr int outputs = 2;
  using Params = ThcQuantizeParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    if (!thc_valid(name, p.p, p.num_workers)) return false;
    if (p.rank >= p.num_workers) {
      MX_ERROR_MSG << name << ": rank=" << p.rank << " is not below num_workers="
                   << p.num_workers;
      return false;
    }
    (*out)[1] = Shape{1};
    return nonempty(name, in[0], "z") &&
           flat_shape(name, kvx::thc_packed_words(product(in[0]), p.p, p.num_workers),
                      &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    set_status(out[1], kvx::thc_quantize(f32(in[0]), in[0].size(), p.p, p.num_workers, p.rank,
                                         p.step, f32(out[0])));
  }
};

struct ThcDequantizeParams : ThcAttrs {
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"levels", "clamp", "num_workers", "summed", "size", "table"},
                      error) &&
           quantiser(attrs, error) &&
           get_int(attrs, "num_workers", 1, kvx::kThcMaxWorkers, &num_workers, error) &&
           get_int(attrs, "summed", 1, kvx::kThcMaxWorkers, &summed, error) &&
           get_int(attrs, "size", 1, std::numeric_limits<unsigned int>::max(), &size, error);
  }
};

// values f32[size]: the level sums of `summed` workers' digits in words packed for
// num_workers.  A word that is not an integer in [0, base^D) gives zeros and kBadWord.
struct ThcDequantize : OpSpec {
  static constexpr const char* name = "kvx_thc_dequantize";
  static constexpr const char* inputs[] = {"words"};
  static constexpr int outputs = 2;
  using Params = ThcDequantizeParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    if (!thc_valid(name, p.p, p.num_workers)) return false;
    const int64_t expected = kvx::thc_packed_words(p.size, p.p, p.num_workers);
    if (product(in[0]) != expected) {
      MX_ERROR_MSG << name << ": words " << shape_string(in[0]) << " must hold " << expected
                   << " elements for size=" << p.size << ", levels=" << p.p.levels
                   << ", table=" << p.p.table << " and num_workers=" << p.num_workers;
      return false;
    }
    (*out)[0] = Shape{static_cast<unsigned int>(p.size)};
    (*out)[1] = Shape{1};
    return true;
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    set_status(out[1], kvx::thc_dequantize(f32(in[0]), in[0].size(), p.size, p.p,
                                           p.num_workers, p.summed, f32(out[0])));
  }
};

}  // namespace

KVX_REGISTER_OP(ThcRotate);
KVX_REGISTER_OP(ThcUnrotate);
KVX_REGISTER_OP(ThcQuantize);
KVX_REGISTER_OP(ThcDequantize);
