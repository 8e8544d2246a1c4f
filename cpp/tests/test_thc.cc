// Unit tests of the THC kernels (cpp/codecs/thc.h), no MXNet needed, and a seeded fuzz
// of the decoders a worker runs on the server's sum (thc_decode_sum, thc_dequantize).
// CMake builds this twice: plain (runtime-dispatched clones) and under AddressSanitizer
// + UndefinedBehaviorSanitizer, so that an out-of-bounds access or a bad float-to-int
// conversion on a malformed sum is a failure.  Exit status = failed checks (capped).
// Differential tests against the NumPy reference are in tests/test_thc.py.
//
// Usage: test_thc [fuzz_cases] [seed]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../kernels.h"
#include "check.h"

namespace {

using namespace kvx_test;  // NOLINT: the checks and their helpers
using kvx::ThcParams;

bool all_zero(const Floats& a) {
  for (float v : a)
    if (v != 0.0f || std::signbit(v)) return false;
  return true;
}

// Every value == 0 (-0.0 allowed: zeros times a negative sign).
bool all_nan(const Floats& a) {
  for (float v : a)
    if (!std::isnan(v)) return false;
  return true;
}

bool all_zero_value(const Floats& a) {
  for (float v : a)
    if (v != 0.0f) return false;
  return true;
}

bool all_finite(const Floats& a) {
  for (float v : a)
    if (!std::isfinite(v)) return false;
  return true;
}

double norm2(const Floats& a) {
  double s = 0.0;
  for (float v : a) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

ThcParams params(int64_t levels = 16, double clamp = 2.5, uint64_t seed = 7,
                 int64_t block = 1024, int64_t table = kvx::kThcTableUniform) {
  ThcParams p;
  p.levels = levels;
  p.clamp = clamp;
  p.seed = seed;
  p.block = block;
  p.table = table;
  return p;
}

// THC's non-uniform table at its clamp.
ThcParams thc_table(double clamp = 2.1539, uint64_t seed = 7, int64_t block = 1024) {
  return params(16, clamp, seed, block, kvx::kThcTableThc);
}

// The norm round: every worker's norm in its slot, summed (slots are disjoint: exact).
Floats norm_round(const std::vector<Floats>& grads, const std::vector<Floats>& residuals) {
  Floats norms(grads.size(), 0.0f);
  for (size_t w = 0; w < grads.size(); ++w) {
    float norm = -1.0f;
    CHECK_EQ(kvx::thc_norm(grads[w].data(), residuals[w].data(),
                           static_cast<int64_t>(grads[w].size()), &norm), kvx::kOk);
    norms[w] = norm;
  }
  return norms;
}

// ---- layout and randomness ----------------------------------------------------------

void test_layout() {
  g_test = "layout";
  int64_t sizes[8];
  CHECK_EQ(kvx::thc_blocks(40000, 65536, sizes, 8), 5);
  CHECK(sizes[0] == 32768 && sizes[1] == 4096 && sizes[2] == 2048 && sizes[3] == 1024 &&
        sizes[4] == 64);
  CHECK_EQ(kvx::thc_padded_size(40000, 65536), 40000);
  CHECK_EQ(kvx::thc_blocks(70000, 65536, sizes, 8), 4);   // 65536 4096 256 128 (112 + 16)
  CHECK_EQ(kvx::thc_padded_size(70000, 65536), 70016);
  CHECK_EQ(kvx::thc_blocks(300, 65536, sizes, 8), 2);
  CHECK(sizes[0] == 256 && sizes[1] == 64);
  CHECK_EQ(kvx::thc_padded_size(3, 65536), 4);
  CHECK_EQ(kvx::thc_padded_size(1, 65536), 1);
  CHECK_EQ(kvx::thc_padded_size(1 << 20, 65536), 1 << 20);
  CHECK_EQ(kvx::thc_blocks(5000, 100, sizes, 8), 0);       // not a power of two
  CHECK_EQ(kvx::thc_blocks(5000, 128, sizes, 8), 0);       // below kThcMinBlock
  // padding is always below kThcMinBlock; every block but the tail starts at a multiple
  // of 256 (apply_signs takes one hash per 64 positions)
  std::mt19937 rng(3);
  for (int c = 0; c < 500; ++c) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 3000000);
    const int64_t block = int64_t{256} << (rng() % 10);
    std::vector<int64_t> s(100000);
    const int64_t count = kvx::thc_blocks(n, block, s.data(), static_cast<int64_t>(s.size()));
    int64_t d = 0;
    bool ok = count > 0;
    for (int64_t b = 0; b < count; ++b) {
      ok = ok && s[b] > 0 && (s[b] & (s[b] - 1)) == 0 && s[b] <= block;
      ok = ok && (d % 256 == 0);
      d += s[b];
    }
    CHECK(ok);
    CHECK(d >= n && d - n < kvx::kThcMinBlock);
    CHECK_EQ(kvx::thc_padded_size(n, block), d);
  }
  // words: q = 16 and 4 workers: base 61, 4 digits a word (61^4 < 2^24 < 61^5)
  CHECK_EQ(kvx::thc_sum_base(params(16), 4), 61);
  CHECK_EQ(kvx::thc_sum_words(40000, params(16, 2.5, 0, 65536), 4), 10000);
  CHECK_EQ(kvx::thc_sum_words(40000, params(16, 2.5, 0, 65536), 2), 10000);   // base 31: 4
  CHECK_EQ(kvx::thc_sum_words(40000, params(16, 2.5, 0, 65536), 8), 13334);   // base 121: 3
  CHECK_EQ(kvx::thc_sum_words(40000, params(16, 2.5, 0, 65536), 1), 6667);    // base 16: 6
  CHECK_EQ(kvx::thc_sum_words(10, params(16, 2.5, 0, 65536), 1118482), 0);    // base > 2^24
}

void test_randomness() {
  g_test = "randomness";
  // SplitMix64 from state 0: its first output is 0xE220A8397B1DCDAF (published value)
  CHECK(kvx::thc_mix64(0) == 0xE220A8397B1DCDAFull);
  CHECK(kvx::thc_stream(1, 0, 0) != kvx::thc_stream(1, 1, 0));
  CHECK(kvx::thc_stream(1, 0, 0) != kvx::thc_stream(1, 0, 1));
  CHECK(kvx::thc_stream(1, 0, 0) != kvx::thc_stream(2, 0, 0));
}

