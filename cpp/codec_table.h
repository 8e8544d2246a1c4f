// The server-decoded codecs, in one table: what a parameter server needs to decode a
// payload by the codec id in its header.  Each codec registers its own row from its own
// file (KVX_REGISTER_CODEC in cpp/codecs/<name>.cc), so adding one edits no shared file;
// decode_slots and the C API (kvx_codec_*) read nothing else.  The rows are checked
// against kvstore_ext's codec list (its codec classes' ids, names and payload sizes)
// by tests/test_cpp_ops.py (test_wire_tables_agree).
#ifndef KVX_CODEC_TABLE_H_
#define KVX_CODEC_TABLE_H_

#include <cmath>
#include <cstdint>

#include "wire.h"

namespace kvx {

// payload (payload_words floats) -> out or acc (n floats); a Status.
using DecodeFn = int (*)(const float* payload, int64_t payload_words, int64_t n, float* out);
// grad, residual (n floats each; the residual updated in place, they may alias) ->
// payload (payload_words(n, a, b) floats, header first); a Status.  What the generic
// op kvx_codec_encode(grad, residual*; codec, a, b) runs, so that a new codec needs no
// MXNet op of its own.
using EncodeFn = int (*)(const float* grad, float* residual, int64_t n, float a, float b,
                         float* payload);

struct CodecSpec {
  float id;                  // header word 1
  const char* name;          // kvstore_ext's codec name (Codec.name)
  DecodeFn decode;           // out = the decoded tensor (zeros if malformed)
  DecodeFn decode_add;       // acc += the decoded tensor (untouched if malformed)
  // Payload length for n elements and header parameters a, b; -1 if a or b cannot be
  // the codec's (not an integer count, say).
  int64_t (*payload_words)(int64_t n, float a, float b);
  EncodeFn encode;           // nullptr: the codec's encoder is an op of its own
};

// The rows registered so far (all of them once the library's static initialisation is
// done), in no particular order.
int codec_count();
const CodecSpec& codec_at(int index);       // 0 <= index < codec_count()

// The row of codec id `id`, or nullptr.
const CodecSpec* find_codec(float id);

// Registers a row at static initialisation; a second row with the same id or name
// aborts with a message (two codecs claiming one id is a build error).
struct CodecRegistrar {
  explicit CodecRegistrar(const CodecSpec& spec);
};
#define KVX_REGISTER_CODEC(var, ...) \
  static const ::kvx::CodecRegistrar var { ::kvx::CodecSpec{__VA_ARGS__} }

// A header parameter that counts something: an integer float32 holds exactly, else -1,
// so that a table lookup on a malformed header never converts NaN or 1e30 to int64.
inline int64_t count_param(float x) {
  return x >= 0 && x < static_cast<float>(kExactF32) && x == std::floor(x)
             ? static_cast<int64_t>(x)
             : -1;
}

// What a parameter server does with one key in server-decode mode: `workers` slots of
// `slot_words` floats each hold one payload (header first, then padding).  Every slot is
// decoded (through the row of its header's codec id) and added into acc, which has
// `capacity` elements; the payloads must agree on codec and element count n
// (<= capacity).  status[w] is slot w's status (0 = ok).  Returns the first non-zero
// status, or kOk.  A slot whose first word is NaN is void (kVoid): a worker whose
// gradient was non-finite sends one so that the others are not left waiting.  If any
// slot is void or malformed, acc is all NaN: every worker then sees the round failed,
// and a server need not wait for the statuses before it answers pulls.
int decode_slots(const float* slots, int64_t workers, int64_t slot_words, float* acc,
                 int64_t capacity, float* status);

}  // namespace kvx

#endif  // KVX_CODEC_TABLE_H_
