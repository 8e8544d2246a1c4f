// The server-decoded codecs, in one table: what a parameter server needs to decode a
// payload by the codec id in its header.  Adding such a codec adds one row to kCodecs
// (codec_table.cc); decode_slots and the C API (kvx_codec_*) read nothing else.
#ifndef KVX_CODEC_TABLE_H_
#define KVX_CODEC_TABLE_H_

#include <cstdint>

namespace kvx {

// payload (payload_words floats) -> out or acc (n floats); a Status.
using DecodeFn = int (*)(const float* payload, int64_t payload_words, int64_t n, float* out);

struct CodecSpec {
  float id;                  // header word 1
  const char* name;          // kvstore_ext's codec name (Codec.name)
  DecodeFn decode;           // out = the decoded tensor (zeros if malformed)
  DecodeFn decode_add;       // acc += the decoded tensor (untouched if malformed)
  // Payload length for n elements and header parameters a, b; -1 if a or b cannot be
  // the codec's (not an integer count, say).
  int64_t (*payload_words)(int64_t n, float a, float b);
};

extern const CodecSpec kCodecs[];
extern const int kCodecCount;

// The row of codec id `id`, or nullptr.
const CodecSpec* find_codec(float id);

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
