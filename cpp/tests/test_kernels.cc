// Unit tests of the codec kernels (no MXNet needed).  Exit status is the number of
// failed checks (capped), each failure printed with its line.  Differential tests against
// the NumPy reference live in tests/test_cpp_ops.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../kernels.h"
#include "check.h"

namespace {

using namespace kvx_test;  // NOLINT: the checks and their helpers
using kvx::kHeaderWords;

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Bit-for-bit equality (so that -0.0 != +0.0 and NaN == same NaN).
bool same_bits(const Floats& a, const Floats& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (bits_of(a[i]) != bits_of(b[i])) return false;
  return true;
}

bool all_zero(const Floats& a) {
  for (float v : a)
    if (v != 0.0f) return false;
  return true;
}

Floats add(const Floats& a, const Floats& b) {
  Floats c(a.size());
  for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
  return c;
}

int code_of(float acc, float t) {
  if (!(t > 0.0f)) return 0;
  return (acc >= t ? 1 : 0) - (acc <= -t ? 1 : 0);
}

// ---- independent NumPy-order sum (recursive, as NumPy writes it) --------------------

double pairwise_ref(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i;
    for (i = 8; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_ref(a, n2) + pairwise_ref(a + n2, n - n2);
}

double numpy_sum_ref(const std::vector<double>& a) {
  double total = 0.0;
  for (size_t c = 0; c < a.size(); c += 8192)
    total += pairwise_ref(a.data() + c, std::min<int64_t>(8192, a.size() - c));
  return total;
}

// Packs non-negative digits little-endian, d per float32 word (the spec's pack_digits).
Floats pack_ref(const std::vector<int64_t>& digits, int64_t base, int d) {
  Floats words((digits.size() + d - 1) / d, 0.0f);
  bool exact = true;
  for (size_t w = 0; w < words.size(); ++w) {
    int64_t value = 0, power = 1;
    for (int j = 0; j < d; ++j, power *= base) {
      const size_t i = w * d + j;
      if (i < digits.size()) value += digits[i] * power;
    }
    exact = exact && value < (int64_t{1} << 24);  // an integer float32 holds exactly
    words[w] = static_cast<float>(value);
  }
  CHECK(exact);
  return words;
}

// Digits per float32 word of the homomorphic packing for n workers.
int sum_digits(int64_t workers) { return kvx::digits_per_word(kvx::sum_base(workers), 24); }

// ---- wire -----------------------------------------------------------------------------

void test_wire() {
  g_test = "wire";
  CHECK_EQ(kvx::digits_per_word(3, 24), 15);
  CHECK_EQ(kvx::digits_per_word(2, 24), 24);
  // Homomorphic bases 2n+1 in float32 words: n = 1, 2, 3, 4, 8, 16, 2^20.
  CHECK_EQ(sum_digits(1), 15);
  CHECK_EQ(sum_digits(2), 10);   // 5^10 = 9765625
  CHECK_EQ(sum_digits(3), 8);    // 7^8 = 5764801
  CHECK_EQ(sum_digits(4), 7);    // 9^7 = 4782969
  CHECK_EQ(sum_digits(8), 5);    // 17^5 = 1419857
  CHECK_EQ(sum_digits(16), 4);   // 33^4 = 1185921
  CHECK_EQ(sum_digits(kvx::kMaxWorkers), 1);
  CHECK_EQ(kvx::ternary_sum_words(7, 4), 1);
  CHECK_EQ(kvx::ternary_sum_words(8, 4), 2);
  CHECK_EQ(kvx::ternary_sum_words(20, 2), 2);
  CHECK_EQ(kvx::ternary_sum_words(21, 2), 3);
  CHECK_EQ(kvx::ternary_sum_words(5, kvx::kMaxWorkers), 5);
  CHECK_EQ(kvx::ternary_sum_words(10, 0), 0);
  CHECK_EQ(kvx::ternary_sum_words(10, kvx::kMaxWorkers + 1), 0);
  CHECK_EQ(kvx::ternary_payload_words(15), 9);
  CHECK_EQ(kvx::ternary_payload_words(16), 10);
  CHECK_EQ(kvx::twobit_words(17), 2);

  // n is split into n mod 2^24 and n div 2^24 so that both words are exact.
  Floats p(kHeaderWords + 3);
  const int64_t big = (int64_t{5} << 24) + 7;
  kvx::write_header(p.data(), kvx::kCodecFp32, big, 0.5f, 2.0f, 3);
  CHECK_EQ(p[0], kvx::kMagic);
  CHECK_EQ(p[3], 7.0f);
  CHECK_EQ(p[4], 5.0f);
  float a = -1, b = -1;
  CHECK_EQ(kvx::check_header(p.data(), p.size(), kvx::kCodecFp32, big, &a, &b), kvx::kOk);
  CHECK_EQ(a, 0.5f);
  CHECK_EQ(b, 2.0f);
  CHECK_EQ(kvx::check_header(p.data(), 7, kvx::kCodecFp32, big, &a, &b), kvx::kBadSize);
  CHECK_EQ(kvx::check_header(p.data(), p.size(), kvx::kCodecFp32, big + 1, &a, &b),
           kvx::kBadSize);
  CHECK_EQ(kvx::check_header(p.data(), p.size() - 1, kvx::kCodecFp32, big, &a, &b),
           kvx::kBadSize);
  CHECK_EQ(kvx::check_header(p.data(), p.size(), kvx::kCodecTopk, big, &a, &b), kvx::kBadCodec);
  Floats q = p;
  q[0] = kNaN;
  CHECK_EQ(kvx::check_header(q.data(), q.size(), kvx::kCodecFp32, big, &a, &b), kvx::kBadMagic);
  q = p;
  q[2] = 2.0f;
  CHECK_EQ(kvx::check_header(q.data(), q.size(), kvx::kCodecFp32, big, &a, &b),
           kvx::kBadVersion);
  // Order of the checks: magic before version before codec.
  q[1] = kvx::kCodecTopk;
  CHECK_EQ(kvx::check_header(q.data(), q.size(), kvx::kCodecFp32, big, &a, &b),
           kvx::kBadVersion);
}

// ---- statistics -----------------------------------------------------------------------

void test_numpy_order_sum() {
  g_test = "numpy_order_sum";
  for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 255, 256, 1000, 8191, 8192,
                    8193, 20000, 100003}) {
    const Floats g = randn(n, 7 + n), r = randn(n, 11 + n, 0.1f);
    std::vector<double> terms(n);
    for (int64_t i = 0; i < n; ++i) terms[i] = std::fabs(static_cast<double>(g[i] + r[i]));
    CHECK_EQ(kvx::acc_abs_sum(g.data(), r.data(), n), numpy_sum_ref(terms));
    long double exact = 0;
    for (double v : terms) exact += v;
    CHECK(std::fabs(kvx::acc_abs_sum(g.data(), r.data(), n) - static_cast<double>(exact)) <=
          1e-12 * static_cast<double>(exact));
    // acc_abs_max: the largest |g + r| exactly (integer max over the bit patterns)
    float largest = 0.0f;
    for (int64_t i = 0; i < n; ++i) largest = std::max(largest, std::fabs(g[i] + r[i]));
    CHECK(bits_of(kvx::acc_abs_max(g.data(), r.data(), n)) == bits_of(largest));
  }
  CHECK_EQ(kvx::acc_abs_max(nullptr, nullptr, 0), 0.0f);
  {
    const Floats g = {1.0f, -kInf, 2.0f}, r(3, 0.0f);
    CHECK_EQ(kvx::acc_abs_max(g.data(), r.data(), 3), kInf);
    const Floats gn = {1.0f, std::nanf(""), -kInf};
    CHECK(std::isnan(kvx::acc_abs_max(gn.data(), r.data(), 3)));
  }
  // Filter scores use the same order per filter.
  const int64_t filters = 5, filter_size = 20000;
  const Floats x = randn(filters * filter_size, 3);
  std::vector<double> scores(filters);
  kvx::filter_scores(x.data(), filters, filter_size, scores.data());
  for (int64_t o = 0; o < filters; ++o) {
    std::vector<double> terms(filter_size);
    for (int64_t i = 0; i < filter_size; ++i) {
      const double v = x[o * filter_size + i];
      terms[i] = v * v;
    }
    CHECK_EQ(scores[o], numpy_sum_ref(terms));
  }
  const Floats zeros(filters * filter_size, 0.0f);
  kvx::acc_filter_scores(x.data(), zeros.data(), filters, filter_size, scores.data());
  std::vector<double> direct(filters);
  kvx::filter_scores(x.data(), filters, filter_size, direct.data());
  CHECK(scores == direct);
}

void test_finite() {
  g_test = "finite";
  Floats x = randn(1000, 1);
  CHECK(kvx::all_finite(x.data(), x.size()));
  CHECK(kvx::all_finite(x.data(), 0));
  for (float bad : {kNaN, kInf, -kInf}) {
    for (size_t at : {size_t{0}, size_t{17}, size_t{999}}) {
      Floats y = x;
      y[at] = bad;
      CHECK(!kvx::all_finite(y.data(), y.size()));
    }
  }
  Floats big(33, std::numeric_limits<float>::max());
  CHECK(kvx::all_finite(big.data(), big.size()));
  // grad + residual overflowing to Inf is non-finite although both are finite.
  CHECK(!kvx::acc_all_finite(big.data(), big.data(), big.size()));
  Floats denormal(40, std::numeric_limits<float>::denorm_min());
  CHECK(kvx::all_finite(denormal.data(), denormal.size()));
}

