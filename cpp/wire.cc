// Header and status table of the wire format; see wire.h and python/kvx_ref/wire.py.
#include "wire.h"

#include <cmath>

namespace kvx {

const StatusSpec kStatuses[kStatusCount] = {
    {kOk, "OK", "ok"},
    {kNonFinite, "NONFINITE", "non-finite values (NaN or Inf)"},
    {kBadMagic, "BAD_MAGIC", "bad magic number (not a kvstore_ext payload)"},
    {kBadVersion, "BAD_VERSION", "unsupported payload version"},
    {kBadCodec, "BAD_CODEC", "payload of another codec"},
    {kBadSize, "BAD_SIZE", "size mismatch between payload and tensor"},
    {kBadParam, "BAD_PARAM", "invalid codec parameter"},
    {kBadIndex, "BAD_INDEX", "invalid filter index"},
    {kBadWord, "BAD_WORD", "invalid packed word"},
    {kVoid, "VOID", "void contribution (the worker's gradient was non-finite)"},
};

const char* status_name(int status) {
  if (status < 0 || status >= kStatusCount) return "unknown status";
  return kStatuses[status].message;
}

int digits_per_word(int64_t base, int mantissa_bits) {
  if (base < 2 || mantissa_bits < 1 || mantissa_bits > 62) return 0;
  const int64_t limit = int64_t{1} << mantissa_bits;
  int d = 0;
  for (int64_t power = 1; power <= limit / base; power *= base) ++d;
  return d;
}

// IEEE rounding, as NumPy's f32().
bool threshold_valid(double threshold) {
  return threshold >= 0.0 && std::isfinite(threshold) &&
         std::isfinite(static_cast<float>(threshold));
}

void write_header(float* payload, float codec, int64_t n, float a, float b,
                  int64_t body_words) {
  payload[0] = kMagic;
  payload[1] = codec;
  payload[2] = kVersion;
  payload[3] = static_cast<float>(n % kExactF32);
  payload[4] = static_cast<float>(n / kExactF32);
  payload[5] = a;
  payload[6] = b;
  payload[7] = static_cast<float>(body_words);
}

int check_header(const float* payload, int64_t payload_words, float codec, int64_t n,
                 float* a, float* b) {
  *a = 0.0f;
  *b = 0.0f;
  if (payload_words < kHeaderWords) return kBadSize;
  // Negated comparisons so that NaN words fail, like `h[0] != MAGIC` in the spec.
  if (!(payload[0] == kMagic)) return kBadMagic;
  if (!(payload[2] == kVersion)) return kBadVersion;
  if (!(payload[1] == codec)) return kBadCodec;
  // The spec compares in float64: h[3] + h[4] * 2^24 == n, h[7] == body length.
  const double count = static_cast<double>(payload[3]) +
                       static_cast<double>(payload[4]) * static_cast<double>(kExactF32);
  if (!(count == static_cast<double>(n)) ||
      !(static_cast<double>(payload[7]) == static_cast<double>(payload_words - kHeaderWords)))
    return kBadSize;
  *a = payload[5];
  *b = payload[6];
  return kOk;
}

}  // namespace kvx