// ---- the transform -------------------------------------------------------------------

void test_fwht() {
  g_test = "fwht";
  Floats a = {1, 2, 3, 4};
  kvx::thc_fwht(a.data(), 4);
  CHECK(a == (Floats{10, -2, -4, 0}));
  Floats one = {1, 0, 0, 0, 0, 0, 0, 0};
  kvx::thc_fwht(one.data(), 8);
  CHECK(one == Floats(8, 1.0f));
  // against the Hadamard matrix H_ij = (-1)^popcount(i & j), small integers (exact)
  for (int64_t size : {1, 2, 16, 64, 512}) {
    std::mt19937 rng(static_cast<uint32_t>(size));
    Floats x(static_cast<size_t>(size));
    for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 21) - 10);
    Floats want(x.size(), 0.0f);
    for (int64_t i = 0; i < size; ++i)
      for (int64_t j = 0; j < size; ++j)
        want[i] += (__builtin_popcountll(static_cast<uint64_t>(i & j)) & 1 ? -1.0f : 1.0f) * x[j];
    Floats got = x;
    kvx::thc_fwht(got.data(), size);
    CHECK(got == want);
    kvx::thc_fwht(got.data(), size);                    // H H = size I
    for (int64_t i = 0; i < size; ++i) CHECK_EQ(got[i], x[i] * static_cast<float>(size));
  }
}

void test_rotate() {
  g_test = "rotate";
  for (int64_t n : {1, 3, 255, 256, 300, 5000, 70000}) {
    const Floats x = randn(static_cast<size_t>(n), static_cast<uint32_t>(n), 0.3f);
    const Floats zero(x.size(), 0.0f);
    float m = 0.0f;
    CHECK_EQ(kvx::thc_norm(x.data(), zero.data(), n, &m), kvx::kOk);
    CHECK(std::fabs(m - norm2(x)) <= 1e-6 * norm2(x));
    const int64_t d = kvx::thc_padded_size(n, 4096);
    Floats z(static_cast<size_t>(d));
    CHECK_EQ(kvx::thc_rotate(x.data(), n, m, 11, 5, 4096, z.data()), kvx::kOk);
    // orthogonal up to the scale: ||z||^2 = d ||x||^2 / M^2 = d when M = ||x||
    CHECK(std::fabs(norm2(z) * norm2(z) / static_cast<double>(d) - 1.0) < 1e-4);
    Floats back(x.size());
    CHECK_EQ(kvx::thc_unrotate(z.data(), n, m, 11, 5, 4096, back.data()), kvx::kOk);
    double err = 0.0;
    for (int64_t i = 0; i < n; ++i) err = std::max(err, static_cast<double>(std::fabs(back[i] - x[i])));
    CHECK(err <= 1e-5 * m);
    // another step: other signs, so another z; another seed likewise
    Floats z2(z.size());
    kvx::thc_rotate(x.data(), n, m, 11, 6, 4096, z2.data());
    CHECK(n < 2 || z2 != z);
  }
  // the coordinates of a spiky vector are spread: one value of 1 among zeros becomes
  // +-sqrt(d) / sqrt(B) * ... = +-1 everywhere in its block of 4096 (M = 1, d = B)
  Floats spike(4096, 0.0f);
  spike[17] = 1.0f;
  Floats z(4096);
  kvx::thc_rotate(spike.data(), 4096, 1.0f, 3, 0, 4096, z.data());
  bool spread = true;
  for (float v : z) spread = spread && std::fabs(v) == 1.0f;
  CHECK(spread);
  // M = 0: z = 0; invalid M or step
  CHECK_EQ(kvx::thc_rotate(spike.data(), 4096, 0.0f, 3, 0, 4096, z.data()), kvx::kOk);
  CHECK(all_zero_value(z));
  CHECK_EQ(kvx::thc_rotate(spike.data(), 4096, kNaN, 3, 0, 4096, z.data()), kvx::kBadParam);
  CHECK_EQ(kvx::thc_rotate(spike.data(), 4096, -1.0f, 3, 0, 4096, z.data()), kvx::kBadParam);
  CHECK_EQ(kvx::thc_rotate(spike.data(), 4096, 1.0f, 3, kvx::kThcMaxStep, 4096, z.data()),
           kvx::kBadParam);
  // a wrong M (far below ||x||) cannot overflow: the guard bounds every value
  Floats big(4096, 3e38f);
  CHECK_EQ(kvx::thc_rotate(big.data(), 4096, 1e-30f, 3, 0, 4096, z.data()), kvx::kOk);
  CHECK(all_finite(z));
}

// ---- quantisation and packing ----------------------------------------------------------