void test_select() {
  g_test = "select";
  // Ties resolve to the lower index; the result is ascending.
  const std::vector<double> scores = {1, 5, 3, 5, 0, 5, 3};
  std::vector<int64_t> idx(3);
  kvx::topk_select(scores.data(), 7, 3, idx.data());
  CHECK((idx == std::vector<int64_t>{1, 3, 5}));
  idx.resize(2);
  kvx::topk_select(scores.data(), 7, 2, idx.data());
  CHECK((idx == std::vector<int64_t>{1, 3}));
  idx.resize(5);
  kvx::topk_select(scores.data(), 7, 5, idx.data());
  CHECK((idx == std::vector<int64_t>{1, 2, 3, 5, 6}));
  idx.resize(7);
  kvx::topk_select(scores.data(), 7, 7, idx.data());
  CHECK((idx == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  // Against a full sort, on many duplicates.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t o = 1 + rng() % 200, k = 1 + rng() % o;
    std::vector<double> s(o);
    for (auto& v : s) v = static_cast<double>(rng() % 7);
    std::vector<int64_t> order(o);
    for (int64_t i = 0; i < o; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
    order.resize(k);
    std::sort(order.begin(), order.end());
    std::vector<int64_t> got(k);
    kvx::topk_select(s.data(), o, k, got.data());
    CHECK(got == order);
  }
}

// ---- fp32 -----------------------------------------------------------------------------

void test_fp32() {
  g_test = "fp32";
  for (int64_t n : {1, 15, 1000}) {
    const Floats g = randn(n, n);
    Floats payload(kvx::fp32_payload_words(n));
    CHECK_EQ(kvx::fp32_encode(g.data(), n, payload.data()), kvx::kOk);
    CHECK_EQ(payload[1], kvx::kCodecFp32);
    Floats out(n);
    CHECK_EQ(kvx::fp32_decode(payload.data(), payload.size(), n, out.data()), kvx::kOk);
    CHECK(same_bits(out, g));
    Floats acc(n, 1.0f);
    CHECK_EQ(kvx::fp32_decode_add(payload.data(), payload.size(), n, acc.data()), kvx::kOk);
    for (int64_t i = 0; i < n; ++i) CHECK_EQ(acc[i], 1.0f + g[i]);
    // Wrong expected size, truncated payload: rejected, zeros, acc untouched.
    Floats longer(n + 1, 5.0f);
    CHECK_EQ(kvx::fp32_decode(payload.data(), payload.size(), n + 1, longer.data()),
             kvx::kBadSize);
    CHECK(all_zero(longer));
    CHECK_EQ(kvx::fp32_decode(payload.data(), payload.size() - 1, n, out.data()), kvx::kBadSize);
    CHECK(all_zero(out));
    const Floats before = acc;
    CHECK_EQ(kvx::fp32_decode_add(payload.data(), 3, n, acc.data()), kvx::kBadSize);
    CHECK(same_bits(acc, before));
  }
  Floats g = randn(20, 1);
  g[13] = kNaN;
  Floats payload(kvx::fp32_payload_words(20), 9.0f);
  CHECK_EQ(kvx::fp32_encode(g.data(), 20, payload.data()), kvx::kNonFinite);
  CHECK(all_zero(payload));
  Floats out(20, 9.0f);
  CHECK_EQ(kvx::fp32_decode(payload.data(), payload.size(), 20, out.data()), kvx::kBadMagic);
  CHECK(all_zero(out));
}

// ---- top-k ----------------------------------------------------------------------------

void test_topk_hand() {
  g_test = "topk_hand";
  // 4 filters of 2: norms^2 of acc = 25, 1, 25, 4 -> k=2 picks 0 and 2 (tie -> both).
  const Floats grad = {3, 4, 1, 0, 0, 5, 2, 0};
  Floats residual = {0, 0, 0, 0, 0, 0, 0, 0};
  Floats payload(kvx::topk_payload_words(2, 2));
  CHECK_EQ(kvx::topk_encode(grad.data(), residual.data(), 4, 2, 2, payload.data()), kvx::kOk);
  const Floats expected = {kvx::kMagic, kvx::kCodecTopk, kvx::kVersion, 8, 0, 2, 2, 6,
                           0, 2, 3, 4, 0, 5};
  CHECK(same_bits(payload, expected));
  CHECK(same_bits(residual, Floats({0, 0, 1, 0, 0, 0, 2, 0})));
  // k = 1 with a three-way tie at the top picks the lowest index.
  const Floats tie = {1, 0, 0, 1, 1, 0};
  Floats res2(6, 0.0f);
  Floats p1(kvx::topk_payload_words(1, 2));
  CHECK_EQ(kvx::topk_encode(tie.data(), res2.data(), 3, 2, 1, p1.data()), kvx::kOk);
  CHECK_EQ(p1[8], 0.0f);
  CHECK_EQ(p1[9], 1.0f);
}

// Encodes, decodes, checks the invariant decoded + residual == acc (exact for top-k).
void check_topk_roundtrip(const Floats& grad, const Floats& residual0, int64_t filters,
                          int64_t k) {
  const int64_t n = grad.size(), f = n / filters;
  const Floats acc = add(grad, residual0);
  Floats residual = residual0;
  Floats payload(kvx::topk_payload_words(k, f));
  CHECK_EQ(kvx::topk_encode(grad.data(), residual.data(), filters, f, k, payload.data()),
           kvx::kOk);
  Floats out(n);
  CHECK_EQ(kvx::topk_decode(payload.data(), payload.size(), n, out.data()), kvx::kOk);
  bool exact = true;
  int64_t sent = 0;
  for (int64_t i = 0; i < n; ++i) {
    exact = exact && bits_of(out[i] + residual[i]) == bits_of(acc[i] + 0.0f);
    sent += residual[i] == 0.0f && out[i] == acc[i];
  }
  CHECK(exact);
  CHECK(sent >= k * f);
  // Indices ascending and the k best.
  for (int64_t s = 1; s < k; ++s) CHECK(payload[kHeaderWords + s] > payload[kHeaderWords + s - 1]);
  // decode_add touches the sent filters only.
  Floats acc2(n, 2.0f);
  CHECK_EQ(kvx::topk_decode_add(payload.data(), payload.size(), n, acc2.data()), kvx::kOk);
  for (int64_t i = 0; i < n; ++i) CHECK_EQ(acc2[i], 2.0f + out[i]);
}

void test_topk_roundtrips() {
  g_test = "topk_roundtrip";
  check_topk_roundtrip(randn(64 * 27, 1), randn(64 * 27, 2, 0.1f), 64, 5);
  check_topk_roundtrip(randn(64 * 27, 3), randn(64 * 27, 4, 0.1f), 64, 1);
  check_topk_roundtrip(randn(64 * 27, 5), randn(64 * 27, 6, 0.1f), 64, 64);
  check_topk_roundtrip(randn(1, 7), randn(1, 8), 1, 1);               // single element
  check_topk_roundtrip(randn(7, 9), randn(7, 10), 7, 3);              // 1-D: F = 1
  check_topk_roundtrip(Floats(40, 0.0f), Floats(40, 0.0f), 8, 3);     // zeros: ties
  check_topk_roundtrip(Floats(40, 1.5f), Floats(40, 0.0f), 8, 3);     // all filters equal
  check_topk_roundtrip(randn(3 * 20000, 11, 1e30f), randn(3 * 20000, 12, 1e-30f), 3, 2);
  check_topk_roundtrip(randn(2 * 9, 13, 1e-30f), randn(2 * 9, 14, 1e-30f), 2, 1);

  // Equal filters and zeros pick the first k.
  Floats grad(40, 1.5f), residual(40, 0.0f);
  Floats payload(kvx::topk_payload_words(3, 5));
  CHECK_EQ(kvx::topk_encode(grad.data(), residual.data(), 8, 5, 3, payload.data()), kvx::kOk);
  CHECK(payload[8] == 0 && payload[9] == 1 && payload[10] == 2);
}

void test_topk_nonfinite() {
  g_test = "topk_nonfinite";
  for (float bad : {kNaN, kInf, -kInf}) {
    Floats grad = randn(60, 1);
    grad[37] = bad;
    Floats residual = randn(60, 2);
    const Floats before = residual;
    Floats payload(kvx::topk_payload_words(2, 6), 5.0f);
    CHECK_EQ(kvx::topk_encode(grad.data(), residual.data(), 10, 6, 2, payload.data()),
             kvx::kNonFinite);
    CHECK(same_bits(residual, before));
    CHECK(all_zero(payload));
  }
  Floats grad(12, 1.0f), residual(12, 0.0f);
  Floats payload(kvx::topk_payload_words(5, 3));
  CHECK_EQ(kvx::topk_encode(grad.data(), residual.data(), 4, 3, 5, payload.data()),
           kvx::kBadParam);
  CHECK_EQ(kvx::topk_encode(grad.data(), residual.data(), 4, 3, 0, payload.data()),
           kvx::kBadParam);
}

void test_topk_malformed() {
  g_test = "topk_malformed";
  const int64_t filters = 6, f = 4, n = filters * f, k = 3;
  Floats grad = randn(n, 3), residual(n, 0.0f);
  Floats good(kvx::topk_payload_words(k, f));
  CHECK_EQ(kvx::topk_encode(grad.data(), residual.data(), filters, f, k, good.data()), kvx::kOk);
  auto decode = [&](const Floats& p) {
    Floats out(n, 7.0f);
    const int status = kvx::topk_decode(p.data(), p.size(), n, out.data());
    if (status != kvx::kOk) CHECK(all_zero(out));
    Floats acc(n, 1.0f);
    CHECK_EQ(kvx::topk_decode_add(p.data(), p.size(), n, acc.data()), status);
    if (status != kvx::kOk) CHECK(same_bits(acc, Floats(n, 1.0f)));
    return status;
  };
  CHECK_EQ(decode(good), kvx::kOk);
  auto with = [&](size_t at, float v) {
    Floats p = good;
    p[at] = v;
    return p;
  };
  CHECK_EQ(decode(with(0, 1.0f)), kvx::kBadMagic);
  CHECK_EQ(decode(with(1, kvx::kCodecTernary)), kvx::kBadCodec);
  CHECK_EQ(decode(with(2, 0.0f)), kvx::kBadVersion);
  CHECK_EQ(decode(with(3, n + 1.0f)), kvx::kBadSize);
  CHECK_EQ(decode(with(7, 1.0f)), kvx::kBadSize);
  CHECK_EQ(decode(Floats(good.begin(), good.begin() + 5)), kvx::kBadSize);
  // Parameters: k, F non-integral / zero / NaN / Inf, F not dividing n, k*F > n.
  CHECK_EQ(decode(with(5, 2.5f)), kvx::kBadParam);
  CHECK_EQ(decode(with(5, 0.0f)), kvx::kBadParam);
  CHECK_EQ(decode(with(5, kNaN)), kvx::kBadParam);
  CHECK_EQ(decode(with(5, kInf)), kvx::kBadParam);
  CHECK_EQ(decode(with(6, kNaN)), kvx::kBadParam);
  CHECK_EQ(decode(with(6, 5.0f)), kvx::kBadParam);   // 24 % 5 != 0
  CHECK_EQ(decode(with(6, 1e30f)), kvx::kBadParam);
  CHECK_EQ(decode(with(6, kInf)), kvx::kBadParam);
  CHECK_EQ(decode(with(5, 1e30f)), kvx::kBadParam);  // huge k: k*F > n before any cast
  CHECK_EQ(decode(with(5, -kInf)), kvx::kBadParam);
  CHECK_EQ(decode(with(5, 2.0f)), kvx::kBadParam);   // payload size != 8 + k + k*F
  {
    // Consistent header but k*F > n.
    Floats p(kHeaderWords + 7 + 7 * 4, 0.0f);
    kvx::write_header(p.data(), kvx::kCodecTopk, n, 7, 4, 7 + 7 * 4);
    for (int s = 0; s < 7; ++s) p[kHeaderWords + s] = static_cast<float>(s);
    CHECK_EQ(decode(p), kvx::kBadParam);
  }
  // Indices: non-integral, negative, out of range, NaN, repeated, descending.
  CHECK_EQ(decode(with(8, 0.5f)), kvx::kBadIndex);
  CHECK_EQ(decode(with(8, -1.0f)), kvx::kBadIndex);
  CHECK_EQ(decode(with(10, 6.0f)), kvx::kBadIndex);
  CHECK_EQ(decode(with(9, kNaN)), kvx::kBadIndex);
  CHECK_EQ(decode(with(9, good[8])), kvx::kBadIndex);
  {
    Floats p = good;
    std::swap(p[8], p[10]);
    CHECK_EQ(decode(p), kvx::kBadIndex);
  }
}

void test_topk_gather_scatter() {
  g_test = "topk_gather_scatter";
  const int64_t filters = 5, f = 3, n = filters * f;
  const Floats grad = randn(n, 1), residual0 = randn(n, 2);
  const Floats acc = add(grad, residual0);
  const Floats indices = {1, 4};
  Floats residual = residual0;
  Floats values(2 * f);
  CHECK_EQ(kvx::topk_gather(grad.data(), residual.data(), filters, f, indices.data(), 2,
                            values.data()),
           kvx::kOk);
  for (int64_t j = 0; j < f; ++j) {
    CHECK_EQ(values[j], acc[1 * f + j]);
    CHECK_EQ(values[f + j], acc[4 * f + j]);
    CHECK_EQ(residual[1 * f + j], 0.0f);
    CHECK_EQ(residual[0 * f + j], acc[0 * f + j]);
  }
  Floats out(n, 3.0f);
  CHECK_EQ(kvx::topk_scatter(values.data(), indices.data(), 2, filters, f, out.data()), kvx::kOk);
  for (int64_t i = 0; i < n; ++i) CHECK_EQ(out[i] + residual[i], acc[i]);

  const Floats bad_sets[] = {{1, 1}, {4, 1}, {-1, 2}, {1, 5}, {0.5f, 2}, {kNaN, 2}};
  for (const Floats& bad : bad_sets) {
    Floats r = residual0;
    Floats v(2 * f, 4.0f);
    CHECK_EQ(kvx::topk_gather(grad.data(), r.data(), filters, f, bad.data(), 2, v.data()),
             kvx::kBadIndex);
    CHECK(same_bits(r, residual0));
    CHECK(all_zero(v));
    Floats o(n, 4.0f);
    CHECK_EQ(kvx::topk_scatter(values.data(), bad.data(), 2, filters, f, o.data()),
             kvx::kBadIndex);
    CHECK(all_zero(o));
  }
  // More indices than filters: a parameter error before any index is read.
  const Floats six = {0, 1, 2, 3, 4, 5};
  Floats many(6 * f, 1.0f), o6(n, 4.0f);
  CHECK_EQ(kvx::topk_scatter(many.data(), six.data(), 6, filters, f, o6.data()),
           kvx::kBadParam);
  CHECK(all_zero(o6));
  // No index at all: zeros, ok.
  CHECK_EQ(kvx::topk_scatter(values.data(), indices.data(), 0, filters, f, o6.data()), kvx::kOk);
  CHECK(all_zero(o6));
  Floats g2 = grad;
  g2[7] = kInf;
  Floats r = residual0;
  Floats v(2 * f, 4.0f);
  CHECK_EQ(kvx::topk_gather(g2.data(), r.data(), filters, f, indices.data(), 2, v.data()),
           kvx::kNonFinite);
  CHECK(same_bits(r, residual0));
  CHECK(all_zero(v));
}

// ---- ternary --------------------------------------------------------------------------

void test_ternary_hand() {
  g_test = "ternary_hand";
  // acc = [0.5, -0.5, 0.2, 1.0, -1.0, 0], t = 0.5: codes [1, -1, 0, 1, -1, 0],
  // digits [2, 0, 1, 2, 0, 1] -> 2 + 9 + 2*27 + 243 = 308.
  const Floats grad = {0.5f, -0.5f, 0.2f, 1.0f, -1.0f, 0.0f};
  Floats residual(6, 0.0f);
  Floats payload(kvx::ternary_payload_words(6));
  CHECK_EQ(kvx::ternary_encode(grad.data(), residual.data(), 6, 1.0, 0.5, payload.data()),
           kvx::kOk);
  const Floats expected = {kvx::kMagic, kvx::kCodecTernary, kvx::kVersion, 6, 0, 0.5f, 3, 1, 308};
  CHECK(same_bits(payload, expected));
  CHECK(same_bits(residual, Floats({0.0f, 0.0f, 0.2f, 0.5f, -0.5f, 0.0f})));
  Floats out(6);
  CHECK_EQ(kvx::ternary_decode(payload.data(), payload.size(), 6, out.data()), kvx::kOk);
  CHECK(same_bits(out, Floats({0.5f, -0.5f, 0.0f, 0.5f, -0.5f, 0.0f})));

  // value_rule kValueRound: the same codes, each worth 2t = 1; the residual of a sent
  // value stays within +-t; an unknown rule (1, the former 'mean', or 3) is a bad
  // parameter, payload zeroed and residual untouched.
  Floats res_round(6, 0.0f);
  CHECK_EQ(kvx::ternary_encode(grad.data(), res_round.data(), 6, 1.0, 0.5, payload.data(),
                               kvx::kValueRound),
           kvx::kOk);
  const Floats expected_round = {kvx::kMagic, kvx::kCodecTernary, kvx::kVersion, 6, 0, 1.0f, 3,
                                 1, 308};
  CHECK(same_bits(payload, expected_round));
  CHECK(same_bits(res_round, Floats({-0.5f, 0.5f, 0.2f, 0.0f, 0.0f, 0.0f})));
  for (int rule : {1, 3, -1}) {
    Floats res_bad(6, 0.0f);
    CHECK_EQ(kvx::ternary_encode(grad.data(), res_bad.data(), 6, 1.0, 0.5, payload.data(), rule),
             kvx::kBadParam);
    CHECK(all_zero(res_bad));
    CHECK(all_zero(payload));
  }

  // Adaptive: t = scale * mean|acc| = 1.5 * (3.2 / 6) ~ 0.8 < max|acc|: not capped.
  Floats res2(6, 0.0f);
  CHECK_EQ(kvx::ternary_encode(grad.data(), res2.data(), 6, 1.5, 0.0, payload.data()), kvx::kOk);
  const double mean = (0.5 + 0.5 + static_cast<double>(0.2f) + 1.0 + 1.0 + 0.0) / 6.0;
  CHECK_EQ(payload[5], static_cast<float>(1.5 * mean));
  // Delivery cap: 2 * mean|acc| ~ 1.07 > max|acc| = 1, so t = 1: the two values at 1
  // are sent whole (v = t under every rule), the rest stays.
  for (int rule : {kvx::kValueThreshold, kvx::kValueRound}) {
    Floats res3(6, 0.0f);
    CHECK_EQ(kvx::ternary_encode(grad.data(), res3.data(), 6, 2.0, 0.0, payload.data(), rule),
             kvx::kOk);
    CHECK_EQ(payload[5], 1.0f);
    CHECK_EQ(payload[8], 1.0f + 3 + 9 + 2 * 27 + 0 * 81 + 243);
    CHECK(same_bits(res3, Floats({0.5f, -0.5f, 0.2f, 0.0f, 0.0f, 0.0f})));
  }

  // Zeros: t = 0, no code, every digit 1 (full words are (3^15 - 1) / 2).
  Floats zeros(30, 0.0f), zres(30, 0.0f);
  Floats zp(kvx::ternary_payload_words(30));
  CHECK_EQ(kvx::ternary_encode(zeros.data(), zres.data(), 30, 1.0, 0.0, zp.data()), kvx::kOk);
  CHECK_EQ(zp[5], 0.0f);
  CHECK_EQ(zp[8], 7174453.0f);
  CHECK_EQ(zp[9], 7174453.0f);
  Floats zout(30, 1.0f);
  CHECK_EQ(kvx::ternary_decode(zp.data(), zp.size(), 30, zout.data()), kvx::kOk);
  CHECK(same_bits(zout, Floats(30, 0.0f)));
}

void check_ternary_roundtrip(int64_t n, double scale, double threshold, uint32_t seed,
                             float magnitude) {
  const Floats grad = randn(n, seed, magnitude), residual0 = randn(n, seed + 1, magnitude * 0.1f);
  const Floats acc = add(grad, residual0);
  Floats residual = residual0;
  Floats payload(kvx::ternary_payload_words(n));
  CHECK_EQ(kvx::ternary_encode(grad.data(), residual.data(), n, scale, threshold, payload.data()),
           kvx::kOk);
  const float t = payload[5];
  if (threshold > 0) CHECK_EQ(t, static_cast<float>(threshold));
  Floats out(n);
  CHECK_EQ(kvx::ternary_decode(payload.data(), payload.size(), n, out.data()), kvx::kOk);
  bool codes_ok = true, residual_ok = true, invariant_ok = true;
  for (int64_t i = 0; i < n; ++i) {
    const int c = code_of(acc[i], t);
    codes_ok = codes_ok && bits_of(out[i]) == bits_of(static_cast<float>(c) * t);
    residual_ok = residual_ok &&
                  bits_of(residual[i]) == bits_of(acc[i] - static_cast<float>(c) * t);
    // decoded + residual == acc holds exactly where acc - c*t is exact (c == 0, or
    // |acc| <= 2t by Sterbenz); elsewhere it is off by the rounding of acc - c*t, at most
    // half an ulp of acc (float32 cannot hold acc - t exactly when |acc| >> t).
    const double err = static_cast<double>(out[i]) + residual[i] - acc[i];
    const double half_ulp =
        0.5 * std::fabs(std::nextafter(acc[i], acc[i] > 0 ? kInf : -kInf) - acc[i]);
    if (c == 0 || std::fabs(acc[i]) <= 2 * t)
      invariant_ok = invariant_ok && err == 0.0;
    else
      invariant_ok = invariant_ok && std::fabs(err) <= half_ulp;
  }
  CHECK(codes_ok);
  CHECK(residual_ok);
  CHECK(invariant_ok);
  Floats acc2(n, 1.0f);
  CHECK_EQ(kvx::ternary_decode_add(payload.data(), payload.size(), n, acc2.data()), kvx::kOk);
  bool add_ok = true;
  for (int64_t i = 0; i < n; ++i) add_ok = add_ok && acc2[i] == 1.0f + out[i];
  CHECK(add_ok);
}

void test_ternary_roundtrips() {
  g_test = "ternary_roundtrip";
  uint32_t seed = 100;
  for (int64_t n : {1, 2, 14, 15, 16, 29, 30, 31, 239, 240, 241, 1000, 100003}) {
    check_ternary_roundtrip(n, 1.0, 0.0, seed++, 1.0f);
    check_ternary_roundtrip(n, 0.5, 0.0, seed++, 1.0f);
    check_ternary_roundtrip(n, 1.0, 0.3, seed++, 1.0f);
  }
  check_ternary_roundtrip(5000, 1.0, 0.0, seed++, 1e30f);
  check_ternary_roundtrip(5000, 1.0, 0.0, seed++, 1e-30f);
  check_ternary_roundtrip(5000, 2.0, 0.0, seed++, 1e-38f);  // denormal territory
}

void test_ternary_nonfinite() {
  g_test = "ternary_nonfinite";
  for (double threshold : {0.0, 0.5}) {
    for (float bad : {kNaN, kInf, -kInf}) {
      const Floats grad0 = randn(50, 3);
      Floats grad = grad0;
      grad[49] = bad;
      Floats residual = randn(50, 4);
      const Floats before = residual;
      Floats payload(kvx::ternary_payload_words(50), 3.0f);
      CHECK_EQ(kvx::ternary_encode(grad.data(), residual.data(), 50, 1.0, threshold,
                                   payload.data()),
               kvx::kNonFinite);
      CHECK(same_bits(residual, before));
      CHECK(all_zero(payload));
    }
  }
  // Finite grad and residual whose float32 sum overflows.
  Floats big(20, 3e38f), residual(20, 3e38f);
  const Floats before = residual;
  Floats payload(kvx::ternary_payload_words(20));
  CHECK_EQ(kvx::ternary_encode(big.data(), residual.data(), 20, 1.0, 0.0, payload.data()),
           kvx::kNonFinite);
  CHECK(same_bits(residual, before));
  // An adaptive t beyond float32's range: scale * mean|acc| = 2 * 3e38.  Non-finite,
  // nothing sent, residual untouched (acc itself is finite here).
  {
    Floats g(20, 3e38f), r(20, 0.0f);
    Floats p(kvx::ternary_payload_words(20), 5.0f);
    CHECK_EQ(kvx::ternary_encode(g.data(), r.data(), 20, 2.0, 0.0, p.data()), kvx::kNonFinite);
    CHECK(same_bits(r, Floats(20, 0.0f)));
    CHECK(all_zero(p));
    // ... and through a huge scale on ordinary values.
    Floats g3 = randn(20, 9);
    Floats r3 = randn(20, 10);
    const Floats r3_before = r3;
    CHECK_EQ(kvx::ternary_encode(g3.data(), r3.data(), 20, 1e300, 0.0, p.data()),
             kvx::kNonFinite);
    CHECK(same_bits(r3, r3_before));
    CHECK(all_zero(p));
    // The largest t that rounds to a finite float32 is fine.
    CHECK_EQ(kvx::ternary_encode(g.data(), r.data(), 20, 1.0, 0.0, p.data()), kvx::kOk);
    CHECK_EQ(p[5], 3e38f);
  }
  // Invalid parameters; a fixed threshold must be finite in float32 too.
  CHECK_EQ(kvx::ternary_encode(big.data(), residual.data(), 20, 1.0, 1e39, payload.data()),
           kvx::kBadParam);
  CHECK_EQ(kvx::ternary_encode(big.data(), residual.data(), 20, -1.0, 0.0, payload.data()),
           kvx::kBadParam);
  CHECK_EQ(kvx::ternary_encode(big.data(), residual.data(), 20, 1.0, -0.5, payload.data()),
           kvx::kBadParam);
  CHECK_EQ(kvx::ternary_encode(big.data(), residual.data(), 20, 1.0,
                               std::numeric_limits<double>::quiet_NaN(), payload.data()),
           kvx::kBadParam);
  CHECK(same_bits(residual, before));
}

void test_ternary_malformed() {
  g_test = "ternary_malformed";
  const int64_t n = 31;
  Floats grad = randn(n, 8), residual(n, 0.0f);
  Floats good(kvx::ternary_payload_words(n));
  CHECK_EQ(kvx::ternary_encode(grad.data(), residual.data(), n, 1.0, 0.0, good.data()), kvx::kOk);
  auto decode = [&](const Floats& p) {
    Floats out(n, 7.0f);
    const int status = kvx::ternary_decode(p.data(), p.size(), n, out.data());
    if (status != kvx::kOk) CHECK(all_zero(out));
    Floats acc(n, 1.0f);
    CHECK_EQ(kvx::ternary_decode_add(p.data(), p.size(), n, acc.data()), status);
    if (status != kvx::kOk) CHECK(same_bits(acc, Floats(n, 1.0f)));
    return status;
  };
  auto with = [&](size_t at, float v) {
    Floats p = good;
    p[at] = v;
    return p;
  };
  CHECK_EQ(decode(good), kvx::kOk);
  CHECK_EQ(decode(with(0, 0.0f)), kvx::kBadMagic);
  CHECK_EQ(decode(with(2, 1.5f)), kvx::kBadVersion);
  CHECK_EQ(decode(with(1, kvx::kCodecTopk)), kvx::kBadCodec);
  CHECK_EQ(decode(with(4, 1.0f)), kvx::kBadSize);
  CHECK_EQ(decode(Floats()), kvx::kBadSize);
  CHECK_EQ(decode(with(6, 5.0f)), kvx::kBadParam);   // base
  CHECK_EQ(decode(with(5, -1.0f)), kvx::kBadParam);  // t < 0
  CHECK_EQ(decode(with(5, kNaN)), kvx::kBadParam);
  CHECK_EQ(decode(with(5, kInf)), kvx::kBadParam);
  {
    // Header consistent with an extra body word: wrong body length for n.
    Floats p = good;
    p.push_back(0.0f);
    p[7] += 1.0f;
    CHECK_EQ(decode(p), kvx::kBadParam);
  }
  CHECK_EQ(decode(with(8, 1.5f)), kvx::kBadWord);
  CHECK_EQ(decode(with(9, -1.0f)), kvx::kBadWord);
  CHECK_EQ(decode(with(10, 14348907.0f)), kvx::kBadWord);  // 3^15
  CHECK_EQ(decode(with(10, kNaN)), kvx::kBadWord);
  CHECK_EQ(decode(with(10, kInf)), kvx::kBadWord);
  CHECK_EQ(decode(with(10, 14348906.0f)), kvx::kOk);       // 3^15 - 1 is valid
  CHECK_EQ(decode(with(10, -0.0f)), kvx::kOk);             // -0 is the integer 0
}

// ---- homomorphic ternary ----------------------------------------------------------------

void test_ternary_sum() {
  g_test = "ternary_sum";
  const double t = 0.4;
  const float tf = static_cast<float>(t);
  for (int64_t workers : {1, 2, 3, 4, 7, 8, 16}) {
    const int64_t base = kvx::sum_base(workers);
    const int d = sum_digits(workers);
    for (int64_t n : {int64_t{1}, int64_t{d - 1}, int64_t{d}, int64_t{d + 1}, int64_t{33},
                      int64_t{34}, int64_t{1000}, int64_t{5003}}) {
      if (n < 1) continue;
      const int64_t num_words = kvx::ternary_sum_words(n, workers);
      CHECK_EQ(num_words, (n + d - 1) / d);
      Floats total(num_words, 0.0f);
      std::vector<int64_t> code_sum(n, 0);
      for (int64_t w = 0; w < workers; ++w) {
        const uint32_t seed = static_cast<uint32_t>(1000 * workers + 10 * n + w);
        const Floats grad = randn(n, seed), residual0 = randn(n, seed + 7, 0.2f);
        const Floats acc = add(grad, residual0);
        Floats residual = residual0;
        Floats words(num_words, 9.0f);
        CHECK_EQ(kvx::ternary_encode_sum(grad.data(), residual.data(), n, t, workers,
                                         words.data()),
                 kvx::kOk);
        std::vector<int64_t> digits(n);
        bool residual_ok = true;
        for (int64_t i = 0; i < n; ++i) {
          const int c = code_of(acc[i], tf);
          digits[i] = c + 1;
          code_sum[i] += c;
          residual_ok = residual_ok &&
                        bits_of(residual[i]) == bits_of(acc[i] - static_cast<float>(c) * tf);
        }
        CHECK(residual_ok);
        CHECK(same_bits(words, pack_ref(digits, base, d)));
        for (int64_t i = 0; i < num_words; ++i) total[i] += words[i];  // float32, as the server
      }
      // The float32 sum of the payloads is the packing of the summed codes + n, exactly.
      std::vector<int64_t> summed_digits(n);
      for (int64_t i = 0; i < n; ++i) summed_digits[i] = code_sum[i] + workers;
      CHECK(same_bits(total, pack_ref(summed_digits, base, d)));
      Floats out(n, 5.0f);
      CHECK_EQ(kvx::ternary_decode_sum(total.data(), num_words, t, workers, n, out.data()),
               kvx::kOk);
      bool out_ok = true;
      for (int64_t i = 0; i < n; ++i)
        out_ok = out_ok && bits_of(out[i]) == bits_of(static_cast<float>(code_sum[i]) * tf);
      CHECK(out_ok);
    }
  }
  // t = 0: every code 0, every digit 1, nothing leaves the residual.
  const Floats g = randn(20, 5), r0 = randn(20, 6);
  Floats r = r0;
  Floats words(kvx::ternary_sum_words(20, 2));
  CHECK_EQ(kvx::ternary_encode_sum(g.data(), r.data(), 20, 0.0, 2, words.data()), kvx::kOk);
  CHECK(same_bits(words, pack_ref(std::vector<int64_t>(20, 1), 5, 10)));
  CHECK(same_bits(r, add(g, r0)));
}

// The server adds float32 words in an order of its choosing.  Every partial sum of the
// workers' words is an integer below b^D <= 2^24, so every order gives the same, exact
// total: here random orders (and worst cases: every code +1 or every code -1), summed in
// float32, against the packing of the summed codes.
void test_ternary_sum_any_order() {
  g_test = "ternary_sum_any_order";
  std::mt19937 rng(2024);
  for (int64_t workers : {1, 2, 3, 4, 8, 16}) {
    const int64_t base = kvx::sum_base(workers);
    const int d = sum_digits(workers);
    const int64_t n = 40 * d + 3;
    const int64_t num_words = kvx::ternary_sum_words(n, workers);
    for (int pattern = 0; pattern < 3; ++pattern) {  // random, all +1, all -1
      std::vector<Floats> payloads;
      std::vector<int64_t> code_sum(n, 0);
      for (int64_t w = 0; w < workers; ++w) {
        Floats grad = randn(n, static_cast<uint32_t>(77 * workers + w + 1000 * pattern));
        if (pattern > 0) grad.assign(n, pattern == 1 ? 5.0f : -5.0f);
        Floats residual(n, 0.0f);
        Floats words(num_words);
        CHECK_EQ(kvx::ternary_encode_sum(grad.data(), residual.data(), n, 0.5, workers,
                                         words.data()),
                 kvx::kOk);
        for (int64_t i = 0; i < n; ++i) code_sum[i] += code_of(grad[i], 0.5f);
        payloads.push_back(words);
      }
      std::vector<int64_t> summed(n);
      for (int64_t i = 0; i < n; ++i) summed[i] = code_sum[i] + workers;
      const Floats expected = pack_ref(summed, base, d);
      std::vector<size_t> order(workers);
      for (size_t w = 0; w < order.size(); ++w) order[w] = w;
      for (int trial = 0; trial < 8; ++trial) {
        std::shuffle(order.begin(), order.end(), rng);
        // Sequential accumulation in this order ...
        Floats total(num_words, 0.0f);
        for (size_t w : order)
          for (int64_t i = 0; i < num_words; ++i) total[i] += payloads[w][i];
        CHECK(same_bits(total, expected));
        // ... and a pairwise tree over the same order.
        std::vector<Floats> level;
        for (size_t w : order) level.push_back(payloads[w]);
        while (level.size() > 1) {
          std::vector<Floats> next;
          for (size_t k = 0; k + 1 < level.size(); k += 2) {
            Floats sum(num_words);
            for (int64_t i = 0; i < num_words; ++i) sum[i] = level[k][i] + level[k + 1][i];
            next.push_back(sum);
          }
          if (level.size() % 2) next.push_back(level.back());
          level.swap(next);
        }
        CHECK(same_bits(level[0], expected));
      }
      Floats out(n);
      CHECK_EQ(kvx::ternary_decode_sum(expected.data(), num_words, 0.5, workers, n, out.data()),
               kvx::kOk);
      bool ok = true;
      for (int64_t i = 0; i < n; ++i)
        ok = ok && bits_of(out[i]) == bits_of(static_cast<float>(code_sum[i]) * 0.5f);
      CHECK(ok);
    }
  }
}

// Decoding alone, for worker counts whose payloads are too many to build in a test:
// random code sums in [-n, n], packed by the reference packer.  The decoder's table has
// between 2048 and 8192 rows depending on n, so small and large n take different chunk
// layouts, and bases beyond the table (1024 workers and more for small n, 4096 for large)
// go digit by digit.
void test_ternary_sum_decode_bases() {
  g_test = "ternary_sum_decode_bases";
  std::mt19937 rng(77);
  for (int64_t workers : std::vector<int64_t>{1, 2, 3, 4, 5, 6, 8, 13, 16, 22, 23, 31, 32, 63,
                                              64, 100, 511, 512, 1023, 1024, 2047, 4095, 4096,
                                              20000, kvx::kMaxWorkers}) {
    const int64_t base = kvx::sum_base(workers);
    const int d = sum_digits(workers);
    for (int64_t n : {int64_t{1}, int64_t{d}, int64_t{d + 1}, int64_t{5 * d + 3},
                      int64_t{32768 + 1}, int64_t{131072 + 7}}) {
      std::vector<int64_t> sums(n), digits(n);
      for (int64_t i = 0; i < n; ++i) {
        // Extremes first, then random.
        sums[i] = i == 0 ? workers : i == 1 ? -workers
                : static_cast<int64_t>(rng() % (2 * workers + 1)) - workers;
        digits[i] = sums[i] + workers;
      }
      const Floats words = pack_ref(digits, base, d);
      Floats out(n, 3.0f);
      CHECK_EQ(kvx::ternary_decode_sum(words.data(), words.size(), 0.25, workers, n, out.data()),
               kvx::kOk);
      bool ok = true;
      for (int64_t i = 0; i < n; ++i)
        ok = ok && bits_of(out[i]) == bits_of(static_cast<float>(sums[i]) * 0.25f);
      CHECK(ok);
    }
    // Largest valid word: every digit base - 1.
    std::vector<int64_t> top(d, base - 1);
    const Floats words = pack_ref(top, base, d);
    Floats out(d);
    CHECK_EQ(kvx::ternary_decode_sum(words.data(), 1, 1.0, workers, d, out.data()), kvx::kOk);
    bool ok = true;
    for (int j = 0; j < d; ++j) ok = ok && out[j] == static_cast<float>(workers);
    CHECK(ok);
  }
}

void test_ternary_sum_errors() {
  g_test = "ternary_sum_errors";
  const int64_t n = 20, workers = 4;
  const int64_t num_words = kvx::ternary_sum_words(n, workers);  // 3: 7 digits a word
  CHECK_EQ(num_words, 3);
  Floats grad = randn(n, 1), residual = randn(n, 2);
  const Floats before = residual;
  // Parameters: zeroed words (when their count is known), residual untouched.
  for (double bad_t : {-0.5, 1e39, std::nan(""), HUGE_VAL}) {
    Floats words(num_words, 5.0f);
    CHECK_EQ(kvx::ternary_encode_sum(grad.data(), residual.data(), n, bad_t, workers,
                                     words.data()),
             kvx::kBadParam);
    CHECK(all_zero(words));
    CHECK(same_bits(residual, before));
  }
  Floats words(num_words, 5.0f);
  CHECK_EQ(kvx::ternary_encode_sum(grad.data(), residual.data(), n, 0.5, 0, words.data()),
           kvx::kBadParam);
  CHECK_EQ(kvx::ternary_encode_sum(grad.data(), residual.data(), n, 0.5, kvx::kMaxWorkers + 1,
                                   words.data()),
           kvx::kBadParam);
  CHECK(same_bits(residual, before));
  // Non-finite acc.
  grad[3] = kNaN;
  CHECK_EQ(kvx::ternary_encode_sum(grad.data(), residual.data(), n, 0.5, workers, words.data()),
           kvx::kNonFinite);
  CHECK(same_bits(residual, before));
  CHECK(all_zero(words));

  // Words: integers in [0, 9^7).
  const float limit = 4782969.0f;  // 9^7, exact in float32
  for (float bad : {-1.0f, 0.5f, limit, limit + 1.0f, 1.6777216e7f, kNaN, kInf, -kInf}) {
    Floats w(num_words, 7.0f);
    w[1] = bad;
    Floats out(n, 3.0f);
    CHECK_EQ(kvx::ternary_decode_sum(w.data(), num_words, 0.5, workers, n, out.data()),
             kvx::kBadWord);
    CHECK(all_zero(out));
  }
  Floats w(num_words, 7.0f);
  w[0] = limit - 1.0f;
  w[2] = -0.0f;  // the integer 0
  Floats out(n);
  CHECK_EQ(kvx::ternary_decode_sum(w.data(), num_words, 0.5, workers, n, out.data()), kvx::kOk);
  for (int j = 0; j < 7; ++j) CHECK_EQ(out[j], 2.0f);  // digit 8 = 4 + code sum 4
  // Word count, worker count, threshold: kBadParam, out zeroed.
  auto bad_param = [&](int64_t words_given, int64_t workers_given, double t) {
    Floats o(n, 3.0f);
    CHECK_EQ(kvx::ternary_decode_sum(w.data(), words_given, t, workers_given, n, o.data()),
             kvx::kBadParam);
    CHECK(all_zero(o));
  };
  bad_param(num_words - 1, workers, 0.5);
  bad_param(num_words + 1, workers, 0.5);
  bad_param(num_words, 0, 0.5);
  bad_param(num_words, kvx::kMaxWorkers + 1, 0.5);
  bad_param(num_words, workers, -1.0);
  bad_param(num_words, workers, 1e39);  // Inf in float32
  bad_param(num_words, workers, std::nan(""));
  CHECK_EQ(kvx::ternary_decode_sum(w.data(), num_words, 0.5, workers, -1, out.data()),
           kvx::kBadParam);
}

// ---- MXNet 2-bit ----------------------------------------------------------------------

void test_twobit() {
  g_test = "twobit";
  // t = 0.5.  Word 0: element 0 = +t (byte 0 bits 7-6: 0xC0), 1 = -t (bits 5-4: 0x20),
  // 2 = 0, 3 = +t (bits 1-0: 0x03) -> byte 0 = 0xE3; element 4 = -t -> byte 1 = 0x80;
  // element 15 = +t -> byte 3 = 0x03.  Word 1: element 16 = -t -> 0x80.
  Floats grad(17, 0.0f);
  grad[0] = 0.7f;
  grad[1] = -0.5f;
  grad[2] = 0.49f;
  grad[3] = 0.5f;
  grad[4] = -2.0f;
  grad[15] = 1.0f;
  grad[16] = -0.6f;
  Floats residual(17, 0.0f);
  std::vector<uint32_t> words(kvx::twobit_words(17));
  CHECK_EQ(kvx::twobit_encode(grad.data(), residual.data(), 17, 0.5, words.data()), kvx::kOk);
  CHECK_EQ(words[0], 0x030080E3u);
  CHECK_EQ(words[1], 0x00000080u);
  CHECK_EQ(residual[0], 0.7f - 0.5f);
  CHECK_EQ(residual[2], 0.49f);
  CHECK_EQ(residual[4], -1.5f);
  CHECK_EQ(residual[16], -0.6f + 0.5f);
  Floats out(17);
  CHECK_EQ(kvx::twobit_decode(words.data(), 17, 0.5, out.data()), kvx::kOk);
  Floats expected(17, 0.0f);
  expected[0] = expected[3] = expected[15] = 0.5f;
  expected[1] = expected[4] = expected[16] = -0.5f;
  CHECK(same_bits(out, expected));
  // A threshold beyond float32's range (0 * Inf would put NaN in the residual).
  {
    Floats r = residual;
    std::vector<uint32_t> w(kvx::twobit_words(17), 5u);
    CHECK_EQ(kvx::twobit_encode(grad.data(), r.data(), 17, 1e39, w.data()), kvx::kBadParam);
    CHECK(same_bits(r, residual));
    CHECK(w[0] == 0u && w[1] == 0u);
    Floats o(17, 1.0f);
    CHECK_EQ(kvx::twobit_decode(words.data(), 17, 1e39, o.data()), kvx::kBadParam);
    CHECK(all_zero(o));
  }
  // Bits 01 decode to 0, like MXNet.
  const uint32_t odd = 0x40u;
  Floats one(1);
  CHECK_EQ(kvx::twobit_decode(&odd, 1, 0.5, one.data()), kvx::kOk);
  CHECK_EQ(one[0], 0.0f);
  // Random round trip: decode(encode) == codes * t, residual == acc - codes * t.
  for (int64_t n : {1, 15, 16, 17, 1000}) {
    const Floats g = randn(n, n), r0 = randn(n, n + 1, 0.3f);
    const Floats acc = add(g, r0);
    Floats r = r0;
    std::vector<uint32_t> w(kvx::twobit_words(n));
    CHECK_EQ(kvx::twobit_encode(g.data(), r.data(), n, 0.8, w.data()), kvx::kOk);
    Floats o(n);
    CHECK_EQ(kvx::twobit_decode(w.data(), n, 0.8, o.data()), kvx::kOk);
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) {
      const int c = code_of(acc[i], 0.8f);
      ok = ok && bits_of(o[i]) == bits_of(static_cast<float>(c) * 0.8f) &&
           bits_of(r[i]) == bits_of(acc[i] - static_cast<float>(c) * 0.8f);
    }
    CHECK(ok);
  }
}

// ---- AdaComp ---------------------------------------------------------------------------

// Payload trimmed to what its header says (the encoder pads it to the capacity).
Floats adacomp_trim(const Floats& slot) {
  return Floats(slot.begin(), slot.begin() + kHeaderWords + static_cast<int64_t>(slot[7]));
}

void test_adacomp_hand() {
  g_test = "adacomp_hand";
  // Bin 0: G = [1.5, -2, 1], H = [2.5, -2, 1], max|G| = 2: elements 0 (+) and 1 (-).
  // Bin 1: G = [0, 0, -1], H = [0, 0, -2], max|G| = 1: element 5 (-).
  // scale = (2 + 1) / 2 bins.
  const Floats g = {1, 0, 0, 0, 0, -1}, r0 = {0.5f, -2, 1, 0, 0, 0};
  Floats r = r0, p(kvx::adacomp_payload_words(6, 4), 9.0f);
  CHECK_EQ(kvx::adacomp_encode(g.data(), r.data(), 6, 3, 4, p.data()), kvx::kOk);
  CHECK(same_bits(p, Floats({kvx::kMagic, kvx::kCodecAdacomp, kvx::kVersion, 6, 0, 1.5f, 3, 3,
                             0, 3, 11, 0})));
  CHECK(same_bits(r, Floats({0, -0.5f, 1, 0, 0, -1 + 1.5f})));
  Floats out(6, 7.0f);
  const Floats payload = adacomp_trim(p);
  CHECK_EQ(kvx::adacomp_decode(payload.data(), payload.size(), 6, out.data()), kvx::kOk);
  CHECK(same_bits(out, Floats({1.5f, -1.5f, 0, 0, 0, -1.5f})));
  Floats acc(6, 1.0f);
  CHECK_EQ(kvx::adacomp_decode_add(payload.data(), payload.size(), 6, acc.data()), kvx::kOk);
  CHECK(same_bits(acc, Floats({2.5f, -0.5f, 1, 1, 1, -0.5f})));
  // Capacity 2: |H| = 2.5, 2, 2 qualify; the tie goes to the lower index, element 5
  // stays in the residual.
  r = r0;
  Floats q(kvx::adacomp_payload_words(6, 2));
  CHECK_EQ(kvx::adacomp_encode(g.data(), r.data(), 6, 3, 2, q.data()), kvx::kOk);
  CHECK(same_bits(q, Floats({kvx::kMagic, kvx::kCodecAdacomp, kvx::kVersion, 6, 0, 1.5f, 2, 2,
                             0, 3})));
  CHECK(same_bits(r, Floats({0, -0.5f, 1, 0, 0, -1})));
  // grad and residual may alias: acc = 2 grad, H = 3 grad.
  Floats x = {1, -4, 2};
  Floats a(kvx::adacomp_payload_words(3, 3));
  CHECK_EQ(kvx::adacomp_encode(x.data(), x.data(), 3, 3, 3, a.data()), kvx::kOk);
  CHECK_EQ(a[6], 1.0f);     // |H| = 3, 12, 6 against max|G| = 8: element 1 only
  CHECK_EQ(a[8], 3.0f);     // code 2 * 1 + 1
  CHECK(same_bits(x, Floats({2, -8 + 8, 4})));
  // Zero gradient and residual: nothing qualifies (a bin of zeros sends nothing).
  Floats z(10, 0.0f), zr(10, 0.0f), zp(kvx::adacomp_payload_words(10, 5), 3.0f);
  CHECK_EQ(kvx::adacomp_encode(z.data(), zr.data(), 10, 4, 5, zp.data()), kvx::kOk);
  CHECK_EQ(zp[6], 0.0f);
  CHECK_EQ(zp[7], 0.0f);
  CHECK(all_zero(Floats(zp.begin() + kHeaderWords, zp.end())));
  // Bad parameters.
  CHECK_EQ(kvx::adacomp_encode(g.data(), r.data(), 6, 0, 2, q.data()), kvx::kBadParam);
  CHECK_EQ(kvx::adacomp_encode(g.data(), r.data(), 6, 3, 7, p.data()), kvx::kBadParam);
  CHECK_EQ(kvx::adacomp_encode(g.data(), r.data(), 6, 3, 0, q.data()), kvx::kBadParam);
}

// Random tensors: decode is +-scale at the sent indices, the residual is G - decoded
// there and G elsewhere, every sent element passed its bin's test.
void check_adacomp_roundtrip(int64_t n, int64_t bin, int64_t capacity, const Floats& g,
                             const Floats& r0) {
  Floats r = r0, p(kvx::adacomp_payload_words(n, capacity));
  CHECK_EQ(kvx::adacomp_encode(g.data(), r.data(), n, bin, capacity, p.data()), kvx::kOk);
  const Floats payload = adacomp_trim(p);
  const int64_t count = static_cast<int64_t>(p[6]);
  CHECK(count <= capacity);
  CHECK_EQ(static_cast<int64_t>(payload.size()), kvx::adacomp_payload_words(n, count));
  Floats out(n);
  CHECK_EQ(kvx::adacomp_decode(payload.data(), payload.size(), n, out.data()), kvx::kOk);
  bool ok = true;
  int64_t nonzero = 0;
  const int64_t bins = (n + bin - 1) / bin;
  std::vector<float> gmax(bins, 0.0f);
  for (int64_t j = 0; j < n; ++j)
    gmax[j / bin] = std::max(gmax[j / bin], std::fabs(g[j] + r0[j]));
  for (int64_t j = 0; j < n; ++j) {
    const float acc = g[j] + r0[j], h = acc + g[j];
    if (out[j] != 0.0f) {
      ++nonzero;
      ok = ok && std::fabs(out[j]) == p[5] && (out[j] < 0) == (h < 0) &&
           std::fabs(h) >= gmax[j / bin] && bits_of(r[j]) == bits_of(acc - out[j]);
    } else {
      ok = ok && bits_of(r[j]) == bits_of(acc);
    }
  }
  CHECK(ok);
  CHECK_EQ(nonzero, count);
}

void test_adacomp_roundtrips() {
  g_test = "adacomp_roundtrips";
  for (int64_t n : {int64_t{1}, int64_t{49}, int64_t{50}, int64_t{51}, int64_t{1000}, (int64_t{1} << 16) + 7}) {
    for (int64_t bin : {1, 50, 500}) {
      const Floats g = randn(n, n + bin), r0 = randn(n, n + bin + 1, 2.0f);
      check_adacomp_roundtrip(n, bin, n, g, r0);                       // no overflow
      check_adacomp_roundtrip(n, bin, std::max<int64_t>(1, n / 100), g, r0);
    }
  }
  // Above 2^23 elements an entry takes two words; above 2^24 the index does not fit one.
  CHECK_EQ(kvx::adacomp_entry_words(int64_t{1} << 23), 1);
  CHECK_EQ(kvx::adacomp_entry_words((int64_t{1} << 23) + 1), 2);
  const int64_t n = (int64_t{1} << 24) + 37;
  Floats g(n, 0.0f), r0(n, 0.0f);
  const int64_t spikes[] = {0, 12345, (int64_t{1} << 23) + 1, (int64_t{1} << 24) - 1,
                            int64_t{1} << 24, n - 1};
  for (int64_t j : spikes) g[j] = (j % 2) ? -3.0f : 3.0f;
  check_adacomp_roundtrip(n, 500, 100, g, r0);
  Floats r = r0, p(kvx::adacomp_payload_words(n, 100));
  CHECK_EQ(kvx::adacomp_encode(g.data(), r.data(), n, 500, 100, p.data()), kvx::kOk);
  CHECK_EQ(p[6], 6.0f);
  CHECK_EQ(p[7], 12.0f);
  // Last entry: index n - 1 = 2^24 + 36 (even, +): code 2^25 + 72 = 72 + 2 * 2^24.
  CHECK_EQ(p[kHeaderWords + 10], 72.0f);
  CHECK_EQ(p[kHeaderWords + 11], 2.0f);
}

// The encoder against the rule written out plainly: every element whose |H| reaches its
// bin's max|G| (a bin of zeros: none), over capacity the largest |H| with ties to the
// lower index, sent by ascending index; the scale the float64 mean of the bins' maxima;
// the residual G, less sign * scale where sent.  Payload and residual bit for bit.
void check_adacomp_exact(const Floats& g, const Floats& r0, int64_t bin, int64_t capacity) {
  const int64_t n = static_cast<int64_t>(g.size()), bins = (n + bin - 1) / bin;
  std::vector<float> gmax(bins, 0.0f);
  for (int64_t j = 0; j < n; ++j)
    gmax[j / bin] = std::max(gmax[j / bin], std::fabs(g[j] + r0[j]));
  double total = 0.0;
  for (float m : gmax) total += m;
  const float scale = static_cast<float>(total / static_cast<double>(bins));
  std::vector<int64_t> chosen;
  for (int64_t j = 0; j < n; ++j) {
    const float h = (g[j] + r0[j]) + g[j];
    if (gmax[j / bin] > 0.0f && std::fabs(h) >= gmax[j / bin]) chosen.push_back(j);
  }
  auto magnitude = [&](int64_t j) { return std::fabs((g[j] + r0[j]) + g[j]); };
  if (static_cast<int64_t>(chosen.size()) > capacity) {
    std::stable_sort(chosen.begin(), chosen.end(),
                     [&](int64_t a, int64_t b) { return magnitude(a) > magnitude(b); });
    chosen.resize(static_cast<size_t>(capacity));
    std::sort(chosen.begin(), chosen.end());
  }
  const int64_t width = kvx::adacomp_entry_words(n);
  Floats want_body, want_r(n);
  for (int64_t j = 0; j < n; ++j) want_r[j] = g[j] + r0[j];
  for (int64_t j : chosen) {
    const bool negative = (g[j] + r0[j]) + g[j] < 0.0f;
    const int64_t code = 2 * j + (negative ? 1 : 0);
    want_body.push_back(static_cast<float>(width == 1 ? code : code % (int64_t{1} << 24)));
    if (width == 2) want_body.push_back(static_cast<float>(code / (int64_t{1} << 24)));
    want_r[j] -= negative ? -scale : scale;
  }
  Floats r = r0, p(kvx::adacomp_payload_words(n, capacity), 3.0f);
  CHECK_EQ(kvx::adacomp_encode(g.data(), r.data(), n, bin, capacity, p.data()), kvx::kOk);
  CHECK(bits_of(p[5]) == bits_of(scale));
  CHECK_EQ(p[6], static_cast<float>(chosen.size()));
  const Floats body(p.begin() + kHeaderWords, p.begin() + kHeaderWords + want_body.size());
  CHECK(same_bits(body, want_body));
  CHECK(same_bits(r, want_r));
}

void test_adacomp_exact() {
  g_test = "adacomp_exact";
  const int64_t n = 100003;
  const Floats g = randn(n, 51), r0 = randn(n, 52, 3.0f);
  for (int64_t bin : {int64_t{1}, int64_t{7}, int64_t{50}, int64_t{500}, n}) {
    const int64_t bins = (n + bin - 1) / bin;
    for (int64_t capacity : {int64_t{1}, std::max<int64_t>(1, bins / 3), 3 * bins, n})
      check_adacomp_exact(g, r0, bin, std::min(capacity, n));
  }
  // Small integers: |H| ties across the capacity's cut, and whole bins of zeros.
  Floats ties(n), zeros(n, 0.0f);
  for (int64_t i = 0; i < n; ++i) ties[i] = (i / 500) % 3 == 0 ? 0.0f : static_cast<float>((i * 7919) % 9) - 4.0f;
  for (int64_t capacity : {int64_t{10}, int64_t{500}, int64_t{5000}, n})
    check_adacomp_exact(ties, zeros, 50, capacity);
}

void test_adacomp_nonfinite() {
  g_test = "adacomp_nonfinite";
  for (float bad : {kNaN, kInf, -kInf, 3e38f}) {
    Floats g = randn(100, 5), r0 = randn(100, 6);
    g[57] = bad;  // 3e38: G is finite, H = G + grad overflows
    Floats r = r0, p(kvx::adacomp_payload_words(100, 10), 4.0f);
    CHECK_EQ(kvx::adacomp_encode(g.data(), r.data(), 100, 50, 10, p.data()), kvx::kNonFinite);
    CHECK(same_bits(r, r0));
    CHECK(all_zero(p));
  }
}

// Decodes p with both decoders of the codec `id` (its codec-table row): they return the
// same status; a failing decode zeroes its output, a failing decode_add leaves acc alone.
int decode_both(float id, const Floats& p, int64_t n) {
  const kvx::CodecSpec* spec = kvx::find_codec(id);
  Floats out(n, 7.0f);
  const int status = spec->decode(p.data(), p.size(), n, out.data());
  if (status != kvx::kOk) CHECK(all_zero(out));
  Floats acc(n, 1.0f);
  CHECK_EQ(spec->decode_add(p.data(), p.size(), n, acc.data()), status);
  if (status != kvx::kOk) CHECK(same_bits(acc, Floats(n, 1.0f)));
  return status;
}

Floats with_word(Floats p, size_t at, float v) {
  p[at] = v;
  return p;
}

// The servers' dispatch of a good and a bad payload, each in a slot of slot_words: the
// bad worker's status is reported and the sum is all NaN (the round failed for every
// worker); the good slot alone sums to what the codec decodes.
void check_dispatch(float id, const Floats& good, const Floats& bad, size_t slot_words,
                    int64_t n, int bad_status) {
  Floats slots(2 * slot_words, 5.0f);
  std::copy(good.begin(), good.end(), slots.begin());
  std::copy(bad.begin(), bad.end(), slots.begin() + slot_words);
  Floats sum(n), status(2);
  CHECK_EQ(kvx::decode_slots(slots.data(), 2, slot_words, sum.data(), n, status.data()),
           bad_status);
  CHECK_EQ(status[0], 0.0f);
  CHECK_EQ(status[1], static_cast<float>(bad_status));
  CHECK(std::all_of(sum.begin(), sum.end(), [](float x) { return std::isnan(x); }));
  Floats one(n);
  CHECK_EQ(kvx::find_codec(id)->decode(good.data(), good.size(), n, one.data()), kvx::kOk);
  CHECK_EQ(kvx::decode_slots(slots.data(), 1, slot_words, sum.data(), n, status.data()),
           kvx::kOk);
  CHECK(same_bits(sum, one));
}

void test_adacomp_malformed() {
  g_test = "adacomp_malformed";
  const int64_t n = 40;
  Floats g = randn(n, 8), r(n, 0.0f), slot(kvx::adacomp_payload_words(n, n));
  CHECK_EQ(kvx::adacomp_encode(g.data(), r.data(), n, 10, n, slot.data()), kvx::kOk);
  const Floats good = adacomp_trim(slot);
  CHECK(good.size() >= kHeaderWords + 3);
  auto decode = [&](const Floats& p) { return decode_both(kvx::kCodecAdacomp, p, n); };
  auto with = [&](size_t at, float v) { return with_word(good, at, v); };
  CHECK_EQ(decode(good), kvx::kOk);
  CHECK_EQ(decode(with(0, 1.0f)), kvx::kBadMagic);
  CHECK_EQ(decode(with(1, kvx::kCodecTopk)), kvx::kBadCodec);
  CHECK_EQ(decode(with(3, n + 1.0f)), kvx::kBadSize);
  CHECK_EQ(decode(slot), kvx::kBadSize);          // untrimmed: body length disagrees
  // Scale NaN / Inf / negative; count non-integral, beyond n or not the body's.
  CHECK_EQ(decode(with(5, kNaN)), kvx::kBadParam);
  CHECK_EQ(decode(with(5, kInf)), kvx::kBadParam);
  CHECK_EQ(decode(with(5, -1.0f)), kvx::kBadParam);
  CHECK_EQ(decode(with(6, 1.5f)), kvx::kBadParam);
  CHECK_EQ(decode(with(6, good[6] + 1)), kvx::kBadParam);
  CHECK_EQ(decode(with(6, kNaN)), kvx::kBadParam);
  // Entries: not an integer, negative, >= 2^24, index >= n, repeated, descending.
  CHECK_EQ(decode(with(8, 0.5f)), kvx::kBadWord);
  CHECK_EQ(decode(with(8, -2.0f)), kvx::kBadWord);
  CHECK_EQ(decode(with(8, kNaN)), kvx::kBadWord);
  CHECK_EQ(decode(with(8, 16777216.0f)), kvx::kBadWord);
  CHECK_EQ(decode(with(8 + 1, 2.0f * n)), kvx::kBadIndex);
  CHECK_EQ(decode(with(8 + 1, good[8])), kvx::kBadIndex);
  CHECK_EQ(decode(with(8 + 1, good[8] + 1 - static_cast<float>(static_cast<int>(good[8]) % 2))),
           kvx::kBadIndex);  // same index, other sign
  Floats swapped = good;
  std::swap(swapped[8], swapped[9]);
  CHECK_EQ(decode(swapped), kvx::kBadIndex);
  // The servers' dispatch (payload + padding in a slot).
  check_dispatch(kvx::kCodecAdacomp, good, with(8 + 1, 2.0f * n), slot.size(), n,
                 kvx::kBadIndex);
}

// ---- element top-k ---------------------------------------------------------------------

void test_element_topk_hand() {
  g_test = "element_topk_hand";
  // |acc| = 1, 3, 3, 0, 2, 2 with k = 3: 3, 3 and the first 2 (ties to the lower index).
  const Floats g = {1, -3, 3, 0, 2, -2};
  Floats r(6, 0.0f), p(kvx::element_topk_payload_words(6, 3), 9.0f);
  CHECK_EQ(kvx::element_topk_encode(g.data(), r.data(), 6, 3, p.data()), kvx::kOk);
  CHECK(same_bits(p, Floats({kvx::kMagic, kvx::kCodecElementTopk, kvx::kVersion, 6, 0, 3, 0, 6,
                             1, -3, 2, 3, 4, 2})));
  CHECK(same_bits(r, Floats({1, 0, 0, 0, 0, -2})));
  Floats out(6, 7.0f);
  CHECK_EQ(kvx::element_topk_decode(p.data(), p.size(), 6, out.data()), kvx::kOk);
  CHECK(same_bits(out, Floats({0, -3, 3, 0, 2, 0})));
  Floats acc(6, 1.0f);
  CHECK_EQ(kvx::element_topk_decode_add(p.data(), p.size(), 6, acc.data()), kvx::kOk);
  CHECK(same_bits(acc, Floats({1, -2, 4, 1, 3, 1})));
  // grad and residual may alias: acc = 2 grad.
  Floats x = {1, -4, 2};
  Floats a(kvx::element_topk_payload_words(3, 1));
  CHECK_EQ(kvx::element_topk_encode(x.data(), x.data(), 3, 1, a.data()), kvx::kOk);
  CHECK(same_bits(Floats(a.begin() + kHeaderWords, a.end()), Floats({1, -8})));
  CHECK(same_bits(x, Floats({2, 0, 4})));
  // Bad parameters.
  CHECK_EQ(kvx::element_topk_encode(g.data(), r.data(), 6, 0, p.data()), kvx::kBadParam);
  CHECK_EQ(kvx::element_topk_encode(g.data(), r.data(), 6, 7, p.data()), kvx::kBadParam);
}

// Random tensors: k entries by ascending index, decoded + new residual == acc, and no
// element left behind is larger than one sent.
void check_element_topk_roundtrip(int64_t n, int64_t k, const Floats& g, const Floats& r0) {
  Floats r = r0, p(kvx::element_topk_payload_words(n, k));
  CHECK_EQ(kvx::element_topk_encode(g.data(), r.data(), n, k, p.data()), kvx::kOk);
  CHECK_EQ(p[5], static_cast<float>(k));
  Floats out(n);
  CHECK_EQ(kvx::element_topk_decode(p.data(), p.size(), n, out.data()), kvx::kOk);
  bool ok = true;
  float smallest_sent = kInf, largest_kept = 0.0f;
  int64_t sent = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float acc = g[j] + r0[j];
    ok = ok && bits_of(out[j] + r[j]) == bits_of(acc + 0.0f);
    if (r[j] == 0.0f && out[j] == acc && acc != 0.0f) {
      ++sent;
      smallest_sent = std::min(smallest_sent, std::fabs(acc));
    } else {
      largest_kept = std::max(largest_kept, std::fabs(acc));
    }
  }
  CHECK(ok);
  CHECK(sent <= k);
  CHECK(largest_kept <= smallest_sent);
}

