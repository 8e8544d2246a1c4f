// Codec kernels of kvstore_ext: plain C++ on raw, contiguous arrays.
//
// No MXNet, no Python.  Every function is one job on typed pointers and element counts;
// the executable spec is python/kvx_ref/{wire,codecs}.py and every kernel reproduces it
// bit for bit (same float32 / float64 roundings, same summation order where a sum is
// rounded).  Encoders take `grad` and the worker's `residual` (updated in place) and form
// acc = grad + residual in float32.  Encoders and decoders return a Status; on any
// non-zero status the outputs are zero-filled and the residual / accumulator is left
// untouched, so a bad step or a malformed payload never propagates.
//
// `grad` and `residual` may alias (every element is read before it is written); outputs
// must not alias inputs.
#ifndef KVX_KERNELS_H_
#define KVX_KERNELS_H_

#include <cstdint>

namespace kvx {

// ---- wire format (python/kvx_ref/wire.py) -------------------------------------------

enum Status : int {
  kOk = 0,
  kNonFinite = 1,
  kBadMagic = 2,
  kBadVersion = 3,
  kBadCodec = 4,
  kBadSize = 5,
  kBadParam = 6,
  kBadIndex = 7,
  kBadWord = 8,
};

const char* status_name(int status);

constexpr float kMagic = 7340.0f;
constexpr float kVersion = 1.0f;
constexpr int64_t kHeaderWords = 8;
constexpr float kCodecFp32 = 1.0f;
constexpr float kCodecTopk = 2.0f;
constexpr float kCodecTernary = 3.0f;

constexpr int kMantissaF32 = 24;             // integers are exact in float32 below 2^24
constexpr int64_t kExactF32 = int64_t{1} << kMantissaF32;

constexpr int64_t kTernaryBase = 3;
constexpr int kTernaryDigits = 15;           // 3^15 <= 2^24 < 3^16
constexpr int kTwoBitPerWord = 16;           // MXNet's 2-bit layout
// Keeps the homomorphic base 2n+1 below 2^24: at least one digit a float32 word.
constexpr int64_t kMaxWorkers = 1 << 20;

// Largest D with base^D <= 2^mantissa_bits (0 if base < 2 or base > 2^mantissa_bits).
int digits_per_word(int64_t base, int mantissa_bits);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Sizes in words of every payload, for callers that allocate outputs.
inline int64_t fp32_payload_words(int64_t n) { return kHeaderWords + n; }
inline int64_t topk_payload_words(int64_t k, int64_t filter_size) {
  return kHeaderWords + k + k * filter_size;
}
inline int64_t ternary_payload_words(int64_t n) {
  return kHeaderWords + ceil_div(n, kTernaryDigits);
}
inline int64_t sum_base(int64_t num_workers) { return 2 * num_workers + 1; }
// Words of a homomorphic ternary payload; 0 when num_workers is out of range.
int64_t ternary_sum_words(int64_t n, int64_t num_workers);
inline int64_t twobit_words(int64_t n) { return ceil_div(n, kTwoBitPerWord); }

// Writes the 8-word header; n is split in two words so that both stay exact.
void write_header(float* payload, float codec, int64_t n, float a, float b,
                  int64_t body_words);
// Checks magic, version, codec, element count and body length against what the
// receiver expects; returns the status and the two codec parameters.
int check_header(const float* payload, int64_t payload_words, float codec, int64_t n,
                 float* a, float* b);

// ---- statistics ---------------------------------------------------------------------

// True when no element is NaN or +-Inf.
bool all_finite(const float* x, int64_t n);
// True when no element of grad + residual (in float32) is NaN or +-Inf.
bool acc_all_finite(const float* grad, const float* residual, int64_t n);
// sum |grad + residual| accumulated in float64, in NumPy's order (see kernels.cc), so
// that it equals np.abs(acc.astype(np.float64)).sum() exactly.  Non-finite iff some
// acc element is non-finite.
double acc_abs_sum(const float* grad, const float* residual, int64_t n);
// t = float32(scale * (abs_sum / n)), the spec's adaptive threshold.
float adaptive_threshold(double abs_sum, int64_t n, double scale);
// Squared L2 norm of each of the `filters` rows of `filter_size` elements, in float64,
// summed in NumPy's order.
void filter_scores(const float* x, int64_t filters, int64_t filter_size, double* scores);
void acc_filter_scores(const float* grad, const float* residual, int64_t filters,
                       int64_t filter_size, double* scores);
// Indices of the k largest scores (ties to the lower index), written ascending.
// Scores must be comparable (no NaN).  1 <= k <= filters.
void topk_select(const double* scores, int64_t filters, int64_t k, int64_t* indices);

// ---- fp32 pass-through --------------------------------------------------------------

// payload: fp32_payload_words(n) words.
int fp32_encode(const float* grad, int64_t n, float* payload);
int fp32_decode(const float* payload, int64_t payload_words, int64_t n, float* out);
int fp32_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc);

