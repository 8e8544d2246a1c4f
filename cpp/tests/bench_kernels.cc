// Single-thread throughput of the main kernels against a memcpy of the same size.
// Not a test: built with KVX_BUILD_TESTS, run by hand:  ./bench_kernels [n] [rounds]
// Every round runs memcpy and every kernel once, and the best time of each is kept, so
// that a busy machine slows all of them alike.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "../kernels.h"

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 10000000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 15;
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> grad(n), residual(n), copy(n), out(n);
  // Small gradients keep the residual ordinary although the same one is fed every round.
  for (auto& v : grad) v = 1e-3f * normal(rng);
  for (auto& v : residual) v = 0.1f * normal(rng);

  std::vector<float> fp32(kvx::fp32_payload_words(n)), ternary(kvx::ternary_payload_words(n));
  std::vector<float> sum_words(kvx::ternary_sum_words(n, 4));
  std::vector<uint32_t> twobit(kvx::twobit_words(n));
  // Conv-like layout: filters of 4608 (512 x 3 x 3) elements, 5% of them sent.
  const int64_t filter_size = 4608, filters = n / filter_size, k = (filters + 19) / 20;
  const int64_t m = filters * filter_size;
  std::vector<float> topk(kvx::topk_payload_words(k, filter_size));
  kvx::ternary_encode(grad.data(), residual.data(), n, 1.0, 0.0, ternary.data());
  kvx::ternary_encode_sum(grad.data(), residual.data(), n, 0.05, 4, sum_words.data());
  kvx::topk_encode(grad.data(), residual.data(), filters, filter_size, k, topk.data());
  // THC, 4 workers: every worker's norm equal to this one's (M = ||acc||)
  kvx::ThcParams thc;
  std::vector<float> thc_words(kvx::thc_sum_words(n, thc, 4));
  float thc_norm = 0.0f;
  kvx::thc_norm(grad.data(), residual.data(), n, &thc_norm);
  const float thc_norms[4] = {thc_norm, thc_norm, thc_norm, thc_norm};
  kvx::thc_encode(grad.data(), residual.data(), n, thc_norms, 4, 0, 0, thc, thc_words.data());
  // THC's non-uniform table (a lookup a value; base 121 at 4 workers: 3 digits a word)
  kvx::ThcParams thc_table = thc;
  thc_table.table = kvx::kThcTableThc;
  thc_table.clamp = 2.1539;
  std::vector<float> table_words(kvx::thc_sum_words(n, thc_table, 4));
  kvx::thc_encode(grad.data(), residual.data(), n, thc_norms, 4, 0, 0, thc_table,
                  table_words.data());

  struct Case { const char* name; int64_t elements; std::function<void()> run; };
  const std::vector<Case> cases = {
    {"memcpy (n floats)", n, [&] { std::memcpy(copy.data(), grad.data(), n * sizeof(float)); }},
    {"ternary_encode adaptive t", n, [&] {
       kvx::ternary_encode(grad.data(), residual.data(), n, 1.0, 0.0, ternary.data()); }},
    {"ternary_encode fixed t", n, [&] {
       kvx::ternary_encode(grad.data(), residual.data(), n, 1.0, 0.05, ternary.data()); }},
    {"ternary_decode", n, [&] {
       kvx::ternary_decode(ternary.data(), ternary.size(), n, out.data()); }},
    {"ternary_decode_add", n, [&] {
       kvx::ternary_decode_add(ternary.data(), ternary.size(), n, out.data()); }},
    {"ternary_encode_sum 4 workers", n, [&] {
       kvx::ternary_encode_sum(grad.data(), residual.data(), n, 0.05, 4, sum_words.data()); }},
    {"ternary_decode_sum 4 workers", n, [&] {
       kvx::ternary_decode_sum(sum_words.data(), sum_words.size(), 0.05, 4, n, out.data()); }},
    {"topk_encode 5% of 4608-filters", m, [&] {
       kvx::topk_encode(grad.data(), residual.data(), filters, filter_size, k, topk.data()); }},
    {"topk_decode", m, [&] { kvx::topk_decode(topk.data(), topk.size(), m, out.data()); }},
    {"twobit_encode", n, [&] {
       kvx::twobit_encode(grad.data(), residual.data(), n, 0.05, twobit.data()); }},
    {"twobit_decode", n, [&] { kvx::twobit_decode(twobit.data(), n, 0.05, out.data()); }},
    {"fp32_encode", n, [&] { kvx::fp32_encode(grad.data(), n, fp32.data()); }},
    {"thc_norm", n, [&] {
       kvx::thc_norm(grad.data(), residual.data(), n, &thc_norm); }},
    {"thc_encode q=16 4 workers", n, [&] {
       kvx::thc_encode(grad.data(), residual.data(), n, thc_norms, 4, 0, 1, thc,
                       thc_words.data()); }},
    {"thc_decode_sum q=16 4 workers", n, [&] {
       kvx::thc_decode_sum(thc_words.data(), thc_words.size(), n, thc_norms, 4, 1, thc,
                           out.data()); }},
    {"thc_encode thc table 4 workers", n, [&] {
       kvx::thc_encode(grad.data(), residual.data(), n, thc_norms, 4, 0, 1, thc_table,
                       table_words.data()); }},
    {"thc_decode_sum thc table 4 w.", n, [&] {
       kvx::thc_decode_sum(table_words.data(), table_words.size(), n, thc_norms, 4, 0,
                           thc_table, out.data()); }},
  };
  std::vector<double> best(cases.size(), 1e300);
  for (int r = 0; r < rounds; ++r) {
    for (size_t c = 0; c < cases.size(); ++c) {
      const auto t0 = std::chrono::steady_clock::now();
      cases[c].run();
      const auto t1 = std::chrono::steady_clock::now();
      best[c] = std::min(best[c], std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }
  std::printf("n = %lld, best of %d rounds, one thread\n", static_cast<long long>(n), rounds);
  const double copy_ms_per_elem = best[0] / n;
  for (size_t c = 0; c < cases.size(); ++c) {
    const double ms = best[c];
    std::printf("%-32s %8.2f ms %8.0f Melem/s  %5.2fx memcpy time\n", cases[c].name, ms,
                cases[c].elements / ms / 1e3, ms / (copy_ms_per_elem * cases[c].elements));
  }
  return 0;
}