void test_element_topk_roundtrips() {
  g_test = "element_topk_roundtrips";
  for (int64_t n : {int64_t{1}, int64_t{49}, int64_t{1000}, (int64_t{1} << 16) + 7}) {
    const Floats g = randn(n, n + 3), r0 = randn(n, n + 4, 2.0f);
    for (int64_t k : {int64_t{1}, std::max<int64_t>(1, n / 100), n}) check_element_topk_roundtrip(n, k, g, r0);
  }
  // From 2^24 elements on, an index takes two words.
  CHECK_EQ(kvx::element_topk_index_words(int64_t{1} << 24), 1);
  CHECK_EQ(kvx::element_topk_index_words((int64_t{1} << 24) + 1), 2);
  const int64_t n = (int64_t{1} << 24) + 37;
  Floats g(n, 0.0f), r0(n, 0.0f);
  const int64_t spikes[] = {0, 12345, (int64_t{1} << 23) + 1, (int64_t{1} << 24) - 1,
                            int64_t{1} << 24, n - 1};
  for (int64_t j : spikes) g[j] = (j % 2) ? -3.0f : 3.0f;
  check_element_topk_roundtrip(n, 6, g, r0);
  Floats r = r0, p(kvx::element_topk_payload_words(n, 6));
  CHECK_EQ(kvx::element_topk_encode(g.data(), r.data(), n, 6, p.data()), kvx::kOk);
  CHECK_EQ(p[7], 18.0f);
  // The last two entries: indices 2^24 and n - 1 = 2^24 + 36 (both even, +3), each as
  // words (index mod 2^24, index div 2^24), then the value.
  CHECK(same_bits(Floats(p.end() - 6, p.end()), Floats({0, 1, 3, 36, 1, 3})));
}