// digit of each element of one worker's words (summed = 1): (value + T) / delta,
// delta = 2T / g (the uniform table: the level index).
std::vector<int64_t> codes_of(const Floats& words, int64_t d, const ThcParams& p,
                              int64_t num_workers) {
  Floats values(static_cast<size_t>(d));
  CHECK_EQ(kvx::thc_dequantize(words.data(), static_cast<int64_t>(words.size()), d, p,
                               num_workers, 1, values.data()), kvx::kOk);
  const double t = static_cast<float>(p.clamp), delta = 2.0 * t / kvx::thc_grid(p);
  std::vector<int64_t> codes(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    codes[i] = std::llround((static_cast<double>(values[i]) + t) / delta);
  return codes;
}

void test_quantize_levels() {
  g_test = "quantize levels";
  const ThcParams p = params(16, 2.5);
  const double delta = 5.0 / 15.0;
  // on a level: deterministic; beyond T: clamped to the end levels
  Floats z = {-2.5f, 2.5f, -100.0f, 100.0f, 0.0f};
  for (int k = 0; k < 16; ++k) z.push_back(static_cast<float>(-2.5 + k * delta));
  const int64_t d = static_cast<int64_t>(z.size());
  for (int64_t step = 0; step < 20; ++step) {
    Floats words(static_cast<size_t>(kvx::thc_packed_words(d, p, 3)));
    CHECK_EQ(kvx::thc_quantize(z.data(), d, p, 3, 1, step, words.data()), kvx::kOk);
    const auto codes = codes_of(words, d, p, 3);
    CHECK(codes[0] == 0 && codes[1] == 15 && codes[2] == 0 && codes[3] == 15);
    CHECK(codes[4] == 7 || codes[4] == 8);                    // 0 lies between 7 and 8
    for (int k = 0; k < 16; ++k) {
      // float32 rounding of -2.5 + k delta may land a hair off the level: then the
      // other neighbour has probability < 1e-6
      CHECK(std::llabs(codes[5 + k] - k) <= 1);
    }
    for (auto c : codes) CHECK(c >= 0 && c < 16);
  }
  // q = 2: one bit, levels -T and +T
  Floats two(static_cast<size_t>(kvx::thc_packed_words(d, params(2), 1)));
  CHECK_EQ(kvx::thc_quantize(z.data(), d, params(2), 1, 0, 0, two.data()), kvx::kOk);
  for (auto c : codes_of(two, d, params(2), 1)) CHECK(c == 0 || c == 1);
}

// The sum over `trials` steps (each with its own dither) of the dequantised values of
// one worker's quantised z.
std::vector<double> summed_values(const Floats& z, const ThcParams& p, int trials) {
  const int64_t d = static_cast<int64_t>(z.size());
  std::vector<double> sum(static_cast<size_t>(d), 0.0);
  Floats words(static_cast<size_t>(kvx::thc_packed_words(d, p, 1)));
  Floats values(static_cast<size_t>(d));
  for (int s = 0; s < trials; ++s) {
    kvx::thc_quantize(z.data(), d, p, 1, 0, s, words.data());
    kvx::thc_dequantize(words.data(), static_cast<int64_t>(words.size()), d, p, 1, 1,
                        values.data());
    for (int64_t i = 0; i < d; ++i) sum[i] += values[i];
  }
  return sum;
}

// E[level(code)] = clamp(z): the mean over many steps (independent dither) is within a
// bound that a biased rounding (round to nearest) misses.
void test_quantize_unbiased() {
  g_test = "quantize unbiased";
  const ThcParams p = params(16, 2.5);
  const double delta = 5.0 / 15.0;
  const int64_t d = 64;
  Floats z(static_cast<size_t>(d));
  std::mt19937 rng(5);
  for (auto& v : z) v = std::uniform_real_distribution<float>(-2.4f, 2.4f)(rng);
  const int trials = 4000;
  const std::vector<double> sum = summed_values(z, p, trials);
  // each level has variance <= delta^2 / 4: the mean's standard error <= delta / (2 sqrt N)
  const double sigma = delta / (2.0 * std::sqrt(static_cast<double>(trials)));
  double worst = 0.0, worst_nearest = 0.0;
  for (int64_t i = 0; i < d; ++i) {
    worst = std::max(worst, std::fabs(sum[i] / trials - z[i]) / sigma);
    const double nearest = std::round((z[i] + 2.5) / delta) * delta - 2.5;
    worst_nearest = std::max(worst_nearest, std::fabs(nearest - z[i]) / sigma);
  }
  CHECK(worst < 5.0);            // 64 elements, 5 sigma: a false alarm about once in 10^5
  CHECK(worst_nearest > 5.0);    // the bound has the power to see a biased rounding
}

// The server adds float32 words in any order; every partial sum stays an exact integer
// and the total is the packing of the summed codes.
void test_sum_exact() {
  g_test = "sum exact";
  std::mt19937 rng(9);
  for (int64_t workers : {1, 2, 3, 4, 8, 16, 100}) {
    for (int64_t levels : {2, 4, 16, 256, 0}) {                        // 0: the thc table
      const ThcParams p = levels > 0 ? params(levels, 2.5) : thc_table(2.5);
      const int64_t g = kvx::thc_grid(p);
      if (!kvx::thc_params_valid(p, workers)) continue;
      const int64_t d = 1000 + static_cast<int64_t>(rng() % 100);
      const int64_t nw = kvx::thc_packed_words(d, p, workers);
      std::vector<Floats> words(static_cast<size_t>(workers), Floats(static_cast<size_t>(nw)));
      std::vector<int64_t> code_sum(static_cast<size_t>(d), 0);
      for (int64_t w = 0; w < workers; ++w) {
        // extremes in front (every code at its top, then its bottom), then random
        Floats z = randn(static_cast<size_t>(d), static_cast<uint32_t>(w * 31 + levels), 1.5f);
        for (int i = 0; i < 50; ++i) z[i] = 50.0f;
        for (int i = 50; i < 100; ++i) z[i] = -50.0f;
        CHECK_EQ(kvx::thc_quantize(z.data(), d, p, workers, w, 3, words[w].data()), kvx::kOk);
        const auto codes = codes_of(words[w], d, p, workers);
        for (int64_t i = 0; i < d; ++i) code_sum[i] += codes[i];
      }
      for (int order = 0; order < 3; ++order) {
        std::vector<int64_t> perm(static_cast<size_t>(workers));
        for (int64_t w = 0; w < workers; ++w) perm[w] = w;
        std::shuffle(perm.begin(), perm.end(), rng);
        Floats total(static_cast<size_t>(nw), 0.0f);
        bool exact = true;
        for (int64_t w : perm)
          for (int64_t j = 0; j < nw; ++j) {
            total[j] += words[w][j];                             // float32, as the server
            exact = exact && total[j] == std::floor(total[j]) && total[j] < 16777216.0f;
          }
        CHECK(exact);
        Floats values(static_cast<size_t>(d));
        CHECK_EQ(kvx::thc_dequantize(total.data(), nw, d, p, workers, workers, values.data()),
                 kvx::kOk);
        const double t = 2.5, delta = 2.0 * t / g;
        bool same = true;
        for (int64_t i = 0; i < d; ++i)
          same = same && values[i] == static_cast<float>(code_sum[i] * delta - workers * t);
        CHECK(same);
        CHECK(code_sum[0] == workers * g && code_sum[50] == 0);
      }
    }
  }
  // the most workers: base 15 * 2^20 + 1 <= 2^24 for q = 16 (one digit a word), not q = 17
  CHECK(kvx::thc_params_valid(params(16), kvx::kThcMaxWorkers));
  CHECK_EQ(kvx::thc_packed_words(5, params(16), kvx::kThcMaxWorkers), 5);
  CHECK(!kvx::thc_params_valid(params(17), kvx::kThcMaxWorkers));
  CHECK(!kvx::thc_params_valid(params(16), kvx::kThcMaxWorkers + 1));
}

// ---- one step ------------------------------------------------------------------------

// Workers' steps through thc_encode, the server's float32 sum, thc_decode_sum.
struct Job {
  int64_t n, workers;
  ThcParams p;
  std::vector<Floats> grads, residuals;
  Floats norms, out;
  std::vector<Floats> words;

  Job(int64_t n_, int64_t workers_, ThcParams p_) : n(n_), workers(workers_), p(p_) {
    for (int64_t w = 0; w < workers; ++w) {
      grads.push_back(randn(static_cast<size_t>(n), static_cast<uint32_t>(100 + w), 0.01f));
      residuals.emplace_back(static_cast<size_t>(n), 0.0f);
    }
  }
  int step(int64_t step_no) {
    norms = norm_round(grads, residuals);
    const int64_t nw = kvx::thc_sum_words(n, p, workers);
    Floats total(static_cast<size_t>(nw), 0.0f);
    words.assign(static_cast<size_t>(workers), Floats(static_cast<size_t>(nw)));
    for (int64_t w = 0; w < workers; ++w) {
      const int st = kvx::thc_encode(grads[w].data(), residuals[w].data(), n, norms.data(),
                                     workers, w, step_no, p, words[w].data());
      if (st != kvx::kOk) return st;
      for (int64_t j = 0; j < nw; ++j) total[j] += words[w][j];
    }
    out.assign(static_cast<size_t>(n), 0.0f);
    return kvx::thc_decode_sum(total.data(), nw, n, norms.data(), workers, step_no, p,
                               out.data());
  }
};

// One step of 1, 2 and 4 workers on tensors of 1 to 70000 elements with parameters p
// (residuals 0): error feedback accounts for every worker's loss (what each residual
// lost is its decoded contribution, and the contributions add up to the decoded sum),
// and the decoded sum is a noisy but close estimate (a 4-bit quantiser: about 0.15 of
// the norm for independent Gaussian gradients; a few elements may cancel out).
void check_steps(const ThcParams& p) {
  for (int64_t workers : {1, 2, 4}) {
    for (int64_t n : {1, 300, 5000, 70000}) {
      Job job(n, workers, p);
      std::vector<Floats> accs = job.grads;
      CHECK_EQ(job.step(0), kvx::kOk);
      double err = 0.0, scale = 0.0, rel = 0.0, exact_norm = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        double own = 0.0, exact = 0.0;
        for (int64_t w = 0; w < workers; ++w) {
          own += static_cast<double>(accs[w][i]) - job.residuals[w][i];
          exact += accs[w][i];
        }
        err = std::max(err, std::fabs(own - job.out[i]));
        scale = std::max(scale, std::fabs(exact));
        rel += (job.out[i] - exact) * (job.out[i] - exact);
        exact_norm += exact * exact;
      }
      CHECK(err <= 1e-5 * scale + 1e-12);
      if (n >= 300) CHECK(std::sqrt(rel / exact_norm) < 0.25);
      CHECK(all_finite(job.out));
    }
  }
}