// ---- conv filter selection (Hylo top-k) ---------------------------------------------

// The tensor is `filters` x `filter_size` (shape[0] x the rest).  payload:
// topk_payload_words(k, filter_size) words: header (a = k, b = filter_size), k indices
// ascending, then the k selected filters of acc.  New residual: acc with them zeroed.
int topk_encode(const float* grad, float* residual, int64_t filters, int64_t filter_size,
                int64_t k, float* payload);
int topk_decode(const float* payload, int64_t payload_words, int64_t n, float* out);
// acc[sent filters] += values (other elements are not touched).
int topk_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc);

// Homomorphic variant: the filter set `indices` (k float32 integers, strictly ascending,
// in [0, filters)) is agreed beforehand; kBadIndex (values zeroed, residual untouched)
// otherwise.  values: k * filter_size.
int topk_gather(const float* grad, float* residual, int64_t filters, int64_t filter_size,
                const float* indices, int64_t k, float* values);
// out (filters x filter_size) = 0 except the rows `indices`, which get `values`.
// kBadIndex (out zeroed) if the indices are not as for topk_gather.
int topk_scatter(const float* values, const float* indices, int64_t k, int64_t filters,
                 int64_t filter_size, float* out);

// ---- ternary (Hylo FC) --------------------------------------------------------------

// t = float32(threshold) if threshold > 0, else adaptive_threshold(.., scale); an
// adaptive t that overflows float32 is kNonFinite (residual untouched), a fixed one that
// does is kBadParam.  payload: ternary_payload_words(n) words.
// mean_value (issue 9): a nonzero code stands for the mean |acc| of the selected values
// (|acc| >= t), the least-squares value of the selected set, instead of t; the header
// carries that value, so decoders are unchanged.
int ternary_encode(const float* grad, float* residual, int64_t n, double scale,
                   double threshold, float* payload, bool mean_value = false);
float acc_mean_above(const float* grad, const float* residual, int64_t n, float t);
int ternary_decode(const float* payload, int64_t payload_words, int64_t n, float* out);
int ternary_decode_add(const float* payload, int64_t payload_words, int64_t n, float* acc);

// Homomorphic ternary: fixed t, codes + 1 packed in base b = 2n+1 (n = num_workers) into
// float32 words, D digits a word with b^D <= 2^24, no header.  Float32 because MXNet's
// dist server sums float64 pushes in float32; the sum of n workers' words, in any order,
// stays an integer below b^D, exact in float32.  words: ternary_sum_words(n, num_workers).
// value > 0 (issue 9): selection by |acc| >= threshold, but a code stands for value
// (the residual keeps acc - code * value; decode the sum with threshold = value).
int ternary_encode_sum(const float* grad, float* residual, int64_t n, double threshold,
                       int64_t num_workers, float* words, double value = 0.0);
// Decodes the element-wise sum of num_workers payloads: out = (sum of codes) * t.
// kBadParam if num_words or a parameter is wrong, kBadWord if a word is not an integer
// in [0, b^D); out is zeroed then.
int ternary_decode_sum(const float* words, int64_t num_words, double threshold,
                       int64_t num_workers, int64_t n, float* out);

// ---- server-decode aggregation ----------------------------------------------------------

// What a parameter server does with one key in server-decode mode: `workers` slots of
// `slot_words` floats each hold one payload (header first, then padding).  Every slot is
// decoded (fp32, top-k or ternary, by its header's codec id) and added into acc, which
// has `capacity` elements; the payloads must agree on codec and element count n
// (<= capacity).  acc is zeroed first; status[w] is slot w's status (0 = ok).  Returns
// the first non-zero status, or kOk.
int decode_slots(const float* slots, int64_t workers, int64_t slot_words, float* acc,
                 int64_t capacity, float* status);

// ---- MXNet's built-in 2-bit layout --------------------------------------------------

// 16 values per 32-bit word, 11 = +t, 10 = -t, 00 = 0, MXNet's bit order.  Like MXNet
// it does not check for non-finite values.  words: twobit_words(n).
int twobit_encode(const float* grad, float* residual, int64_t n, double threshold,
                  uint32_t* words);
int twobit_decode(const uint32_t* words, int64_t n, double threshold, float* out);

}  // namespace kvx

#endif  // KVX_KERNELS_H_