// The encoder against a full sort: the k largest |acc| (ties to the lower index) sent
// by ascending index, everything else in the residual, bit for bit; on tensors whose
// k-th magnitude is shared by many elements, is zero, or sits in a crowded bucket of the
// encoder's radix select.
void check_element_topk_exact(const Floats& g, const Floats& r0, int64_t k) {
  const int64_t n = static_cast<int64_t>(g.size());
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  auto magnitude = [&](int64_t i) { return std::fabs(g[i] + r0[i]); };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return magnitude(a) > magnitude(b); });
  std::vector<int64_t> sent(order.begin(), order.begin() + k);
  std::sort(sent.begin(), sent.end());
  Floats want_p(kvx::element_topk_payload_words(n, k), 0.0f), want_r(n);
  for (int64_t i = 0; i < n; ++i) want_r[i] = g[i] + r0[i];
  float* entry = want_p.data() + kHeaderWords;
  for (int64_t i : sent) {
    entry[0] = static_cast<float>(i);
    entry[1] = g[i] + r0[i];
    entry += 2;
    want_r[i] = 0.0f;
  }
  Floats r = r0, p(want_p.size(), 7.0f);
  CHECK_EQ(kvx::element_topk_encode(g.data(), r.data(), n, k, p.data()), kvx::kOk);
  CHECK(same_bits(Floats(p.begin() + kHeaderWords, p.end()),
                  Floats(want_p.begin() + kHeaderWords, want_p.end())));
  CHECK(same_bits(r, want_r));
}