void test_encode_decode() {
  g_test = "encode/decode";
  check_steps(params(16, 2.5, 5, 4096));
  // deterministic: the same step twice gives the same words; ranks dither differently
  Job a(5000, 2, params()), b(5000, 2, params());
  a.step(3);
  b.step(3);
  CHECK(a.words == b.words && a.out == b.out && a.residuals == b.residuals);
  CHECK(a.words[0] != a.words[1]);
  Job c(5000, 2, params());
  c.grads[1] = c.grads[0];                     // same acc, other rank: other dither
  c.step(3);
  CHECK(c.words[0] != c.words[1]);

  // all workers at zero: M = 0, the sum and the residuals are exactly zero
  Job zero(3000, 3, params());
  for (auto& g : zero.grads) std::fill(g.begin(), g.end(), 0.0f);
  CHECK_EQ(zero.step(0), kvx::kOk);
  CHECK(all_zero_value(zero.out));
  for (const auto& r : zero.residuals) CHECK(all_zero(r));

  // a worker with zero acc among others: unbiased noise, fed back
  Job mixed(3000, 2, params());
  std::fill(mixed.grads[1].begin(), mixed.grads[1].end(), 0.0f);
  CHECK_EQ(mixed.step(0), kvx::kOk);
  CHECK(all_finite(mixed.out) && all_finite(mixed.residuals[1]));

  // grad and residual may alias
  Floats g = randn(5000, 4, 0.1f);
  Floats words(static_cast<size_t>(kvx::thc_sum_words(5000, params(), 1)));
  Floats g2 = g, r2 = g, words2 = words;
  float m = 0.0f;
  kvx::thc_norm(g.data(), g.data(), 5000, &m);
  CHECK_EQ(kvx::thc_encode(g.data(), g.data(), 5000, &m, 1, 0, 0, params(), words.data()),
           kvx::kOk);
  CHECK_EQ(kvx::thc_encode(g2.data(), r2.data(), 5000, &m, 1, 0, 0, params(), words2.data()),
           kvx::kOk);
  CHECK(words == words2 && g == r2);
}

void test_large() {
  g_test = "large";
  const int64_t n = (int64_t{1} << 20) + 37;
  Job job(n, 2, params(16, 2.5, 1, 65536));
  CHECK_EQ(job.step(12345), kvx::kOk);
  double rel = 0.0, norm = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double exact = static_cast<double>(job.grads[0][i]) + job.grads[1][i];
    rel += (job.out[i] - exact) * (job.out[i] - exact);
    norm += exact * exact;
  }
  CHECK(std::sqrt(rel / norm) < 0.25);
}

