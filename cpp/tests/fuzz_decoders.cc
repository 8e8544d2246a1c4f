// Seeded fuzzing of every decoder a parameter server or a worker runs on bytes it did
// not make: each row of the codec table (decode, decode_add), decode_slots, and the
// additive ternary decoder.  Built twice by CMake: plain, and with AddressSanitizer and
// UndefinedBehaviorSanitizer, which turn any out-of-bounds read or write into a failure.
//
// Inputs: random headers and bodies (words drawn from a mix of valid integers, values out
// of range, fractions, NaN, +-Inf, huge and negative numbers), valid payloads from the
// encoders with random words mutated, and truncated payloads.  Every buffer is a
// std::vector of exactly the size the decoder is told, so ASan sees one word too far.
//
// Invariants checked on every call: the status is a known code; on a non-zero status a
// decode's output is all zeros and a decode_add's accumulator is bit-identical to before
// (a malformed payload never half-applies); on kOk the output is finite where the
// codec's values are finite; a decode_slots with a void (first word NaN) or malformed
// slot leaves only NaN in the sum.  A codec added to the table is fuzzed by being added.
//
// Usage: fuzz_decoders [cases_per_codec] [seed]     (exit status = failures, capped)
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

namespace {

using kvx::CodecSpec;

int g_failures = 0;

void fail(const char* what, const char* codec, uint64_t case_no, int status) {
  if (++g_failures <= 20)
    std::printf("FAIL %s [%s] case %llu status %d\n", what, codec,
                static_cast<unsigned long long>(case_no), status);
}

class Words {
 public:
  explicit Words(uint64_t seed) : rng_(seed) {}
  uint64_t below(uint64_t n) { return n ? rng_() % n : 0; }
  bool chance(int percent) { return below(100) < static_cast<uint64_t>(percent); }

  // A word of the kinds a malformed payload holds.
  float any(int64_t n) {
    switch (below(10)) {
      case 0: return static_cast<float>(below(static_cast<uint64_t>(n) + 2));   // index-like
      case 1: return static_cast<float>(below(1u << 25));                         // near 2^24
      case 2: return -static_cast<float>(below(1000));
      case 3: return static_cast<float>(below(1000)) + 0.5f;
      case 4: return std::numeric_limits<float>::quiet_NaN();
      case 5: return (below(2) ? 1 : -1) * std::numeric_limits<float>::infinity();
      case 6: return (below(2) ? 1 : -1) * std::numeric_limits<float>::max();
      case 7: return std::ldexp(1.0f, static_cast<int>(below(60)));
      default: return std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng_);
    }
  }

 private:
  std::mt19937_64 rng_;
};

bool known_status(int st) { return st >= 0 && st < kvx::kStatusCount; }