void test_element_topk_exact() {
  g_test = "element_topk_exact";
  const int64_t n = 100003;
  const Floats g = randn(n, 21), r0 = randn(n, 22, 0.5f);
  for (int64_t k : {int64_t{1}, int64_t{100}, n / 2, n - 1, n}) check_element_topk_exact(g, r0, k);
  // Many ties: small integers, so that the k-th magnitude is shared across the cut.
  Floats ties(5000), none(5000, 0.0f);
  for (int64_t i = 0; i < 5000; ++i) ties[i] = static_cast<float>((i * 7919) % 5) - 2.0f;
  for (int64_t k : {int64_t{1}, int64_t{999}, int64_t{1000}, int64_t{1001}, int64_t{2500}, int64_t{4999}})
    check_element_topk_exact(ties, none, k);
  // Mostly zeros (and -0): the k-th magnitude is 0 and the ties are the first zeros.
  Floats sparse(10000, 0.0f);
  for (int64_t i = 0; i < 10000; i += 3) sparse[i] = -0.0f;
  for (int64_t i = 0; i < 10; ++i) sparse[i * 997] = (i % 2 ? -1.0f : 1.0f) * (i + 1);
  for (int64_t k : {int64_t{5}, int64_t{10}, int64_t{11}, int64_t{50}})
    check_element_topk_exact(sparse, Floats(10000, 0.0f), k);
  // One crowded bucket: magnitudes that differ only in their low mantissa bits, one
  // apart, and denormals below them.
  Floats close(20000);
  for (int64_t i = 0; i < 20000; ++i) {
    const uint32_t bits = 0x3f800000u + static_cast<uint32_t>((i * 104729) % 4096);
    std::memcpy(&close[i], &bits, sizeof bits);
    if (i % 2) close[i] = -close[i];
    if (i % 7 == 0) close[i] = 1e-40f * static_cast<float>(i % 5);
  }
  for (int64_t k : {int64_t{1}, int64_t{17}, int64_t{4096}, int64_t{15000}})
    check_element_topk_exact(close, Floats(20000, 0.0f), k);
}

