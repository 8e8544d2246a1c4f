// The wire format every server-decoded payload shares (its 8-word header) and the status
// codes every kernel returns: the C++ side of python/kvx_ref/wire.py.  The C API exports
// these tables (kvx_status_*, kvx_header_*) and tests/test_cpp_ops.py holds the Python
// constants (the spec's and kvstore_ext's) equal to them.
#ifndef KVX_WIRE_H_
#define KVX_WIRE_H_

#include <cstdint>

namespace kvx {

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
  kVoid = 9,
  kStatusCount = 10,
};

// One row per status, in code order: its name in python/kvx_ref/wire.py and the message
// users read (kvstore_ext/errors.py).
struct StatusSpec {
  Status code;
  const char* symbol;
  const char* message;
};
extern const StatusSpec kStatuses[kStatusCount];

// The status's message, or "unknown status".
const char* status_name(int status);

constexpr float kMagic = 7340.0f;
constexpr float kVersion = 1.0f;
constexpr int64_t kHeaderWords = 8;

constexpr int kMantissaF32 = 24;             // integers are exact in float32 below 2^24
constexpr int64_t kExactF32 = int64_t{1} << kMantissaF32;

// Largest D with base^D <= 2^mantissa_bits (0 if base < 2 or base > 2^mantissa_bits).
int digits_per_word(int64_t base, int mantissa_bits);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// True when the integer v survives a round trip through float32 (the header stores
// counts as float32 words).
inline bool exact_in_f32(int64_t v) {
  return static_cast<int64_t>(static_cast<float>(v)) == v;
}
// An integer travels as two exact float32 words (v mod 2^24, v div 2^24) below 2^48.
constexpr int64_t kExactTwoF32 = kExactF32 << kMantissaF32;
// Element counts travel as two float32 words.
inline bool count_fits_header(int64_t n) { return n >= 0 && n < kExactTwoF32; }

// A threshold is used as float32: it must be finite there too (1e39 would become Inf,
// and 0 * Inf = NaN would then enter the residual).
bool threshold_valid(double threshold);

// Writes the 8-word header; n is split in two words so that both stay exact.
void write_header(float* payload, float codec, int64_t n, float a, float b,
                  int64_t body_words);
// Checks magic, version, codec, element count and body length against what the
// receiver expects; returns the status and the two codec parameters.
int check_header(const float* payload, int64_t payload_words, float codec, int64_t n,
                 float* a, float* b);

}  // namespace kvx

#endif  // KVX_WIRE_H_