void test_errors() {
  g_test = "errors";
  const int64_t n = 1000;
  const ThcParams p = params();
  const int64_t nw = kvx::thc_sum_words(n, p, 2);
  Floats grad = randn(n, 1), residual = randn(n, 2, 0.1f), norms = {30.0f, 31.0f};
  const Floats residual0 = residual;
  Floats words(static_cast<size_t>(nw), 5.0f);
  // NaN / Inf / overflow in acc: a void payload (NaN words), residual untouched, and a
  // NaN norm, which voids every worker's norm round
  for (float bad : {kNaN, kInf, -kInf}) {
    Floats g = grad;
    g[n - 1] = bad;
    std::fill(words.begin(), words.end(), 5.0f);
    CHECK_EQ(kvx::thc_encode(g.data(), residual.data(), n, norms.data(), 2, 0, 0, p,
                             words.data()), kvx::kNonFinite);
    CHECK(all_nan(words) && residual == residual0);
    float m = 1.0f;
    CHECK_EQ(kvx::thc_norm(g.data(), residual.data(), n, &m), kvx::kNonFinite);
    CHECK(std::isnan(m));
  }
  // a NaN norm (another worker's gradient was non-finite): void payload, kVoid
  std::fill(words.begin(), words.end(), 5.0f);
  CHECK_EQ(kvx::thc_encode(grad.data(), residual.data(), n, Floats{kNaN, 1.0f}.data(), 2, 0,
                           0, p, words.data()), kvx::kVoid);
  CHECK(all_nan(words) && residual == residual0);
  Floats g = grad, r = residual;
  g[0] = 3e38f;
  r[0] = 3e38f;                                        // acc overflows to Inf
  CHECK_EQ(kvx::thc_encode(g.data(), r.data(), n, norms.data(), 2, 0, 0, p, words.data()),
           kvx::kNonFinite);
  // the norm of huge finite values is capped, not Inf
  float m = 0.0f;
  Floats huge(10, 3e38f), zeros(10, 0.0f);
  CHECK_EQ(kvx::thc_norm(huge.data(), zeros.data(), 10, &m), kvx::kOk);
  CHECK(std::isfinite(m) && m == std::numeric_limits<float>::max());
  // bad norms, rank, step, parameters: kBadParam, residual untouched
  const std::vector<Floats> bad_norms = {{-1.0f, 1.0f}, {kInf, 1.0f}};
  for (const auto& bn : bad_norms) {
    CHECK_EQ(kvx::thc_encode(grad.data(), residual.data(), n, bn.data(), 2, 0, 0, p,
                             words.data()), kvx::kBadParam);
    CHECK(residual == residual0);
  }
  CHECK_EQ(kvx::thc_encode(grad.data(), residual.data(), n, norms.data(), 2, 2, 0, p,
                           words.data()), kvx::kBadParam);
  CHECK_EQ(kvx::thc_encode(grad.data(), residual.data(), n, norms.data(), 2, -1, 0, p,
                           words.data()), kvx::kBadParam);
  CHECK_EQ(kvx::thc_encode(grad.data(), residual.data(), n, norms.data(), 2, 0,
                           kvx::kThcMaxStep, p, words.data()), kvx::kBadParam);
  for (const ThcParams& bp : {params(1), params(16, 0.0), params(16, -1.0),
                              params(16, 1e39), params(16, 2e4), params(16, 2.5, 0, 1000),
                              params(16, 2.5, 0, 128)}) {
    CHECK(!kvx::thc_params_valid(bp, 2));
    CHECK_EQ(kvx::thc_encode(grad.data(), residual.data(), n, norms.data(), 2, 0, 0, bp,
                             words.data()), kvx::kBadParam);
    CHECK(residual == residual0);
  }
  CHECK(residual == residual0);
}

// Malformed sums: every check of thc_decode_sum, output zeroed.
void test_malformed() {
  g_test = "malformed";
  Job job(2000, 2, params());
  CHECK_EQ(job.step(0), kvx::kOk);
  const int64_t n = 2000, nw = kvx::thc_sum_words(n, job.p, 2);
  Floats total(static_cast<size_t>(nw), 0.0f);
  for (const auto& w : job.words)
    for (int64_t j = 0; j < nw; ++j) total[j] += w[j];
  auto decode = [&](const Floats& words, int64_t count, const Floats& norms, int64_t step,
                    const ThcParams& p) {
    Floats out(static_cast<size_t>(n), 7.0f);
    const int st = kvx::thc_decode_sum(words.data(), count, n, norms.data(),
                                       static_cast<int64_t>(norms.size()), step, p, out.data());
    CHECK(st == kvx::kOk || (st == kvx::kVoid ? all_nan(out) : all_zero(out)));
    return st;
  };
  CHECK_EQ(decode(total, nw, job.norms, 0, job.p), kvx::kOk);
  CHECK_EQ(decode(total, nw - 1, job.norms, 0, job.p), kvx::kBadParam);
  Floats longer = total;
  longer.push_back(0.0f);
  CHECK_EQ(decode(longer, nw + 1, job.norms, 0, job.p), kvx::kBadParam);
  CHECK_EQ(decode(total, nw, Floats{kNaN, 1.0f}, 0, job.p), kvx::kVoid);  // a void step
  CHECK_EQ(decode(total, nw, Floats{1.0f, -2.0f}, 0, job.p), kvx::kBadParam);
  CHECK_EQ(decode(total, nw, job.norms, -1, job.p), kvx::kBadParam);
  CHECK_EQ(decode(total, nw, job.norms, 0, params(1)), kvx::kBadParam);
  const float limit = 31.0f * 31.0f * 31.0f * 31.0f;                 // base 31, 4 digits
  for (float bad : {-1.0f, 0.5f, limit, 1e30f, kNaN, kInf, -kInf, -0.0f}) {
    Floats w = total;
    w[nw / 2] = bad;
    const int st = decode(w, nw, job.norms, 0, job.p);
    if (bad == 0.0f) {
      CHECK_EQ(st, kvx::kOk);                                        // -0.0 is 0
    } else {
      CHECK_EQ(st, kvx::kBadWord);
    }
  }
  Floats w = total;
  w[0] = limit - 1.0f;                                               // the largest digit word
  CHECK_EQ(decode(w, nw, job.norms, 0, job.p), kvx::kOk);
}

// ---- THC's non-uniform table -----------------------------------------------------------

bool is_table_entry(int64_t digit) {
  for (int64_t v : kvx::kThcTableThcValues)
    if (v == digit) return true;
  return false;
}