bool all_zero(const std::vector<float>& v) {
  for (float x : v)
    if (x != 0.0f || std::signbit(x)) return false;
  return true;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// A header for codec `id` claiming n elements, random parameters and body length.
std::vector<float> random_payload(Words& w, float id, int64_t n, const CodecSpec& spec) {
  const float a = w.chance(50) ? static_cast<float>(w.below(static_cast<uint64_t>(n) + 2))
                               : w.any(n);
  const float b = w.chance(50) ? static_cast<float>(w.below(64)) : w.any(n);
  int64_t words = spec.payload_words(n, a, b);
  if (words < kvx::kHeaderWords || words > 4 * n + 64 || w.chance(30))
    words = kvx::kHeaderWords + static_cast<int64_t>(w.below(static_cast<uint64_t>(2 * n + 16)));
  std::vector<float> p(static_cast<size_t>(words));
  kvx::write_header(p.data(), id, n, a, b, words - kvx::kHeaderWords);
  for (int64_t i = kvx::kHeaderWords; i < words; ++i) p[i] = w.any(n);
  if (w.chance(20)) p[static_cast<size_t>(w.below(kvx::kHeaderWords))] = w.any(n);
  return p;
}

// A valid payload of the codec named `name`; empty for a codec this file does not know
// (such a codec is still fuzzed with random and truncated payloads).
std::vector<float> valid_payload(Words& w, const char* name, int64_t n) {
  std::vector<float> grad(static_cast<size_t>(n)), residual(static_cast<size_t>(n), 0.0f);
  for (float& g : grad) g = static_cast<float>(w.below(2001)) / 1000.0f - 1.0f;
  std::vector<float> p;
  if (!std::strcmp(name, "fp32")) {
    p.resize(static_cast<size_t>(kvx::fp32_payload_words(n)));
    kvx::fp32_encode(grad.data(), n, p.data());
  } else if (!std::strcmp(name, "topk")) {
    int64_t filters = 1 + static_cast<int64_t>(w.below(8));
    while (n % filters) --filters;
    const int64_t k = 1 + static_cast<int64_t>(w.below(static_cast<uint64_t>(filters)));
    p.resize(static_cast<size_t>(kvx::topk_payload_words(k, n / filters)));
    kvx::topk_encode(grad.data(), residual.data(), filters, n / filters, k, p.data());
  } else if (!std::strcmp(name, "ternary")) {
    p.resize(static_cast<size_t>(kvx::ternary_payload_words(n)));
    kvx::ternary_encode(grad.data(), residual.data(), n, 2.0, 0.0, p.data(),
                        w.chance(50) ? kvx::kValueRound : kvx::kValueThreshold);
  } else if (!std::strcmp(name, "element_topk")) {
    const int64_t k = 1 + static_cast<int64_t>(w.below(static_cast<uint64_t>(n)));
    p.resize(static_cast<size_t>(kvx::element_topk_payload_words(n, k)));
    kvx::element_topk_encode(grad.data(), residual.data(), n, k, p.data());
  } else if (!std::strcmp(name, "fp16_pairs")) {
    p.resize(static_cast<size_t>(kvx::fp16_pairs_payload_words(n)));
    kvx::fp16_pairs_encode(grad.data(), residual.data(), n, 65504.0f,
                           w.chance(50) ? 1.0f : 0.0f, p.data());
  } else if (!std::strcmp(name, "outer")) {
    int64_t out = 1 + static_cast<int64_t>(w.below(8));
    while (n % out) --out;
    const int64_t capacity = static_cast<int64_t>(w.below(6));
    const int64_t rows = capacity ? static_cast<int64_t>(w.below(static_cast<uint64_t>(capacity) + 1)) : 0;
    std::vector<float> u(static_cast<size_t>(rows * out)), v(static_cast<size_t>(rows * (n / out)));
    for (float& x : u) x = grad[w.below(static_cast<uint64_t>(n))];
    for (float& x : v) x = grad[w.below(static_cast<uint64_t>(n))];
    p.resize(static_cast<size_t>(kvx::outer_payload_words(n, capacity, out)));
    kvx::outer_encode(u.data(), v.data(), rows, capacity, out, n / out, p.data());
  } else if (!std::strcmp(name, "adacomp")) {
    const int64_t capacity = 1 + static_cast<int64_t>(w.below(static_cast<uint64_t>(n)));
    p.resize(static_cast<size_t>(kvx::adacomp_payload_words(n, capacity)));
    kvx::adacomp_encode(grad.data(), residual.data(), n, 1 + static_cast<int64_t>(w.below(64)),
                        capacity, p.data());
  }
  // the payload proper: header + the body its header states (a slot may hold padding)
  if (!p.empty()) p.resize(static_cast<size_t>(kvx::kHeaderWords + p[7]));
  return p;
}

// decode and decode_add of one row on one payload; checks the invariants.
void check_row(const CodecSpec& spec, const std::vector<float>& p, int64_t n, Words& w,
               uint64_t case_no) {
  std::vector<float> out(static_cast<size_t>(n), 7.0f);
  const int st = spec.decode(p.data(), static_cast<int64_t>(p.size()), n, out.data());
  if (!known_status(st)) fail("decode: unknown status", spec.name, case_no, st);
  if (st != kvx::kOk && !all_zero(out)) fail("decode: output not zeroed", spec.name, case_no, st);

  std::vector<float> acc(static_cast<size_t>(n));
  for (float& x : acc) x = w.any(4);
  const std::vector<float> before = acc;
  const int st_add = spec.decode_add(p.data(), static_cast<int64_t>(p.size()), n, acc.data());
  if (st_add != st) fail("decode_add: status differs from decode", spec.name, case_no, st_add);
  if (st_add != kvx::kOk &&
      std::memcmp(acc.data(), before.data(), acc.size() * sizeof(float)) != 0)
    fail("decode_add: accumulator touched", spec.name, case_no, st_add);
}

void fuzz_row(const CodecSpec& spec, uint64_t cases, uint64_t seed) {
  Words w(seed ^ static_cast<uint64_t>(spec.id * 1000003));
  for (uint64_t c = 0; c < cases; ++c) {
    const int64_t n = 1 + static_cast<int64_t>(w.below(w.chance(10) ? 70000 : 300));
    std::vector<float> p;
    switch (w.below(3)) {
      case 0:
        p = random_payload(w, spec.id, n, spec);
        break;
      case 1: {                                   // valid, then mutated
        p = valid_payload(w, spec.name, n);
        if (p.empty()) {
          p = random_payload(w, spec.id, n, spec);
        } else {
          std::vector<float> out(static_cast<size_t>(n));
          const int st = spec.decode(p.data(), static_cast<int64_t>(p.size()), n, out.data());
          if (st != kvx::kOk) fail("valid payload rejected", spec.name, c, st);
          else if (!all_finite(out)) fail("valid payload decoded to non-finite", spec.name, c, st);
        }
        const uint64_t flips = 1 + w.below(4);
        for (uint64_t f = 0; f < flips; ++f) p[static_cast<size_t>(w.below(p.size()))] = w.any(n);
        break;
      }
      default:                                    // valid, then truncated or padded
        p = valid_payload(w, spec.name, n);
        if (p.empty()) p = random_payload(w, spec.id, n, spec);
        p.resize(static_cast<size_t>(w.below(p.size() + 8)));
    }
    // the receiver may expect another element count than the sender's
    const int64_t expect = w.chance(15) ? 1 + static_cast<int64_t>(w.below(400)) : n;
    check_row(spec, p, expect, w, c);
  }
}

void fuzz_decode_slots(uint64_t cases, uint64_t seed) {
  Words w(seed + 17);
  for (uint64_t c = 0; c < cases; ++c) {
    const CodecSpec& spec = kvx::codec_at(static_cast<int>(w.below(kvx::codec_count())));
    const int64_t n = 1 + static_cast<int64_t>(w.below(200));
    const int64_t workers = 1 + static_cast<int64_t>(w.below(4));
    int64_t slot_words = 0;
    std::vector<std::vector<float>> payloads;
    for (int64_t k = 0; k < workers; ++k) {
      payloads.push_back(w.chance(50) ? valid_payload(w, spec.name, n)
                                      : random_payload(w, spec.id, n, spec));
      if (payloads.back().empty()) payloads.back() = random_payload(w, spec.id, n, spec);
      slot_words = std::max<int64_t>(slot_words, static_cast<int64_t>(payloads.back().size()));
    }
    if (w.chance(20)) slot_words = static_cast<int64_t>(w.below(static_cast<uint64_t>(slot_words) + 1));
    std::vector<float> slots(static_cast<size_t>(workers * slot_words), 0.0f);
    for (int64_t k = 0; k < workers; ++k) {
      const size_t words = std::min<size_t>(payloads[k].size(), static_cast<size_t>(slot_words));
      if (words) std::memcpy(slots.data() + k * slot_words, payloads[k].data(), words * sizeof(float));
      if (slot_words && w.chance(5)) slots[static_cast<size_t>(k * slot_words)] = std::numeric_limits<float>::quiet_NaN();
    }
    const int64_t capacity = w.chance(80) ? n : 1 + static_cast<int64_t>(w.below(300));
    std::vector<float> acc(static_cast<size_t>(capacity)), status(static_cast<size_t>(workers));
    const int first = kvx::decode_slots(slots.data(), workers, slot_words, acc.data(), capacity,
                                        status.data());
    if (!known_status(first)) fail("decode_slots: unknown status", spec.name, c, first);
    bool failed = false;
    for (float s : status) {
      if (!known_status(static_cast<int>(s))) fail("decode_slots: unknown slot status", spec.name, c, static_cast<int>(s));
      failed = failed || s != 0.0f;
    }
    if (failed != (first != kvx::kOk)) fail("decode_slots: return and slot statuses disagree", spec.name, c, first);
    if (failed && !std::all_of(acc.begin(), acc.end(), [](float x) { return std::isnan(x); }))
      fail("decode_slots: a void or malformed slot left a number in the sum", spec.name, c, first);
  }
}

void fuzz_ternary_sum(uint64_t cases, uint64_t seed) {
  Words w(seed + 29);
  for (uint64_t c = 0; c < cases; ++c) {
    const int64_t n = 1 + static_cast<int64_t>(w.below(500));
    const int64_t workers = w.chance(90) ? 1 + static_cast<int64_t>(w.below(16))
                                         : static_cast<int64_t>(w.below(1u << 22)) - 5;
    int64_t words = workers >= 1 && workers <= kvx::kMaxWorkers ? kvx::ternary_sum_words(n, workers) : 4;
    if (w.chance(20)) words = static_cast<int64_t>(w.below(static_cast<uint64_t>(words) + 3));
    std::vector<float> payload(static_cast<size_t>(words));
    for (float& x : payload) x = w.chance(70) ? static_cast<float>(w.below(1u << 24)) : w.any(n);
    const double threshold = w.chance(80) ? 0.5 : static_cast<double>(w.any(4));
    std::vector<float> out(static_cast<size_t>(n), 7.0f);
    const int st = kvx::ternary_decode_sum(payload.data(), words, threshold, workers, n, out.data());
    if (!known_status(st)) fail("ternary_decode_sum: unknown status", "ternary_sum", c, st);
    if (st != kvx::kOk && !all_zero(out)) fail("ternary_decode_sum: output not zeroed", "ternary_sum", c, st);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t cases = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 3000;
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20261123;
  for (int i = 0; i < kvx::codec_count(); ++i) fuzz_row(kvx::codec_at(i), cases, seed);
  fuzz_decode_slots(cases, seed);
  fuzz_ternary_sum(cases, seed);
  std::printf("fuzz_decoders: %d codecs + decode_slots + ternary_decode_sum, %llu cases each, "
              "seed %llu: %d failures\n", kvx::codec_count(), static_cast<unsigned long long>(cases),
              static_cast<unsigned long long>(seed), g_failures);
  return g_failures > 100 ? 100 : g_failures;
}