// From 65,536 elements the candidates come from a sampled floor (path 1), below it from
// the radix select (path 2); both exact against a full sort, on a random tensor, on one
// whose k-th magnitude is shared by thousands, and on one that is mostly zeros (the
// sample's floor is 0: every element is a candidate).
void test_element_topk_paths() {
  g_test = "element_topk_paths";
  const int64_t n = 200003;
  const Floats g = randn(n, 41), r0 = randn(n, 42, 0.5f);
  for (int64_t k : {int64_t{1}, int64_t{2000}, int64_t{4001}, int64_t{20000}}) {
    check_element_topk_exact(g, r0, k);
    CHECK_EQ(kvx::element_topk_last_path(), 1);
  }
  check_element_topk_exact(g, r0, n / 2);  // too many for a sample's floor
  CHECK_EQ(kvx::element_topk_last_path(), 2);
  const Floats small = randn(20000, 43);
  check_element_topk_exact(small, Floats(20000, 0.0f), 200);
  CHECK_EQ(kvx::element_topk_last_path(), 2);
  Floats ties(100000), none(100000, 0.0f);
  for (int64_t i = 0; i < 100000; ++i) ties[i] = static_cast<float>((i * 7919) % 50) - 25.0f;
  for (int64_t k : {int64_t{1000}, int64_t{1999}, int64_t{2000}, int64_t{2001}}) {
    check_element_topk_exact(ties, none, k);
    CHECK_EQ(kvx::element_topk_last_path(), 1);
  }
  Floats sparse(100000, 0.0f);
  for (int64_t i = 0; i < 40; ++i) sparse[i * 2477] = (i % 2 ? -1.0f : 1.0f) * (i + 1);
  for (int64_t k : {int64_t{39}, int64_t{40}, int64_t{41}, int64_t{500}}) {
    check_element_topk_exact(sparse, none, k);
    CHECK_EQ(kvx::element_topk_last_path(), 1);
  }
}

