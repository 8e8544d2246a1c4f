// The MXNet operators kvstore_ext uses (lib_api v11, MXNet >= 1.7): one struct per op
// around one kernel of kernels.h (op_util.h says how an op is declared).  Ops that only
// tests and benchmarks use are in ops_test.cc.
//
//   kvx_finite_check(x)                                -> status (1 if a NaN/Inf)
//   kvx_fp32_encode(grad)                              -> payload f32[8+n], status f32[1]
//   kvx_topk_encode(grad, residual*; k)                -> payload f32[8+k+k*F], status
//   kvx_acc_filter_scores(grad, residual)              -> scores f32[O] of grad + residual
//   kvx_acc_abs_sum(grad, residual)                    -> sum |grad + residual| f32[1]
//   kvx_acc_abs_max(grad, residual)                    -> max |grad + residual| f32[1]
//                                  (NaN or Inf if some element of grad + residual is)
//   kvx_topk_gather(grad, residual*, indices f32[k])   -> values f32[k*F], status
//   kvx_topk_scatter(values, indices; shape)           -> out f32[shape], status
//   kvx_ternary_encode(grad, residual*; scale=1, threshold=0, value_rule=0)
//                                                      -> payload f32[8+ceil(n/15)], status
//   kvx_ternary_encode_sum(grad, residual*; threshold, num_workers, value=0)
//                                                      -> words f32[ceil(n/D)], status
//   kvx_ternary_decode_sum(words f32; threshold, num_workers, shape)
//                                                      -> out f32[shape], status
//   kvx_adacomp_encode(grad, residual*; bin, capacity) -> payload f32[8+capacity*E], status
//                                  (E = 1 word an entry, 2 above 2^23 elements)
//   kvx_element_topk_encode(grad, residual*; k)        -> payload f32[8+k*E], status
//                                  (E = 2 words an entry, 3 above 2^24 elements)
//   kvx_thc_norm(grad, residual; rank, num_workers)    -> slots f32[W] (norm at rank), status
//   kvx_thc_encode(grad, residual*, norms f32[W]; levels, clamp, seed, block, step, rank,
//                  table=0)                            -> words f32[ceil(d/D)], status
//   kvx_thc_decode_sum(words, norms f32[W]; levels, clamp, seed, block, step, shape,
//                      table=0)                        -> out f32[shape], status
//   kvx_thc_rotate(x, norms; seed, step, block)        -> z f32[d], status
//   kvx_thc_unrotate(z, norms; seed, step, block, shape) -> out f32[shape], status
//   kvx_thc_quantize(z; levels, clamp, seed, step, rank, num_workers, table=0)
//                                                      -> words f32[ceil(d/D)], status
//   kvx_thc_dequantize(words; levels, clamp, num_workers, summed, size, table=0)
//                                                      -> values f32[size], status
//                                  (d = padded size, D digits a word, table 0 uniform,
//                                   1 THC's non-uniform table: cpp/codecs/thc.h)
//   kvx_decode_slots(slots f32[W, S]; size)            -> sum f32[size], status f32[W]
//   kvx_rows_dense(rows f32[R, C] (row_sparse or dense); size) -> out f32[size]
//   kvx_after(before, x*)  (any dtypes)                -> f32[1], zero; x is unchanged
//
// `*` marks an input updated in place (setMutateInputs).  An encoder whose payload has a
// header (fp32, topk, ternary, adacomp, element_topk, outer), and the additive encoders
// of the homomorphic mode (topk_gather, ternary_encode_sum), return a void payload on
// failure: first word NaN, the rest zero (op_util.h, set_encoded); the additive decoders
// (topk_scatter, ternary_decode_sum) decode a sum whose first word is NaN to NaN
// everywhere with status kVoid (op_util.h, void_sum).  O = shape[0] of the tensor,
// F = size / O.  Status values are those of cpp/wire.h, as float32.  Inputs of any rank
// are read as flat arrays.  Decoders never fail on a malformed payload: they return zeros
// and a non-zero status, so that a server cannot be brought down by what it receives.
#include <algorithm>
#include <limits>
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

// An encoder of acc = grad + residual: outputs (payload, status), the residual updated
// in place.
struct Encoder : OpSpec {
  static constexpr const char* inputs[] = {"grad", "residual"};
  static constexpr int outputs = 2;
  static constexpr bool updates_second = true;
};

// The count attribute `attr` (k, capacity) of an op on grad fits its n elements.
bool count_fits(const char* op, const char* attr, int64_t count, const Shape& grad) {
  const int64_t n = product(grad);
  if (count <= n) return true;
  MX_ERROR_MSG << op << ": " << attr << "=" << count << " exceeds the " << n
               << " elements of grad " << shape_string(grad);
  return false;
}

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

// Statistics of acc = grad + residual without forming acc (one pass, no temporary): what
// each worker contributes to the homomorphic agreement (kvstore_ext/codecs/additive.py).
struct AccStat : OpSpec {
  static constexpr const char* inputs[] = {"grad", "residual"};
  static constexpr int outputs = 1;
};