void test_table_layout() {
  g_test = "table layout";
  const ThcParams p = thc_table();
  CHECK_EQ(kvx::thc_grid(p), 30);
  CHECK_EQ(kvx::thc_grid(params(16)), 15);
  CHECK_EQ(kvx::thc_table_value(p, 0), 0);
  CHECK_EQ(kvx::thc_table_value(p, 7), 14);
  CHECK_EQ(kvx::thc_table_value(p, 15), 30);
  CHECK_EQ(kvx::thc_table_value(p, 16), -1);
  CHECK_EQ(kvx::thc_table_value(params(16), 7), 7);
  // the table: sorted, 0 to g, symmetric (t[k] + t[15 - k] = g: the levels are +-)
  for (int k = 0; k < 16; ++k) {
    if (k > 0) CHECK(kvx::kThcTableThcValues[k] > kvx::kThcTableThcValues[k - 1]);
    CHECK_EQ(kvx::kThcTableThcValues[k] + kvx::kThcTableThcValues[15 - k], 30);
  }
  // base n g + 1, sized by g = 30 and not by q: 1 and 2 workers 31 and 61 (4 digits a
  // word), 4 workers 121 (3), 8 workers 241 (3), 16 workers 481 (2)
  CHECK_EQ(kvx::thc_sum_base(p, 1), 31);
  CHECK_EQ(kvx::thc_sum_base(p, 4), 121);
  CHECK_EQ(kvx::thc_sum_words(40000, thc_table(2.1539, 0, 65536), 1), 10000);
  CHECK_EQ(kvx::thc_sum_words(40000, thc_table(2.1539, 0, 65536), 2), 10000);
  CHECK_EQ(kvx::thc_sum_words(40000, thc_table(2.1539, 0, 65536), 4), 13334);
  CHECK_EQ(kvx::thc_sum_words(40000, thc_table(2.1539, 0, 65536), 8), 13334);
  CHECK_EQ(kvx::thc_sum_words(40000, thc_table(2.1539, 0, 65536), 16), 20000);
  // the most workers: 30 n + 1 <= 2^24
  CHECK(kvx::thc_params_valid(p, 559240));
  CHECK(!kvx::thc_params_valid(p, 559241));
  CHECK(!kvx::thc_params_valid(p, kvx::kThcMaxWorkers));
  // invalid tables: levels other than 16 for the thc table, unknown ids
  for (const ThcParams& bad : {params(15, 2.5, 7, 1024, kvx::kThcTableThc),
                               params(17, 2.5, 7, 1024, kvx::kThcTableThc),
                               params(2, 2.5, 7, 1024, kvx::kThcTableThc),
                               params(16, 2.5, 7, 1024, kvx::kThcTableCount),
                               params(16, 2.5, 7, 1024, -1)}) {
    CHECK(!kvx::thc_params_valid(bad, 2));
    CHECK_EQ(kvx::thc_grid(bad), 0);
    CHECK_EQ(kvx::thc_sum_base(bad, 2), 0);
    CHECK_EQ(kvx::thc_sum_words(1000, bad, 2), 0);
    CHECK_EQ(kvx::thc_packed_words(1000, bad, 2), 0);
    CHECK_EQ(kvx::thc_table_value(bad, 0), -1);
  }
}

void test_table_quantize() {
  g_test = "table quantize";
  const ThcParams p = thc_table();
  const double t = static_cast<float>(p.clamp), delta = 2.0 * t / 30.0;
  // on an entry: that entry (up to float32 rounding of the input, < 1e-6 either way);
  // beyond T: the end entries; between two entries: one of them, never another
  Floats z = {-100.0f, 100.0f, static_cast<float>(-t), static_cast<float>(t), 0.0f};
  for (int64_t v : kvx::kThcTableThcValues) z.push_back(static_cast<float>(v * delta - t));
  std::mt19937 rng(4);
  Floats between;
  for (int i = 0; i < 200; ++i)
    between.push_back(std::uniform_real_distribution<float>(-2.15f, 2.15f)(rng));
  z.insert(z.end(), between.begin(), between.end());
  const int64_t d = static_cast<int64_t>(z.size());
  for (int64_t workers : {1, 2, 4}) {
    for (int64_t step = 0; step < 20; ++step) {
      Floats words(static_cast<size_t>(kvx::thc_packed_words(d, p, workers)));
      CHECK_EQ(kvx::thc_quantize(z.data(), d, p, workers, workers - 1, step, words.data()),
               kvx::kOk);
      const auto digits = codes_of(words, d, p, workers);
      CHECK(digits[0] == 0 && digits[1] == 30 && digits[2] == 0 && digits[3] == 30);
      CHECK(digits[4] == 14 || digits[4] == 16);            // 0 (grid 15) lies between them
      bool entries = true, neighbours = true;
      for (auto v : digits) entries = entries && is_table_entry(v);
      for (int k = 0; k < 16; ++k) {
        const int64_t want = kvx::kThcTableThcValues[k];
        neighbours = neighbours && (digits[5 + k] == want ||
                                    (k > 0 && digits[5 + k] == kvx::kThcTableThcValues[k - 1]) ||
                                    (k < 15 && digits[5 + k] == kvx::kThcTableThcValues[k + 1]));
      }
      for (size_t i = 0; i < between.size(); ++i) {
        const double grid = (between[i] + t) / delta;     // in [0, 30]
        int k = 0;
        while (k < 14 && kvx::kThcTableThcValues[k + 1] <= grid) ++k;
        const int64_t v = digits[21 + i];
        neighbours = neighbours && (v == kvx::kThcTableThcValues[k] ||
                                    v == kvx::kThcTableThcValues[k + 1]);
      }
      CHECK(entries);
      CHECK(neighbours);
    }
  }
  // exactly on an entry (a float32 p that is an integer): deterministic
  const ThcParams exact = thc_table(15.0);                  // p = z + 15, delta = 1
  Floats on = {-15.0f, -12.0f, -1.0f, 0.0f, 1.0f, 2.0f, 15.0f};
  Floats words(static_cast<size_t>(kvx::thc_packed_words(7, exact, 1)));
  for (int64_t step = 0; step < 10; ++step) {
    CHECK_EQ(kvx::thc_quantize(on.data(), 7, exact, 1, 0, step, words.data()), kvx::kOk);
    const auto digits = codes_of(words, 7, exact, 1);
    CHECK(digits[0] == 0 && digits[1] == 3 && digits[2] == 14 && digits[4] == 16 &&
          digits[5] == 17 && digits[6] == 30);
    CHECK(digits[3] == 14 || digits[3] == 16);               // 15: halfway, either
  }
}

