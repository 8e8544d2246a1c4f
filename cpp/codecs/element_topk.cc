// Element top-k; see element_topk.h.
#include "codecs/element_topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "codec_table.h"
#include "kernel_util.h"

namespace kvx {

// |acc| as the bits of a float32: for a non-negative float the bits order as the value
// does.  acc = grad + residual, formed as the spec forms it, in float32.
static KVX_INLINE uint32_t magnitude_bits(float acc) {
  const float m = std::fabs(acc);
  uint32_t bits;
  std::memcpy(&bits, &m, sizeof bits);
  return bits;
}

constexpr int kBucketShift = 20;  // a bucket: the top 12 bits (exponent, 3 of the mantissa)
constexpr int64_t kBuckets = int64_t{1} << (32 - kBucketShift);

// An element that may be sent: its index and acc.
struct Candidate {
  int64_t index;
  float acc;
};

// The elements whose magnitude may be among the k largest (1 <= k <= n), in index order,
// found by a radix select without sorting or copying the tensor: one pass counts the
// magnitudes per bucket, which names the bucket that holds the k-th largest; a second
// collects the elements of that bucket and of every bucket above it (larger magnitudes
// only): k and the few of the k-th's bucket that are smaller.
static std::vector<Candidate> radix_candidates(const float* grad, const float* residual,
                                               int64_t n, int64_t k) {
  // Four interleaved counts: a gradient's magnitudes crowd into a few buckets, and
  // increments of one counter in a row would each wait for the one before.
  constexpr int64_t kWays = 4;
  std::vector<int64_t> counts(static_cast<size_t>(kWays * kBuckets), 0);
  int64_t i = 0;
  for (; i + kWays <= n; i += kWays)
    for (int64_t w = 0; w < kWays; ++w)
      ++counts[w * kBuckets + (magnitude_bits(grad[i + w] + residual[i + w]) >> kBucketShift)];
  for (; i < n; ++i) ++counts[magnitude_bits(grad[i] + residual[i]) >> kBucketShift];
  int64_t bucket = kBuckets - 1, at_or_above = 0;
  for (;; --bucket) {
    for (int64_t w = 0; w < kWays; ++w) at_or_above += counts[w * kBuckets + bucket];
    if (at_or_above >= k) break;
  }
  const uint32_t lowest = static_cast<uint32_t>(bucket) << kBucketShift;
  std::vector<Candidate> found;
  found.reserve(static_cast<size_t>(at_or_above));
  for (i = 0; i < n; ++i) {
    const float acc = grad[i] + residual[i];
    if (magnitude_bits(acc) >= lowest) found.push_back({i, acc});
  }
  return found;
}

#ifdef KVX_AVX2
// candidates_above with AVX2: eight elements a compare, their selected ones packed to
// the front of a register and the register stored whole, the next store starting where
// the selected ones end (no branch on the data).  Returns the count; `index` and `acc`
// grow as needed, with room for 8 beyond it.  n < 2^31 (int32 lanes).
__attribute__((target("avx2,popcnt"))) static int64_t collect_avx2(
    const float* grad, const float* residual, int64_t n, uint32_t floor,
    std::vector<int32_t>* index, std::vector<float>* acc) {
  // magnitude bits and floor are below 2^31: a signed compare orders them
  const __m256i below = _mm256_set1_epi32(static_cast<int32_t>(floor) - 1);
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i eight = _mm256_set1_epi32(8);
  __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t count = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    room_for_eight(index, acc, count);
    const __m256 sum = _mm256_add_ps(_mm256_loadu_ps(grad + i), _mm256_loadu_ps(residual + i));
    const __m256i over = _mm256_cmpgt_epi32(
        _mm256_and_si256(_mm256_castps_si256(sum), magnitude), below);
    const int mask = _mm256_movemask_ps(_mm256_castsi256_ps(over));
    const __m256i pack = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPackLanes.lanes[mask]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(index->data() + count),
                        _mm256_permutevar8x32_epi32(at, pack));
    _mm256_storeu_ps(acc->data() + count, _mm256_permutevar8x32_ps(sum, pack));
    count += __builtin_popcount(static_cast<unsigned>(mask));
    at = _mm256_add_epi32(at, eight);
  }
  for (; i < n; ++i) {
    const float a = grad[i] + residual[i];
    if (magnitude_bits(a) < floor) continue;
    room_for_eight(index, acc, count);
    (*index)[count] = static_cast<int32_t>(i);
    (*acc)[count++] = a;
  }
  return count;
}
#endif

