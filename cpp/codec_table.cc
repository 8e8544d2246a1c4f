// The table of server-decoded codecs (rows registered by cpp/codecs/) and the servers'
// dispatch through it.
#include "codec_table.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernel_util.h"
#include "wire.h"

namespace kvx {

namespace {
constexpr int kMaxCodecs = 64;
// Zero-initialised before any constructor runs, so registration order does not matter.
CodecSpec g_codecs[kMaxCodecs];
int g_codec_count = 0;
}  // namespace

CodecRegistrar::CodecRegistrar(const CodecSpec& spec) {
  for (int i = 0; i < g_codec_count; ++i) {
    if (g_codecs[i].id == spec.id || std::strcmp(g_codecs[i].name, spec.name) == 0) {
      std::fprintf(stderr, "kvx: codecs '%s' and '%s' both claim id %g or a name\n",
                   g_codecs[i].name, spec.name, static_cast<double>(spec.id));
      std::abort();
    }
  }
  if (g_codec_count == kMaxCodecs) {
    std::fprintf(stderr, "kvx: more than %d codecs\n", kMaxCodecs);
    std::abort();
  }
  g_codecs[g_codec_count++] = spec;
}

int codec_count() { return g_codec_count; }
const CodecSpec& codec_at(int index) { return g_codecs[index]; }

const CodecSpec* find_codec(float id) {
  for (int i = 0; i < g_codec_count; ++i)
    if (g_codecs[i].id == id) return &g_codecs[i];
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