// E[value(digit)] = clamp(z) for the thc table: the mean over many steps is within a
// bound that rounding to the nearest entry misses.
void test_table_unbiased() {
  g_test = "table unbiased";
  const ThcParams p = thc_table();
  const double t = static_cast<float>(p.clamp), delta = 2.0 * t / 30.0;
  const int64_t d = 64;
  Floats z(static_cast<size_t>(d));
  std::mt19937 rng(6);
  for (auto& v : z) v = std::uniform_real_distribution<float>(-2.1f, 2.1f)(rng);
  const int trials = 4000;
  const std::vector<double> sum = summed_values(z, p, trials);
  double worst = 0.0, worst_nearest = 0.0;
  for (int64_t i = 0; i < d; ++i) {
    // the interval around z: rounding between its ends has variance <= width^2 / 4
    const double grid = (z[i] + t) / delta;
    int k = 0;
    while (k < 14 && kvx::kThcTableThcValues[k + 1] <= grid) ++k;
    const double lo = kvx::kThcTableThcValues[k], hi = kvx::kThcTableThcValues[k + 1];
    const double sigma = (hi - lo) * delta / (2.0 * std::sqrt(static_cast<double>(trials)));
    worst = std::max(worst, std::fabs(sum[i] / trials - z[i]) / sigma);
    const double nearest = (grid - lo < hi - grid ? lo : hi) * delta - t;
    worst_nearest = std::max(worst_nearest, std::fabs(nearest - z[i]) / sigma);
  }
  CHECK(worst < 5.0);
  CHECK(worst_nearest > 5.0);
}

// Steps of 1, 2 and 4 workers with the thc table: error feedback accounts for every
// worker's loss, and the decoded sum is close.
void test_table_encode_decode() {
  g_test = "table encode/decode";
  check_steps(thc_table(2.1539, 5, 4096));
  // the same gradients through both tables: other words, both close
  Job uniform(5000, 2, params()), table(5000, 2, thc_table());
  CHECK_EQ(uniform.step(3), kvx::kOk);
  CHECK_EQ(table.step(3), kvx::kOk);
  CHECK(uniform.out != table.out);
  // an invalid table: nothing encoded, the residual untouched
  Job bad(1000, 2, params(15, 2.5, 7, 1024, kvx::kThcTableThc));
  const std::vector<Floats> before = bad.residuals;
  CHECK_EQ(bad.step(0), kvx::kBadParam);
  CHECK(bad.residuals == before);
}

// Malformed sums with the thc table: base 61 for 2 workers, words below 61^4.
void test_table_malformed() {
  g_test = "table malformed";
  const ThcParams p = thc_table();
  Job job(2000, 2, p);
  CHECK_EQ(job.step(0), kvx::kOk);
  const int64_t n = 2000, nw = kvx::thc_sum_words(n, p, 2);
  Floats total(static_cast<size_t>(nw), 0.0f);
  for (const auto& w : job.words)
    for (int64_t j = 0; j < nw; ++j) total[j] += w[j];
  auto decode = [&](const Floats& words, const ThcParams& q) {
    Floats out(static_cast<size_t>(n), 7.0f);
    const int st = kvx::thc_decode_sum(words.data(), nw, n, job.norms.data(), 2, 0, q,
                                       out.data());
    CHECK(st == kvx::kOk || (st == kvx::kVoid ? all_nan(out) : all_zero(out)));
    return st;
  };
  CHECK_EQ(decode(total, p), kvx::kOk);
  const float limit = 61.0f * 61.0f * 61.0f * 61.0f;
  for (float bad : {limit, limit + 1.0f, 1e7f * 2.0f, -1.0f, 2.5f, kNaN}) {
    Floats w = total;
    w[nw / 3] = bad;
    CHECK_EQ(decode(w, p), kvx::kBadWord);
  }
  Floats w = total;
  w[0] = limit - 1.0f;                                 // every digit 60 = 2 g: valid
  CHECK_EQ(decode(w, p), kvx::kOk);
  // the same words under an invalid table: rejected before they are read
  CHECK_EQ(decode(total, params(15, 2.1539, 7, 1024, kvx::kThcTableThc)), kvx::kBadParam);
  CHECK_EQ(decode(total, params(16, 2.1539, 7, 1024, 2)), kvx::kBadParam);
  Floats values(static_cast<size_t>(kvx::thc_padded_size(n, p.block)), 7.0f);
  CHECK_EQ(kvx::thc_dequantize(total.data(), nw, static_cast<int64_t>(values.size()),
                               params(16, 2.1539, 7, 1024, 5), 2, 2, values.data()),
           kvx::kBadParam);
  CHECK(all_zero(values));
}

// ---- the uniform table, unchanged ------------------------------------------------------

// FNV-1a over the bits of floats: a fingerprint of a run's outputs.
uint64_t fingerprint(uint64_t h, const Floats& a) {
  for (float v : a) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    for (int k = 0; k < 4; ++k) h = (h ^ ((bits >> (8 * k)) & 255u)) * 0x100000001B3ull;
  }
  return h;
}

// About N(0, 1) from integers only (the sum of four 24-bit uniforms of a 32-bit LCG,
// centred), so the inputs are the same on every platform and standard library.
Floats portable_gaussian(size_t n, uint32_t seed, float scale) {
  Floats x(n);
  uint32_t s = seed;
  for (auto& v : x) {
    int64_t sum = 0;
    for (int k = 0; k < 4; ++k) {
      s = s * 1664525u + 1013904223u;
      sum += s >> 8;
    }
    v = scale * static_cast<float>(static_cast<double>(sum - (int64_t{2} << 24)) * 0x1p-23);
  }
  return x;
}