struct AccFilterScores : AccStat {
  static constexpr const char* name = "kvx_acc_filter_scores";
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    if (!residual_shape(name, in)) return false;
    (*out)[0] = Shape{in[0][0]};
    return true;
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    int64_t filters, filter_size;
    filters_of(in[0].shape, &filters, &filter_size);
    std::vector<double> scores(static_cast<size_t>(filters));
    kvx::acc_filter_scores(f32(in[0]), f32(in[1]), filters, filter_size, scores.data());
    float* result = f32(out[0]);
    for (int64_t o = 0; o < filters; ++o) result[o] = static_cast<float>(scores[o]);
  }
};

struct AccAbsSum : AccStat {
  static constexpr const char* name = "kvx_acc_abs_sum";
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = Shape{1};
    return residual_shape(name, in);
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    const int64_t n = product(in[0].shape);
    f32(out[0])[0] = static_cast<float>(kvx::acc_abs_sum(f32(in[0]), f32(in[1]), n));
  }
};

// max |acc|: the homomorphic FC's delivery cap (codecs/additive.py) sums it over workers.
struct AccAbsMax : AccStat {
  static constexpr const char* name = "kvx_acc_abs_max";
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = Shape{1};
    return residual_shape(name, in);
  }
  static void forward(const Params&, Tensors& in, Tensors& out) {
    f32(out[0])[0] = kvx::acc_abs_max(f32(in[0]), f32(in[1]), product(in[0].shape));
  }
};

struct ScaleParams {
  double scale = 1.0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"scale"}, error) &&
           get_real(attrs, "scale", 0.0, false, false, 1.0, &scale, error);
  }
};

