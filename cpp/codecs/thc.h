// THC (Tensor Homomorphic Compression): a randomized Hadamard transform with a scale
// every worker shares, stochastic rounding to q integer levels, and the integers packed
// into float32 words that MXNet's stock server adds exactly; workers decode the sum.
// The spec, step by step and bit for bit, is python/kvx_ref/thc.py; the scheme is
// kvstore_ext/schemes/thc.py and docs/schemes/thc.md.
//
// A chunk of n elements is cut into Hadamard blocks (thc_blocks): `block` elements while
// that many are left, then the largest power of two that fits, down to kThcMinBlock; a
// tail below that is padded to the next power of two.  d = the padded size.
//
// Quantisation tables: q sorted integers t[0] = 0 < t[1] < ... < t[q-1] = g on a grid of
// g; entry value j stands for the coordinate (j - g/2) 2T/g.  The uniform table is
// t[k] = k, g = q - 1; THC's non-uniform table (its authors' code; table id
// kThcTableThc) is kThcTableThcValues, q = 16 on g = 30.  A coordinate is rounded between the two entries around it, and the
// digit sent is the entry's value (not its index): values add, indices would not.  The
// sum of num_workers digits lies in [0, num_workers g], so digits travel in base
// b = num_workers g + 1, D a word with b^D <= 2^24: the sum of num_workers payloads, in
// any order, is an integer below 2^24 in every partial sum.
//
// Randomness is counter-based, a pure function of (seed, step, who): SplitMix64's
// finaliser makes the stream keys; who = 0 gives the Hadamard signs every worker shares
// (one 64-bit hash per 64 positions), who = rank + 1 a worker's own dither (a 32-bit hash
// per position).  Nothing random is kept between calls.
#ifndef KVX_CODECS_THC_H_
#define KVX_CODECS_THC_H_

#include <cstdint>

