// The checks the C++ unit tests count: CHECK(cond) and CHECK_EQ(a, b) print the file,
// line, test and values of a failure and go on, so that one run reports every failure;
// the test's exit status is the number of failed checks (capped by the caller).
#ifndef KVX_TESTS_CHECK_H_
#define KVX_TESTS_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace kvx_test {

inline int g_checks = 0;
inline int g_failures = 0;
inline const char* g_test = "";   // the test running, named in failures

using Floats = std::vector<float>;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// n normal values (times scale) from a seeded generator.
inline Floats randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Floats x(n);
  for (auto& v : x) v = scale * normal(rng);
  return x;
}

}  // namespace kvx_test

#define CHECK(cond)                                                                  \
  do {                                                                               \
    ++kvx_test::g_checks;                                                            \
    if (!(cond)) {                                                                   \
      ++kvx_test::g_failures;                                                        \
      std::printf("FAIL %s:%d [%s] %s\n", __FILE__, __LINE__, kvx_test::g_test,      \
                  #cond);                                                            \
    }                                                                                \
  } while (0)

#define CHECK_EQ(a, b)                                                               \
  do {                                                                               \
    ++kvx_test::g_checks;                                                            \
    const auto va_ = (a);                                                            \
    const auto vb_ = (b);                                                            \
    if (!(va_ == vb_)) {                                                             \
      ++kvx_test::g_failures;                                                        \
      std::printf("FAIL %s:%d [%s] %s == %s (%.17g vs %.17g)\n", __FILE__, __LINE__, \
                  kvx_test::g_test, #a, #b, static_cast<double>(va_),                \
                  static_cast<double>(vb_));                                         \
    }                                                                                \
  } while (0)

#endif  // KVX_TESTS_CHECK_H_