// The uniform table's words, residuals and decoded sums are those of the kernels before
// the table was generalised (commit 37ceba7): the fingerprint of two steps of 1, 3 and 4
// workers, 16 and 5 levels, over 70000 elements (blocks of 4096 and a padded tail).
uint64_t uniform_fingerprint() {
  uint64_t h = 0xCBF29CE484222325ull;
  for (int64_t workers : {1, 3, 4}) {
    for (int64_t levels : {16, 5}) {
      const int64_t n = 70000;
      const ThcParams p = params(levels, 2.5, 11, 4096);
      std::vector<Floats> grads, residuals;
      for (int64_t w = 0; w < workers; ++w) {
        grads.push_back(portable_gaussian(static_cast<size_t>(n),
                                          static_cast<uint32_t>(17 * w + levels), 0.01f));
        residuals.emplace_back(static_cast<size_t>(n), 0.0f);
      }
      for (int64_t step : {0, 7}) {
        const Floats norms = norm_round(grads, residuals);
        const int64_t nw = kvx::thc_sum_words(n, p, workers);
        Floats total(static_cast<size_t>(nw), 0.0f), words(static_cast<size_t>(nw));
        for (int64_t w = 0; w < workers; ++w) {
          CHECK_EQ(kvx::thc_encode(grads[w].data(), residuals[w].data(), n, norms.data(),
                                   workers, w, step, p, words.data()), kvx::kOk);
          for (int64_t j = 0; j < nw; ++j) total[j] += words[j];
          h = fingerprint(h, words);
          h = fingerprint(h, residuals[w]);
        }
        Floats out(static_cast<size_t>(n));
        CHECK_EQ(kvx::thc_decode_sum(total.data(), nw, n, norms.data(), workers, step, p,
                                     out.data()), kvx::kOk);
        h = fingerprint(h, out);
      }
    }
  }
  return h;
}

void test_uniform_unchanged() {
  g_test = "uniform unchanged";
  const uint64_t h = uniform_fingerprint();
  CHECK(h == 0xC4D10E64E828AAAAull);   // printed by commit 37ceba7's kernels
}

// ---- fuzzing the decoders a worker runs on the server's sum --------------------------

float any_word(std::mt19937_64& rng, float limit) {
  switch (rng() % 9) {
    case 0: return static_cast<float>(rng() % static_cast<uint64_t>(limit));
    case 1: return static_cast<float>(rng() % (1u << 25));
    case 2: return -static_cast<float>(rng() % 1000);
    case 3: return static_cast<float>(rng() % 1000) + 0.5f;
    case 4: return kNaN;
    case 5: return (rng() % 2 ? 1 : -1) * kInf;
    case 6: return (rng() % 2 ? 1 : -1) * std::numeric_limits<float>::max();
    case 7: return std::ldexp(1.0f, static_cast<int>(rng() % 60));
    default: return std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng);
  }
}

void fuzz_decoders(uint64_t cases, uint64_t seed) {
  g_test = "fuzz";
  std::mt19937_64 rng(seed);
  int bad = 0;
  for (uint64_t c = 0; c < cases; ++c) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % (rng() % 10 ? 3000 : 70000));
    const int64_t workers = 1 + static_cast<int64_t>(rng() % 8);
    ThcParams p = params(2 + static_cast<int64_t>(rng() % 40), 0.5 + (rng() % 40) / 8.0,
                         rng() % 100, int64_t{256} << (rng() % 6));
    if (rng() % 10 == 0) p.levels = static_cast<int64_t>(rng() % 4);       // maybe invalid
    if (rng() % 3 == 0) p.table = kvx::kThcTableThc;                      // levels 16 or invalid
    if (rng() % 3 == 0 && p.table == kvx::kThcTableThc) p.levels = 16;
    if (rng() % 20 == 0) p.table = static_cast<int64_t>(rng() % 5) - 1;   // maybe invalid
    if (rng() % 20 == 0) p.block = static_cast<int64_t>(rng() % 5000);     // maybe invalid
    if (rng() % 20 == 0) p.clamp = any_word(rng, 10.0f);
    const int64_t expected = kvx::thc_sum_words(n, p, workers);
    int64_t count = expected > 0 ? expected : static_cast<int64_t>(rng() % 100);
    if (rng() % 5 == 0) count = static_cast<int64_t>(rng() % (static_cast<uint64_t>(count) + 3));
    const float limit = 1 << 24;
    Floats words(static_cast<size_t>(count));
    const bool valid_words = rng() % 2 == 0;
    for (float& x : words) x = valid_words && rng() % 50 ? static_cast<float>(rng() % 200) : any_word(rng, limit);
    Floats norms(static_cast<size_t>(workers));
    for (float& x : norms) x = rng() % 10 ? static_cast<float>(rng() % 100) / 7.0f : any_word(rng, 10.0f);
    const int64_t step = rng() % 20 ? static_cast<int64_t>(rng() % 1000)
                                    : static_cast<int64_t>(rng() % (2 * kvx::kThcMaxStep)) - 5;
    Floats out(static_cast<size_t>(n), 7.0f);
    const int st = kvx::thc_decode_sum(words.data(), count, n, norms.data(), workers, step, p,
                                       out.data());
    if (st < 0 || st >= kvx::kStatusCount ||
        (st != kvx::kOk && !(st == kvx::kVoid ? all_nan(out) : all_zero(out))))
      ++bad;
    const int64_t d = static_cast<int64_t>(rng() % 5000);
    Floats values(static_cast<size_t>(d), 7.0f);
    const int64_t summed = 1 + static_cast<int64_t>(rng() % 10);
    const int st2 = kvx::thc_dequantize(words.data(), count, d, p, workers, summed, values.data());
    if (st2 < 0 || st2 >= kvx::kStatusCount || (st2 != kvx::kOk && !all_zero(values))) ++bad;
  }
  CHECK_EQ(bad, 0);
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t cases = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2000;
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20261201;
  test_layout();
  test_randomness();
  test_fwht();
  test_rotate();
  test_quantize_levels();
  test_quantize_unbiased();
  test_sum_exact();
  test_encode_decode();
  test_large();
  test_errors();
  test_malformed();
  test_table_layout();
  test_table_quantize();
  test_table_unbiased();
  test_table_encode_decode();
  test_table_malformed();
  test_uniform_unchanged();
  fuzz_decoders(cases, seed);
  std::printf("test_thc: %d checks, %d failed (fuzz: %llu cases, seed %llu)\n", g_checks,
              g_failures, static_cast<unsigned long long>(cases),
              static_cast<unsigned long long>(seed));
  return g_failures > 100 ? 100 : g_failures;
}