namespace kvx {

constexpr int64_t kThcMinBlock = 256;
constexpr int64_t kThcMaxBlock = int64_t{1} << 24;
constexpr int64_t kThcMaxWorkers = int64_t{1} << 20;
constexpr int64_t kThcMaxLevels = int64_t{1} << 16;  // digits are kept as uint16
constexpr int64_t kThcMaxStep = int64_t{1} << 24;   // the step travels as a float32 count
constexpr double kThcMaxClamp = 1.0e4;               // T: coordinates are about N(0, 1)

// Table ids (ThcParams::table, the ops' `table` attribute).
constexpr int64_t kThcTableUniform = 0;  // t[k] = k, g = q - 1
constexpr int64_t kThcTableThc = 1;      // kThcTableThcValues: q = 16 only
constexpr int64_t kThcTableCount = 2;
// THC's non-uniform table: 16 entries of a grid of 30, denser near 0 (where N(0, 1)
// coordinates are); the authors pair it with T = Phi^-1(1 - 1/64) = 2.1539.
constexpr int64_t kThcTableThcLevels = 16;
constexpr int64_t kThcTableThcGrid = 30;
constexpr int64_t kThcTableThcValues[kThcTableThcLevels] = {
    0, 3, 5, 7, 9, 11, 13, 14, 16, 17, 19, 21, 23, 25, 27, 30};

// What every worker encodes with (the same on all of them).
struct ThcParams {
  int64_t levels = 16;        // q >= 2: entries of the table
  int64_t table = kThcTableUniform;  // a table id: which integers the levels are
  double clamp = 2.5;         // T: transformed coordinates are clamped to [-T, T]
  uint64_t seed = 0;
  int64_t block = 65536;      // largest Hadamard block: a power of two >= kThcMinBlock
};

// True if the table is known (kThcTableThc: levels = 16), the parameters and the
// worker count give a base b <= 2^24 and T is a finite float32 in (0, kThcMaxClamp].
bool thc_params_valid(const ThcParams& p, int64_t num_workers);
// g, the table's grid: levels - 1 (uniform), kThcTableThcGrid (thc); 0 for an unknown
// table or the thc table with levels != 16.
int64_t thc_grid(const ThcParams& p);
// Entry k of the table (k in [0, levels)); -1 if the table is unknown or k out of range.
int64_t thc_table_value(const ThcParams& p, int64_t k);

// Hadamard blocks of n elements: writes up to `max_blocks` sizes, returns the count
// (0 if block is not a power of two in [kThcMinBlock, kThcMaxBlock]).
int64_t thc_blocks(int64_t n, int64_t block, int64_t* sizes, int64_t max_blocks);
// d, the padded size (0 if block is invalid).
int64_t thc_padded_size(int64_t n, int64_t block);
// b = num_workers * g + 1 (0 if the table is invalid).
int64_t thc_sum_base(const ThcParams& p, int64_t num_workers);
// float32 words that hold d digits packed for num_workers (0 if the table is invalid or
// the base exceeds 2^24).
int64_t thc_packed_words(int64_t d, const ThcParams& p, int64_t num_workers);
// float32 words of one worker's payload (and of the sum); 0 if the parameters are invalid.
int64_t thc_sum_words(int64_t n, const ThcParams& p, int64_t num_workers);
// M = the largest of `count` norms; false if count < 1 or a norm is NaN, Inf or < 0.
bool thc_max_norm(const float* norms, int64_t count, float* m);

// SplitMix64's finaliser of z + golden ratio, and the key of stream `who`.
uint64_t thc_mix64(uint64_t z);
uint64_t thc_stream(uint64_t seed, uint64_t step, uint64_t who);

// The unnormalised Walsh-Hadamard transform of `size` (a power of two) floats, in place:
// butterflies (a + b, a - b) at strides 1, 2, 4, ... in float32.  Applied twice it
// multiplies by size.
void thc_fwht(float* x, int64_t size);

// ||grad + residual||_2: float64 sum of squares in NumPy's order, square root, rounded
// to float32 and capped at float32's largest value.  kNonFinite (norm NaN: the summed
// norms void the step on every worker) if an element of grad + residual is NaN or +-Inf.
int thc_norm(const float* grad, const float* residual, int64_t n, float* norm);

// z[0, d): x zero-padded to d, each block b multiplied in float32 by
// s_b = float32(min(sqrt(d) / (M sqrt(B_b)), FLT_MAX)), clamped to
// +-float32(2 sqrt(d / B_b)) (a guard: never reached when M >= ||x||), multiplied by the
// shared signs, then transformed.
// M = max_norm >= 0 (0: z = 0).  kBadParam if block, step or M is invalid (z zeroed if
// the block, hence d, is valid).
int thc_rotate(const float* x, int64_t n, float max_norm, uint64_t seed, int64_t step,
               int64_t block, float* z);
// The inverse: out[0, n) = signs * fwht(z * r_b), r_b = float32(M / (sqrt(d) sqrt(B_b)))
// (float32 product), the padding dropped.  z (d floats) is left untouched; out is zeroed on kBadParam.
int thc_unrotate(const float* z, int64_t n, float max_norm, uint64_t seed, int64_t step,
                 int64_t block, float* out);

// Digits of z[0, d): clamp to [-T, T], p = min((z + T) * float32(g / (2T)), g) (float32),
// j = the interval t[j] <= p <= t[j+1] (j <= q - 2), w = t[j+1] - t[j], digit = t[j] +
// w (u < float32(p - t[j]) / w) with u worker `rank`'s 24-bit uniform (u_i = top 24 bits
// of lowbias32(k + i), k = the 64-bit stream key folded to 32 bits); packed base
// thc_sum_base(p, num_workers) into thc_packed_words words.  For the uniform table this
// is floor(p) + (u < frac(p)).  kBadParam on invalid parameters, kNonFinite on a NaN in z
// (words untouched).
int thc_quantize(const float* z, int64_t d, const ThcParams& p, int64_t num_workers,
                 int64_t rank, int64_t step, float* words);
// The float32 value of each of the d sums of `summed` workers' digits held by `words`
// (packed for num_workers): S * 2T / g - summed * T in float64.  kBadParam if the word
// count or a parameter (the table included) is wrong, kBadWord if a word is not an
// integer in [0, b^D); values are zeroed then.
int thc_dequantize(const float* words, int64_t num_words, int64_t d, const ThcParams& p,
                   int64_t num_workers, int64_t summed, float* values);

// One worker's step: acc = grad + residual, M = max(norms[0, num_workers)), rotate,
// quantize, pack into thc_sum_words words; the residual becomes acc minus the decoding
// of this worker's own digits, unrotate(level(digit)) (error feedback).  A void step
// leaves the residual untouched and sends NaN words (a void payload, whose sum is NaN
// on every worker): kNonFinite if acc has a NaN/Inf, kVoid if a norm is NaN (a worker's
// gradient was non-finite).  kBadParam if a parameter, the rank, the step or a norm
// (< 0, Inf) is invalid: words zeroed (when their count is known), residual untouched.
int thc_encode(const float* grad, float* residual, int64_t n, const float* norms,
               int64_t num_workers, int64_t rank, int64_t step, const ThcParams& p,
               float* words);
// The sum over num_workers workers of n elements from the server's sum of their words:
// unrotate(level sums).  Checks everything first (as thc_dequantize, and the norms);
// out is zeroed on error.  A NaN norm (a void step) gives NaN everywhere and kVoid.
int thc_decode_sum(const float* words, int64_t num_words, int64_t n, const float* norms,
                   int64_t num_workers, int64_t step, const ThcParams& p, float* out);

}  // namespace kvx

#endif  // KVX_CODECS_THC_H_