// Every element whose magnitude bits are at least `floor`, in index order.
static std::vector<Candidate> candidates_above(const float* grad, const float* residual,
                                               int64_t n, uint32_t floor, size_t expect) {
  std::vector<Candidate> found;
#ifdef KVX_AVX2
  if (n < (int64_t{1} << 31) && have_avx2()) {
    std::vector<int32_t> index(expect + 8);
    std::vector<float> acc(expect + 8);
    const int64_t count = collect_avx2(grad, residual, n, floor, &index, &acc);
    found.resize(static_cast<size_t>(count));
    for (int64_t c = 0; c < count; ++c) found[c] = {index[c], acc[c]};
    return found;
  }
#endif
  found.reserve(expect);
  for (int64_t i = 0; i < n; ++i) {
    const float acc = grad[i] + residual[i];
    if (magnitude_bits(acc) >= floor) found.push_back({i, acc});
  }
  return found;
}

// The radix select's first pass, a scatter of counts, costs most of the encoder: from
// this many elements on, a sample guesses a floor under the k-th largest magnitude and
// one pass collects everything at or above it; the radix select runs only when the guess
// was too high (fewer than k found).
constexpr int64_t kSampleFrom = 1 << 16;
constexpr int64_t kSample = 8192;

static thread_local int g_last_path = 0;
int element_topk_last_path() { return g_last_path; }

// The magnitude bits of the sample's rank-th largest (0-based): a floor that leaves about
// rank / kSample of the tensor at or above it.  The sample is spread by a fixed
// pseudo-random sequence, not a stride, so that a tensor's rows or columns do not
// line up with it.
static uint32_t sampled_floor(const float* grad, const float* residual, int64_t n,
                              int64_t rank) {
  std::vector<uint32_t> bits(kSample);
  uint64_t state = 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(n);
  for (int64_t s = 0; s < kSample; ++s) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t i = static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(n));
    bits[s] = magnitude_bits(grad[i] + residual[i]);
  }
  std::nth_element(bits.begin(), bits.begin() + rank, bits.end(), std::greater<uint32_t>());
  return bits[rank];
}

// The elements whose magnitude may be among the k largest, in index order: a superset of
// the k largest (and every NaN/Inf, whose magnitude bits top every finite one's).
static std::vector<Candidate> candidates_of(const float* grad, const float* residual,
                                            int64_t n, int64_t k) {
  if (n >= kSampleFrom) {
    // The sample's expected count above the k-th largest, plus four standard deviations
    // and a margin: on a random tensor the guess falls short less than once in 30,000
    // calls.
    const double expect = static_cast<double>(kSample) * static_cast<double>(k) /
                          static_cast<double>(n);
    const int64_t rank = static_cast<int64_t>(expect + 4.0 * std::sqrt(expect) + 8.0);
    if (rank < kSample / 4) {
      const uint32_t floor = sampled_floor(grad, residual, n, rank);
      const size_t room = static_cast<size_t>(
          1.25 * static_cast<double>(rank + 1) / kSample * static_cast<double>(n));
      std::vector<Candidate> found = candidates_above(grad, residual, n, floor, room);
      if (static_cast<int64_t>(found.size()) >= k) {
        g_last_path = 1;
        return found;
      }
    }
  }
  g_last_path = 2;
  return radix_candidates(grad, residual, n, k);
}

// residual[i] = grad[i] + residual[i]: what every element not sent keeps.
KVX_HOT static void accumulate(const float* grad, float* residual, int64_t n) {
  for (int64_t i = 0; i < n; ++i) residual[i] = grad[i] + residual[i];
}

int element_topk_encode(const float* grad, float* residual, int64_t n, int64_t k,
                        float* payload) {
  if (n < 1 || k < 1 || k > n) {
    if (n >= 1 && k >= 0 && k <= n) zero(payload, element_topk_payload_words(n, k));
    return kBadParam;
  }
  const int64_t width = element_topk_index_words(n) + 1;
  const int64_t words = element_topk_payload_words(n, k);
  // k and the body length are float32 header words: they must be exact.
  if (!count_fits_header(n) || !exact_in_f32(k * width)) {
    zero(payload, words);
    return kBadSize;
  }
  zero(payload, words);
  // Every NaN/Inf is a candidate (its magnitude bits top every finite one's), so the
  // candidates tell whether acc is finite, before the residual changes.
  const std::vector<Candidate> found = candidates_of(grad, residual, n, k);
  for (const Candidate& c : found)
    if (!std::isfinite(c.acc)) return kNonFinite;

  // Every candidate above the k-th largest magnitude is sent, and of those equal to it
  // the first `ties` by index (ties to the lower index).
  // (Magnitudes as their bits: every candidate is finite, and integers compare faster.)
  std::vector<uint32_t> magnitude(found.size());
  for (size_t c = 0; c < found.size(); ++c) magnitude[c] = magnitude_bits(found[c].acc);
  std::nth_element(magnitude.begin(), magnitude.begin() + (k - 1), magnitude.end(),
                   std::greater<uint32_t>());
  const uint32_t kth = magnitude[k - 1];
  int64_t ties = k;
  for (const Candidate& c : found) ties -= magnitude_bits(c.acc) > kth;

  accumulate(grad, residual, n);
  write_header(payload, kCodecElementTopk, n, static_cast<float>(k), 0.0f, k * width);
  float* entry = payload + kHeaderWords;
  for (const Candidate& c : found) {
    const uint32_t m = magnitude_bits(c.acc);
    if (!(m > kth || (m == kth && ties > 0))) continue;
    ties -= m == kth;
    entry[0] = static_cast<float>(c.index % kExactF32);
    if (width == 3) entry[1] = static_cast<float>(c.index / kExactF32);
    entry[width - 1] = c.acc;
    entry += width;
    residual[c.index] = 0.0f;
  }
  return kOk;
}