// [sum|acc|, sum and count of |acc| >= this worker's own t]: the 'mean' agreement.
struct AccAbsStats : AccStat {
  static constexpr const char* name = "kvx_acc_abs_stats";
  using Params = ScaleParams;
  static bool shape(const Params&, const Shapes& in, Shapes* out) {
    (*out)[0] = Shape{3};
    return residual_shape(name, in);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    double stats[3];
    kvx::acc_abs_stats(f32(in[0]), f32(in[1]), product(in[0].shape), p.scale, stats);
    for (int i = 0; i < 3; ++i) f32(out[0])[i] = static_cast<float>(stats[i]);
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

// ---- ternary --------------------------------------------------------------------------

struct TernaryParams {
  double scale = 1.0, threshold = 0.0;
  int64_t value_rule = kvx::kValueThreshold;  // kvx::TernaryValueRule
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"scale", "threshold", "value_rule"}, error) &&
           get_real(attrs, "scale", 0.0, false, false, 1.0, &scale, error) &&
           get_real(attrs, "threshold", 0.0, false, false, 0.0, &threshold, error) &&
           (!has(attrs, "value_rule") ||
            get_int(attrs, "value_rule", kvx::kValueThreshold, kvx::kValueRound, &value_rule,
                    error));
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

// ---- outer products (dAD, rank-dAD) ------------------------------------------------------

// kvx_outer_encode(u, v; capacity) -> (payload, status): u (rows x out) and v (rows x in)
// behind the header, padded with zero rows to `capacity` (the key's fixed size).
struct OuterParams {
  int64_t capacity = 0;
  bool parse(const Attrs& attrs, std::string* error) {
    return check_keys(attrs, {"capacity"}, error) &&
           get_int(attrs, "capacity", 1, kvx::kExactF32, &capacity, error);
  }
};

struct OuterEncode : OpSpec {
  static constexpr const char* name = "kvx_outer_encode";
  static constexpr const char* inputs[] = {"u", "v"};
  static constexpr int outputs = 2;
  using Params = OuterParams;
  static bool shape(const Params& p, const Shapes& in, Shapes* out) {
    if (in[0].size() != 2 || in[1].size() != 2 || in[0][0] != in[1][0] || in[0][1] < 1 ||
        in[1][1] < 1) {
      MX_ERROR_MSG << name << ": u (rows x out) and v (rows x in) must be 2-D with the same "
                   << "rows, got " << shape_string(in[0]) << " and " << shape_string(in[1]);
      return false;
    }
    if (in[0][0] > p.capacity) {
      MX_ERROR_MSG << name << ": " << in[0][0] << " rows exceed capacity=" << p.capacity;
      return false;
    }
    (*out)[1] = Shape{1};
    return flat_shape(name, kvx::outer_payload_words(in[0][1] * in[1][1], p.capacity, in[0][1]),
                      &(*out)[0]);
  }
  static void forward(const Params& p, Tensors& in, Tensors& out) {
    const int code = kvx::outer_encode(f32(in[0]), f32(in[1]), in[0].shape[0], p.capacity,
                                       in[0].shape[1], in[1].shape[1], f32(out[0]));
    set_encoded(out[0], out[1], code);
  }
};

// ---- THC ------------------------------------------------------------------------------
//
// The scheme's four steps (kvstore_ext/codecs/thc.py) and, for the differential tests
// and the benchmark, its pieces: the randomized Hadamard transform and its inverse,
// quantise-and-pack, unpack-and-dequantise.  `norms` is the summed norm round (one slot
// per worker): M = max(norms), num_workers = its length.  `table` (optional, 0) is a
// table id of cpp/codecs/thc.h: 0 uniform, 1 THC's non-uniform table (levels = 16).

// Attributes shared by the THC ops; each op states which it reads.
struct ThcAttrs {
  kvx::ThcParams p;
  int64_t step = 0, rank = 0, num_workers = 0, summed = 0, size = 0;
  std::vector<int64_t> shape;
  bool quantiser(const Attrs& attrs, std::string* error) {  // levels, clamp, table=0
    return get_int(attrs, "levels", 2, kvx::kExactF32, &p.levels, error) &&
           get_real(attrs, "clamp", 0.0, true, true, 0.0, &p.clamp, error) &&
           (!has(attrs, "table") ||
            get_int(attrs, "table", 0, kvx::kThcTableCount - 1, &p.table, error));
  }
  bool seed_only(const Attrs& attrs, std::string* error) {
    int64_t seed = 0;
    if (!get_int(attrs, "seed", 0, int64_t{1} << 53, &seed, error)) return false;
    p.seed = static_cast<uint64_t>(seed);
    return true;
  }
  bool block(const Attrs& attrs, std::string* error) {
    return get_int(attrs, "block", kvx::kThcMinBlock, kvx::kThcMaxBlock, &p.block, error);
  }
  bool codec(const Attrs& attrs, std::string* error) {  // quantiser, seed, block
    return quantiser(attrs, error) && seed_only(attrs, error) && block(attrs, error);
  }
  bool get_step(const Attrs& attrs, std::string* error) {
    return get_int(attrs, "step", 0, kvx::kThcMaxStep - 1, &step, error);
  }
};

bool thc_valid(const char* op, const kvx::ThcParams& p, int64_t num_workers) {
  if (kvx::thc_params_valid(p, num_workers)) return true;
  MX_ERROR_MSG << op << ": levels=" << p.levels << ", table=" << p.table << ", clamp="
               << p.clamp << ", block=" << p.block << " and num_workers=" << num_workers
               << " need levels=" << kvx::kThcTableThcLevels << " for table="
               << kvx::kThcTableThc << ", a base g times num_workers plus 1 <= 2^24 (g = "
               << "levels-1, or " << kvx::kThcTableThcGrid << " for table=" << kvx::kThcTableThc
               << "), a power-of-two block and 0 < clamp <= " << kvx::kThcMaxClamp;
  return false;
}

// (norms): a non-empty vector, its length the worker count.
bool thc_norms(const char* op, const Shape& norms, int64_t* num_workers) {
  if (norms.size() != 1 || norms[0] < 1 || norms[0] > kvx::kThcMaxWorkers) {
    MX_ERROR_MSG << op << ": norms must be a vector of one norm per worker, got "
                 << shape_string(norms);
    return false;
  }
  *num_workers = norms[0];
  return true;
}

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

KVX_REGISTER_OP(FiniteCheck);
KVX_REGISTER_OP(Fp32Encode);
KVX_REGISTER_OP(OuterEncode);
KVX_REGISTER_OP(TopkEncode);
KVX_REGISTER_OP(AccFilterScores);
KVX_REGISTER_OP(AccAbsSum);
KVX_REGISTER_OP(AccAbsMax);
KVX_REGISTER_OP(AccAbsStats);
KVX_REGISTER_OP(TopkGather);
KVX_REGISTER_OP(TopkScatter);
KVX_REGISTER_OP(TernaryEncode);
KVX_REGISTER_OP(TernaryEncodeSum);
KVX_REGISTER_OP(TernaryDecodeSum);
KVX_REGISTER_OP(AdacompEncode);
KVX_REGISTER_OP(ElementTopkEncode);
KVX_REGISTER_OP(ThcNorm);
KVX_REGISTER_OP(ThcRotate);
KVX_REGISTER_OP(ThcUnrotate);
KVX_REGISTER_OP(ThcQuantize);
KVX_REGISTER_OP(ThcDequantize);
KVX_REGISTER_OP(ThcEncode);
KVX_REGISTER_OP(ThcDecodeSum);
KVX_REGISTER_OP(DecodeSlots);
KVX_REGISTER_OP(RowsDense);
KVX_REGISTER_OP(After);

// lib_api v11 ships with MXNet 1.7+; MXNet passes its version as 10000*major + 100*minor.
MXReturnValue initialize(int version) {
  if (version >= 10700) return MX_SUCCESS;
  MX_ERROR_MSG << "kvx_ops needs MXNet >= 1.7 (lib_api v11), found version " << version;
  return MX_FAIL;
}