// DGC's momentum correction (codecs/momentum.h): the products rounded before the sums,
// NaN totals keep the previous sum, and only the rows named in [0, rows) are zeroed.
void test_momentum_correction() {
  g_test = "momentum_correction";
  const Floats v = randn(1001, 31), g = randn(1001, 32);
  Floats u(1001);
  kvx::momentum_velocity(v.data(), g.data(), 1001, 0.9f, u.data());
  bool ok = true;
  for (int64_t i = 0; i < 1001; ++i) {
    volatile float carried = v[i] * 0.9f;  // rounded to float32 before the sum
    ok = ok && bits_of(u[i]) == bits_of(carried + g[i]);
  }
  CHECK(ok);
  Floats x = {1, 2, 3, 4, 5, 6, 7, 8};
  const int64_t sent[] = {3, -1, 4, 1, 1};
  kvx::zero_rows(sent, 5, 4, 2, x.data());
  CHECK(same_bits(x, Floats({1, 2, 0, 0, 5, 6, 0, 0})));
  Floats total = {1, kNaN, -2, kInf}, delivered = {5, 6, 7, 8}, out(4);
  kvx::momentum_deliver(total.data(), delivered.data(), 4, 0.5f, out.data());
  CHECK(same_bits(delivered, Floats({1, 6, -2, kInf})));
  CHECK(bits_of(out[0]) == bits_of(-1.5f) && std::isnan(out[1]) && out[2] == -5.5f &&
        out[3] == kInf);
  // out written over total (the step's sum goes straight into the store's output)
  Floats total2 = {1, kNaN, -2, kInf}, delivered2 = {5, 6, 7, 8};
  kvx::momentum_deliver(total2.data(), delivered2.data(), 4, 0.5f, total2.data());
  CHECK(same_bits(delivered2, delivered) && same_bits(total2, out));
}

void test_element_topk_nonfinite() {
  g_test = "element_topk_nonfinite";
  // 100 elements: the radix select's candidates; 100,000: the sampled floor's, with the
  // bad element where the sample may or may not fall.
  for (int64_t n : {int64_t{100}, int64_t{100000}}) {
    for (float bad : {kNaN, kInf, -kInf, 3e38f}) {
      for (int64_t at : {int64_t{57}, n - 1}) {
        Floats g = randn(n, 5), r0 = randn(n, 6);
        g[at] = bad;
        if (bad == 3e38f) r0[at] = 3e38f;  // both finite, acc overflows
        Floats r = r0, p(kvx::element_topk_payload_words(n, 10), 4.0f);
        CHECK_EQ(kvx::element_topk_encode(g.data(), r.data(), n, 10, p.data()),
                 kvx::kNonFinite);
        CHECK(same_bits(r, r0));
        CHECK(all_zero(p));
      }
    }
  }
}

void test_element_topk_malformed() {
  g_test = "element_topk_malformed";
  const int64_t n = 40;
  Floats g = randn(n, 8), r(n, 0.0f), good(kvx::element_topk_payload_words(n, 4));
  CHECK_EQ(kvx::element_topk_encode(g.data(), r.data(), n, 4, good.data()), kvx::kOk);
  auto decode = [&](const Floats& p) {
    return decode_both(kvx::kCodecElementTopk, p, n);
  };
  auto with = [&](size_t at, float v) { return with_word(good, at, v); };
  CHECK_EQ(decode(good), kvx::kOk);
  CHECK_EQ(decode(with(0, 1.0f)), kvx::kBadMagic);
  CHECK_EQ(decode(with(1, kvx::kCodecAdacomp)), kvx::kBadCodec);
  CHECK_EQ(decode(with(3, n + 1.0f)), kvx::kBadSize);
  CHECK_EQ(decode(with(7, 6.0f)), kvx::kBadSize);
  // k zero, non-integral, NaN, not the body's; b not 0.
  CHECK_EQ(decode(with(5, 0.0f)), kvx::kBadParam);
  CHECK_EQ(decode(with(5, 3.5f)), kvx::kBadParam);
  CHECK_EQ(decode(with(5, kNaN)), kvx::kBadParam);
  CHECK_EQ(decode(with(5, 3.0f)), kvx::kBadParam);
  CHECK_EQ(decode(with(6, 1.0f)), kvx::kBadParam);
  // Index words: not an integer, negative, >= 2^24; values not finite.
  CHECK_EQ(decode(with(8, 0.5f)), kvx::kBadWord);
  CHECK_EQ(decode(with(8, -2.0f)), kvx::kBadWord);
  CHECK_EQ(decode(with(8, 16777216.0f)), kvx::kBadWord);
  CHECK_EQ(decode(with(9, kNaN)), kvx::kBadWord);
  CHECK_EQ(decode(with(11, kInf)), kvx::kBadWord);
  // Indices: beyond n, repeated, descending.
  CHECK_EQ(decode(with(10, 40.0f)), kvx::kBadIndex);
  CHECK_EQ(decode(with(10, good[8])), kvx::kBadIndex);
  Floats swapped = good;
  std::swap(swapped[8], swapped[10]);
  CHECK_EQ(decode(swapped), kvx::kBadIndex);
  // The servers' dispatch.
  check_dispatch(kvx::kCodecElementTopk, good, with(10, 40.0f), good.size(), n,
                 kvx::kBadIndex);
}

}  // namespace

// ---- outer products (dAD) -----------------------------------------------------------

void test_outer() {
  g_test = "outer";
  // 2 rows (capacity 3) of u (2 x 2) and v (2 x 3): U^T V by hand
  const Floats u = {1.0f, 2.0f, -1.0f, 0.5f};
  const Floats v = {1.0f, 0.0f, 2.0f, 4.0f, -2.0f, 1.0f};
  Floats payload(kvx::outer_payload_words(6, 3, 2));
  CHECK_EQ(payload.size(), 8u + 3u * 5u);
  CHECK_EQ(kvx::outer_encode(u.data(), v.data(), 2, 3, 2, 3, payload.data()), kvx::kOk);
  CHECK_EQ(payload[1], kvx::kCodecOuter);
  CHECK_EQ(payload[5], 3.0f);
  CHECK_EQ(payload[6], 2.0f);
  Floats out(6, 9.0f);
  CHECK_EQ(kvx::outer_decode(payload.data(), payload.size(), 6, out.data()), kvx::kOk);
  const Floats want = {1.0f - 4.0f, 0.0f + 2.0f, 2.0f - 1.0f,        // row 0: u00 v0 + u10 v1
                       2.0f + 2.0f, 0.0f - 1.0f, 4.0f + 0.5f};       // row 1
  CHECK(same_bits(out, want));
  Floats acc(6, 1.0f);
  CHECK_EQ(kvx::outer_decode_add(payload.data(), payload.size(), 6, acc.data()), kvx::kOk);
  for (int i = 0; i < 6; ++i) CHECK_EQ(acc[i], 1.0f + want[i]);
  // 4-row blocks and a remainder row, tiles of columns: against a plain loop
  const int64_t rows = 5, out_n = 7, in_n = 1300, cap = 6;
  const Floats bu = randn(rows * out_n, 3), bv = randn(rows * in_n, 4);
  Floats big(kvx::outer_payload_words(out_n * in_n, cap, out_n));
  CHECK_EQ(kvx::outer_encode(bu.data(), bv.data(), rows, cap, out_n, in_n, big.data()), kvx::kOk);
  Floats got(out_n * in_n);
  CHECK_EQ(kvx::outer_decode(big.data(), big.size(), out_n * in_n, got.data()), kvx::kOk);
  Floats plain(out_n * in_n, 0.0f);
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t o = 0; o < out_n; ++o)
      for (int64_t i = 0; i < in_n; ++i) plain[o * in_n + i] += bu[j * out_n + o] * bv[j * in_n + i];
  CHECK(same_bits(got, plain));
  // non-finite input, malformed payloads: statuses, zeros, acc untouched
  Floats bad_v = v;
  bad_v[4] = kNaN;
  CHECK_EQ(kvx::outer_encode(u.data(), bad_v.data(), 2, 3, 2, 3, payload.data()), kvx::kNonFinite);
  CHECK(all_zero(payload));
  CHECK_EQ(kvx::outer_encode(u.data(), v.data(), 4, 3, 2, 3, payload.data()), kvx::kBadParam);
  CHECK_EQ(kvx::outer_encode(u.data(), v.data(), 2, 3, 2, 3, payload.data()), kvx::kOk);
  const Floats before = acc;
  Floats broken = payload;
  broken[6] = 4.0f;                                  // 4 does not divide n = 6
  CHECK_EQ(kvx::outer_decode_add(broken.data(), broken.size(), 6, acc.data()), kvx::kBadParam);
  broken = payload;
  broken[10] = kInf;
  CHECK_EQ(kvx::outer_decode_add(broken.data(), broken.size(), 6, acc.data()), kvx::kBadWord);
  CHECK_EQ(kvx::outer_decode_add(payload.data(), payload.size() - 1, 6, acc.data()), kvx::kBadSize);
  CHECK(same_bits(acc, before));
  CHECK_EQ(kvx::outer_decode(broken.data(), broken.size(), 6, out.data()), kvx::kBadWord);
  CHECK(all_zero(out));
}