static inline int64_t entry_index(const float* entry, int64_t width) {
  int64_t index = static_cast<int64_t>(entry[0]);
  if (width == 3) index += static_cast<int64_t>(entry[1]) * kExactF32;
  return index;
}

// k of a payload after checking every field and entry; kOk or a status.
static int element_topk_check(const float* payload, int64_t payload_words, int64_t n,
                              int64_t* k) {
  float a, b;
  const int status = check_header(payload, payload_words, kCodecElementTopk, n, &a, &b);
  if (status != kOk) return status;
  const int64_t width = element_topk_index_words(n) + 1;
  // Float64 tests, as the spec's; finite and range first so that the conversion is defined.
  const double kd = a;
  if (!(kd >= 1.0 && kd <= static_cast<double>(n) && kd == std::floor(kd) && b == 0.0f &&
        static_cast<double>(payload_words) ==
            static_cast<double>(kHeaderWords) + kd * static_cast<double>(width)))
    return kBadParam;
  *k = static_cast<int64_t>(kd);
  // Every word first, then the indices, so that a payload with both faults gets the
  // spec's status (kBadWord).
  const float* body = payload + kHeaderWords;
  for (int64_t e = 0; e < *k; ++e) {
    const float* entry = body + e * width;
    for (int64_t w = 0; w < width - 1; ++w) {
      const double v = entry[w];
      if (!(v >= 0.0 && v < static_cast<double>(kExactF32) && v == std::floor(v)))
        return kBadWord;
    }
    // An encoder never sends a non-finite value: a payload that holds one is malformed.
    if (!std::isfinite(entry[width - 1])) return kBadWord;
  }
  int64_t previous = -1;
  for (int64_t e = 0; e < *k; ++e) {
    const int64_t index = entry_index(body + e * width, width);
    if (index >= n || index <= previous) return kBadIndex;
    previous = index;
  }
  return kOk;
}

int element_topk_decode(const float* payload, int64_t payload_words, int64_t n, float* out) {
  int64_t k = 0;
  const int status = element_topk_check(payload, payload_words, n, &k);
  zero(out, n);
  if (status != kOk) return status;
  const int64_t width = element_topk_index_words(n) + 1;
  for (const float* entry = payload + kHeaderWords; k > 0; --k, entry += width)
    out[entry_index(entry, width)] = entry[width - 1];
  return kOk;
}

int element_topk_decode_add(const float* payload, int64_t payload_words, int64_t n,
                            float* acc) {
  int64_t k = 0;
  const int status = element_topk_check(payload, payload_words, n, &k);
  if (status != kOk) return status;
  const int64_t width = element_topk_index_words(n) + 1;
  for (const float* entry = payload + kHeaderWords; k > 0; --k, entry += width)
    acc[entry_index(entry, width)] += entry[width - 1];
  return kOk;
}

void element_topk_sent(const float* payload, int64_t n, int64_t k, int64_t* sent) {
  const int64_t width = element_topk_index_words(n) + 1;
  const float* entry = payload + kHeaderWords;
  for (int64_t e = 0; e < k; ++e, entry += width) {
    const int64_t low = index_word(entry[0]);
    const int64_t high = width == 3 ? index_word(entry[1]) : 0;
    const int64_t index = low < 0 || high < 0 ? n : low + high * kExactF32;
    sent[e] = index < n ? index : n;
  }
}

// The servers' row (codec_table.h): id, name, decoders, payload size.
KVX_REGISTER_CODEC(kElementTopkRow, kCodecElementTopk,
    "element_topk", element_topk_decode, element_topk_decode_add,
    [](int64_t n, float k, float) -> int64_t {
      const int64_t entries = count_param(k);
      return entries < 0 ? -1 : element_topk_payload_words(n, entries);
    },
    nullptr);

}  // namespace kvx
