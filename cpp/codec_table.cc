// The table of server-decoded codecs and the servers' dispatch through it.
#include "codec_table.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "codecs/adacomp.h"
#include "codecs/element_topk.h"
#include "codecs/fp32.h"
#include "codecs/outer.h"
#include "codecs/ternary.h"
#include "codecs/topk.h"
#include "kernel_util.h"
#include "wire.h"

namespace kvx {

// A header parameter that counts something: an integer float32 holds exactly, else -1,
// so that a table lookup on a malformed header never converts NaN or 1e30 to int64.
static int64_t count_param(float x) {
  return x >= 0 && x < static_cast<float>(kExactF32) && x == std::floor(x)
             ? static_cast<int64_t>(x)
             : -1;
}

const CodecSpec kCodecs[] = {
    {kCodecFp32, "fp32", fp32_decode, fp32_decode_add,
     [](int64_t n, float, float) { return fp32_payload_words(n); }},
    {kCodecTopk, "topk", topk_decode, topk_decode_add,
     [](int64_t, float k, float filter_size) -> int64_t {
       const int64_t rows = count_param(k), row = count_param(filter_size);
       return rows < 0 || row < 0 ? -1 : topk_payload_words(rows, row);
     }},
    {kCodecTernary, "ternary", ternary_decode, ternary_decode_add,
     [](int64_t n, float, float) { return ternary_payload_words(n); }},
    {kCodecAdacomp, "adacomp", adacomp_decode, adacomp_decode_add,
     [](int64_t n, float, float count) -> int64_t {
       const int64_t entries = count_param(count);
       return entries < 0 ? -1 : adacomp_payload_words(n, entries);
     }},
    {kCodecElementTopk, "element_topk", element_topk_decode, element_topk_decode_add,
     [](int64_t n, float k, float) -> int64_t {
       const int64_t entries = count_param(k);
       return entries < 0 ? -1 : element_topk_payload_words(n, entries);
     }},
    {kCodecOuter, "outer", outer_decode, outer_decode_add,
     [](int64_t n, float k, float out) -> int64_t {
       const int64_t rows = count_param(k), cols = count_param(out);
       return rows < 0 || cols < 1 ? -1 : outer_payload_words(n, rows, cols);
     }},
};
const int kCodecCount = sizeof(kCodecs) / sizeof(kCodecs[0]);

const CodecSpec* find_codec(float id) {
  for (const CodecSpec& codec : kCodecs)
    if (codec.id == id) return &codec;
  return nullptr;
}

// Codec id and element count of a slot's header, before the codec's own full check.
static int slot_header(const float* slot, int64_t slot_words, float* codec, int64_t* n,
                       int64_t* payload_words) {
  if (slot_words < kHeaderWords) return kBadSize;
  const double low = slot[3], high = slot[4], body = slot[7];
  if (!(low >= 0 && low < static_cast<double>(kExactF32) && low == std::floor(low) &&
        high >= 0 && high < static_cast<double>(kExactF32) && high == std::floor(high) &&
        body >= 0 && body <= static_cast<double>(slot_words - kHeaderWords) &&
        body == std::floor(body)))
    return kBadSize;
  *codec = slot[1];
  *n = static_cast<int64_t>(low) + (static_cast<int64_t>(high) << kMantissaF32);
  *payload_words = kHeaderWords + static_cast<int64_t>(body);
  return kOk;
}

int decode_slots(const float* slots, int64_t workers, int64_t slot_words, float* acc,
                 int64_t capacity, float* status) {
  zero(acc, capacity);
  int first = kOk;
  float codec0 = 0.0f;
  int64_t n0 = -1;
  for (int64_t w = 0; w < workers; ++w) {
    const float* slot = slots + w * slot_words;
    float codec = 0.0f;
    int64_t n = 0, words = 0;
    // a void slot (first word NaN): the worker's gradient was non-finite; the sum is void
    int st = slot_words > 0 && std::isnan(slot[0]) ? kVoid
                                                   : slot_header(slot, slot_words, &codec, &n, &words);
    if (st == kOk && n0 < 0) {
      codec0 = codec;
      n0 = n;
    }
    if (st == kOk && (n > capacity || n < 1)) st = kBadSize;
    if (st == kOk && (codec != codec0 || n != n0)) st = kBadCodec;
    if (st == kOk) {
      const CodecSpec* spec = find_codec(codec);
      st = spec ? spec->decode_add(slot, words, n, acc) : kBadCodec;
    }
    status[w] = static_cast<float>(st);
    if (first == kOk) first = st;
  }
  if (first != kOk) std::fill(acc, acc + capacity, std::numeric_limits<float>::quiet_NaN());
  return first;
}

}  // namespace kvx