void test_fp16() {
  g_test = "fp16";
  // every finite half: widened exactly and rounded back to itself (both signs); the
  // midpoint between neighbours goes to the even one, the floats beside it to the nearer
  int mismatches = 0;
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const uint16_t half = static_cast<uint16_t>(h | sign);
      if (kvx::float_to_half(kvx::half_to_float(half)) != half) ++mismatches;
    }
    if (h + 1 == 0x7c00u) continue;
    const double lo = kvx::half_to_float(static_cast<uint16_t>(h));
    const double hi = kvx::half_to_float(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);   // exact in float32
    const uint16_t even = static_cast<uint16_t>((h & 1u) ? h + 1 : h);
    if (kvx::float_to_half(mid) != even) ++mismatches;
    if (kvx::float_to_half(std::nextafter(mid, 0.0f)) != h) ++mismatches;
    if (kvx::float_to_half(std::nextafter(mid, kInf)) != h + 1) ++mismatches;
  }
  CHECK_EQ(mismatches, 0);
  CHECK_EQ(kvx::half_to_float(0x7c00u), kInf);
  CHECK(std::isnan(kvx::half_to_float(0x7e00u)));
  CHECK_EQ(bits_of(kvx::half_to_float(0x8000u)), 0x80000000u);
  CHECK_EQ(kvx::half_to_float(0x0001u), 5.9604644775390625e-8f);       // 2**-24
  CHECK_EQ(kvx::float_to_half(2.9802322387695312e-8f), 0u);           // 2**-25: tie to 0
  // encode: clipped at the limit, residual = acc - half, both exact
  const Floats grad = {1e5f, -7e4f, 1.0f / 3.0f, 3e-9f, -0.0f};
  Floats residual = {0.0f, 0.0f, 1e-4f, 0.0f, -0.0f};  // -0 + -0 = -0
  std::vector<uint16_t> half(grad.size());
  CHECK_EQ(kvx::fp16_encode(grad.data(), residual.data(), 5, 32752.0f, half.data()), kvx::kOk);
  CHECK_EQ(kvx::half_to_float(half[0]), 32752.0f);
  CHECK_EQ(kvx::half_to_float(half[1]), -32752.0f);
  CHECK_EQ(residual[0], 1e5f - 32752.0f);
  CHECK_EQ(residual[1], -7e4f + 32752.0f);
  const float acc2 = 1.0f / 3.0f + 1e-4f;
  CHECK_EQ(residual[2], acc2 - kvx::half_to_float(half[2]));
  CHECK(std::fabs(residual[2]) <= std::fabs(acc2) / 2048);
  CHECK_EQ(half[3], 0u);
  CHECK_EQ(residual[3], 3e-9f);
  CHECK_EQ(half[4], 0x8000u);
  // a NaN or Inf anywhere in acc, or an acc that overflows: every half NaN, the
  // residual untouched; without a residual, the gradient alone decides
  for (float bad : {kNaN, kInf, -kInf, 3e38f}) {
    Floats g = randn(100, 7), r = randn(100, 8);
    g[42] = bad;
    if (bad == 3e38f) r[42] = 3e38f;
    const Floats before = r;
    half.assign(100, 0);
    CHECK_EQ(kvx::fp16_encode(g.data(), r.data(), 100, 65504.0f, half.data()), kvx::kNonFinite);
    CHECK(same_bits(r, before));
    bool all_nan = true;
    for (uint16_t x : half) all_nan = all_nan && std::isnan(kvx::half_to_float(x));
    CHECK(all_nan);
    CHECK_EQ(kvx::fp16_encode(g.data(), nullptr, 100, 65504.0f, half.data()),
             bad == 3e38f ? kvx::kOk : kvx::kNonFinite);
  }
  // without a residual the encoder has a loop of its own (the CPU's conversion where it
  // has one): every half, every midpoint and its neighbours, both signs, clipped, as
  // float_to_half; a NaN or Inf in the vector body or the tail voids the call
  Floats values;
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const float x = kvx::half_to_float(static_cast<uint16_t>(h));
    const float mid = h + 1 < 0x7c00u
        ? static_cast<float>((static_cast<double>(x) +
                              kvx::half_to_float(static_cast<uint16_t>(h + 1))) / 2)
        : 7e4f;
    for (float v : {x, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf)})
      for (float s : {1.0f, -1.0f}) values.push_back(s * v);
  }
  for (float v : {1e-40f, -1e-40f, 3e38f, -3e38f, 65520.0f, -0.0f}) values.push_back(v);
  for (float limit : {65504.0f, 1024.0f}) {
    half.assign(values.size(), 0);
    CHECK_EQ(kvx::fp16_encode(values.data(), nullptr, static_cast<int64_t>(values.size()),
                              limit, half.data()), kvx::kOk);
    mismatches = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const float clipped = std::fmax(-limit, std::fmin(limit, values[i]));
      if (half[i] != kvx::float_to_half(values[i] == 0.0f ? values[i] : clipped)) ++mismatches;
    }
    CHECK_EQ(mismatches, 0);
  }
  for (size_t at : {size_t{0}, size_t{13}, values.size() - 1}) {
    for (float bad : {kNaN, -kInf}) {
      Floats g = values;
      g[at] = bad;
      CHECK_EQ(kvx::fp16_encode(g.data(), nullptr, static_cast<int64_t>(g.size()), 65504.0f,
                                half.data()), kvx::kNonFinite);
      CHECK(std::isnan(kvx::half_to_float(half[at])) &&
            std::isnan(kvx::half_to_float(half[1])));
    }
  }
}

// ---- PowerSGD's orthonormalisation --------------------------------------------------

// max |Q^T Q - I| of q (rows x rank, row-major).
double orthonormality_error(const Floats& q, int64_t rows, int64_t rank) {
  double worst = 0.0;
  for (int64_t a = 0; a < rank; ++a)
    for (int64_t b = 0; b < rank; ++b) {
      double s = 0.0;
      for (int64_t i = 0; i < rows; ++i) s += double(q[i * rank + a]) * q[i * rank + b];
      worst = std::max(worst, std::fabs(s - (a == b ? 1.0 : 0.0)));
    }
  return worst;
}

// max |a - Q Q^T a|: a's columns lie in the span of q's.
double span_error(const Floats& a, const Floats& q, int64_t rows, int64_t rank) {
  double worst = 0.0;
  for (int64_t c = 0; c < rank; ++c) {
    std::vector<double> coef(static_cast<size_t>(rank), 0.0);
    for (int64_t k = 0; k < rank; ++k)
      for (int64_t i = 0; i < rows; ++i) coef[k] += double(q[i * rank + k]) * a[i * rank + c];
    for (int64_t i = 0; i < rows; ++i) {
      double v = a[i * rank + c];
      for (int64_t k = 0; k < rank; ++k) v -= coef[k] * q[i * rank + k];
      worst = std::max(worst, std::fabs(v));
    }
  }
  return worst;
}

Floats identity_columns(int64_t rows, int64_t rank) {
  Floats q(static_cast<size_t>(rows * rank), 0.0f);
  for (int64_t j = 0; j < rank; ++j) q[j * rank + j] = 1.0f;
  return q;
}

void test_powersgd_q() {
  g_test = "powersgd_q";
  // by hand: one column (3, 4): beta = -5, tau = 1.6, v = (1, 0.5), Q = -a / 5; the
  // sign follows alpha's: (-3, 4) gives a / 5; a zero column gives e1
  Floats q(2);
  kvx::householder_q(Floats{3.0f, 4.0f}.data(), 2, 1, q.data());
  CHECK(std::fabs(q[0] + 0.6f) < 1e-7f && std::fabs(q[1] + 0.8f) < 1e-7f);
  kvx::householder_q(Floats{-3.0f, 4.0f}.data(), 2, 1, q.data());
  CHECK(std::fabs(q[0] + 0.6f) < 1e-7f && std::fabs(q[1] - 0.8f) < 1e-7f);
  kvx::householder_q(Floats{0.0f, 0.0f}.data(), 2, 1, q.data());
  CHECK(q[0] == 1.0f && q[1] == 0.0f);
  // random tall matrices: orthonormal columns spanning a's; the same bits every run and
  // in place
  for (auto [rows, rank] : {std::pair<int64_t, int64_t>{1, 1}, {5, 5}, {50, 4}, {3136, 8}}) {
    const Floats a = randn(static_cast<size_t>(rows * rank), 11, 3.0f);
    Floats out(a.size()), again(a.size()), in_place = a;
    kvx::householder_q(a.data(), rows, rank, out.data());
    kvx::householder_q(a.data(), rows, rank, again.data());
    kvx::householder_q(in_place.data(), rows, rank, in_place.data());
    CHECK(orthonormality_error(out, rows, rank) < 1e-6);
    CHECK(span_error(a, out, rows, rank) < 1e-4 * std::sqrt(double(rows)));
    CHECK(same_bits(out, again));
    CHECK(same_bits(out, in_place));
  }
  // zero, and rank-deficient (a column twice another, a zero column, rows of zeros):
  // still orthonormal, and spanning the nonzero columns
  Floats zero_q(18);
  kvx::householder_q(Floats(18, 0.0f).data(), 6, 3, zero_q.data());
  CHECK(zero_q == identity_columns(6, 3));   // == on floats: -0 equals 0
  Floats deficient = randn(40 * 4, 12);
  for (int64_t i = 0; i < 40; ++i) {
    deficient[i * 4 + 1] = 2.0f * deficient[i * 4];
    deficient[i * 4 + 2] = 0.0f;
    if (i < 20) deficient[i * 4 + 3] = 0.0f;
  }
  Floats deficient_q(deficient.size());
  kvx::householder_q(deficient.data(), 40, 4, deficient_q.data());
  CHECK(orthonormality_error(deficient_q, 40, 4) < 1e-6);
  CHECK(span_error(deficient, deficient_q, 40, 4) < 1e-5);
}

void test_powersgd_acc() {
  g_test = "powersgd_acc";
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}}) {
    const Floats grad = randn(n, 31), residual = randn(n, 32);
    Floats acc(n, 7.0f), copy(n, 7.0f);
    CHECK_EQ(kvx::powersgd_acc(grad.data(), residual.data(), n, acc.data()), kvx::kOk);
    int wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += acc[i] != grad[i] + residual[i];
    CHECK_EQ(wrong, 0);
    CHECK_EQ(kvx::powersgd_acc(grad.data(), nullptr, n, copy.data()), kvx::kOk);
    CHECK(same_bits(copy, grad));
  }
  // a NaN or +-Inf in grad, first, in the vector body or last: kNonFinite, acc written;
  // the residual does not count (a void step never leaves it non-finite)
  const Floats residual = randn(100, 34);
  for (int64_t at : {int64_t{0}, int64_t{50}, int64_t{99}}) {
    for (float bad : {kNaN, kInf, -kInf}) {
      Floats grad = randn(100, 33), acc(100);
      grad[at] = bad;
      CHECK_EQ(kvx::powersgd_acc(grad.data(), residual.data(), 100, acc.data()),
               kvx::kNonFinite);
      CHECK(!std::isfinite(acc[at]));
      CHECK_EQ(kvx::powersgd_acc(grad.data(), nullptr, 100, acc.data()), kvx::kNonFinite);
    }
  }
  Floats grad = randn(100, 35), bad_residual = residual, acc(100);
  bad_residual[3] = kNaN;
  CHECK_EQ(kvx::powersgd_acc(grad.data(), bad_residual.data(), 100, acc.data()), kvx::kOk);
  CHECK_EQ(kvx::powersgd_acc(grad.data(), residual.data(), -1, acc.data()), kvx::kBadParam);
}

void test_powersgd_void() {
  g_test = "powersgd_void";
  const int64_t rows = 30, rank = 3;
  const Floats p = randn(rows * rank, 21), q_old = randn(rows * rank, 22),
               q_sum = randn(rows * rank, 23);
  Floats want(p.size()), out(p.size(), 7.0f);
  // finite: p_hat is householder_q(p)
  kvx::householder_q(p.data(), rows, rank, want.data());
  CHECK_EQ(kvx::powersgd_p_hat(p.data(), rows, rank, out.data()), kvx::kOk);
  CHECK(same_bits(out, want));
  // a NaN or +-Inf anywhere: void, p_hat of zeros (the identity's columns)
  for (float bad : {kNaN, kInf, -kInf}) {
    Floats bad_p = p;
    bad_p[rows * rank - 1] = bad;
    out.assign(p.size(), 7.0f);
    CHECK_EQ(kvx::powersgd_p_hat(bad_p.data(), rows, rank, out.data()), kvx::kNonFinite);
    CHECK(out == identity_columns(rows, rank));
  }
  // next Q: householder_q(q_sum) if void_in is 0 and q_sum finite, else q_old
  kvx::householder_q(q_sum.data(), rows, rank, want.data());
  CHECK_EQ(kvx::powersgd_next_q(q_old.data(), q_sum.data(), 0.0f, rows, rank, out.data()),
           kvx::kOk);
  CHECK(same_bits(out, want));
  for (float void_in : {1.0f, 9.0f, kNaN}) {
    out.assign(p.size(), 7.0f);
    CHECK_EQ(kvx::powersgd_next_q(q_old.data(), q_sum.data(), void_in, rows, rank, out.data()),
             kvx::kNonFinite);
    CHECK(same_bits(out, q_old));
  }
  for (float bad : {kNaN, kInf, -kInf}) {
    Floats bad_sum = q_sum;
    bad_sum[0] = bad;
    out.assign(p.size(), 7.0f);
    CHECK_EQ(kvx::powersgd_next_q(q_old.data(), bad_sum.data(), 0.0f, rows, rank, out.data()),
             kvx::kNonFinite);
    CHECK(same_bits(out, q_old));
  }
}

int main() {
  test_wire();
  test_numpy_order_sum();
  test_finite();
  test_select();
  test_fp32();
  test_topk_hand();
  test_topk_roundtrips();
  test_topk_nonfinite();
  test_topk_malformed();
  test_topk_gather_scatter();
  test_ternary_hand();
  test_ternary_roundtrips();
  test_ternary_nonfinite();
  test_ternary_malformed();
  test_ternary_sum();
  test_ternary_sum_any_order();
  test_ternary_sum_decode_bases();
  test_ternary_sum_errors();
  test_twobit();
  test_adacomp_hand();
  test_adacomp_roundtrips();
  test_adacomp_exact();
  test_adacomp_nonfinite();
  test_adacomp_malformed();
  test_element_topk_hand();
  test_element_topk_roundtrips();
  test_element_topk_exact();
  test_element_topk_paths();
  test_momentum_correction();
  test_element_topk_nonfinite();
  test_element_topk_malformed();
  test_outer();
  test_fp16();
  test_powersgd_q();
  test_powersgd_void();
  test_powersgd_acc();
  std::printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures > 100 ? 100 : g_failures;
}
