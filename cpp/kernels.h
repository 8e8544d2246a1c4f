// Codec kernels of kvstore_ext: plain C++ on raw, contiguous arrays.
//
// No MXNet, no Python.  Every function is one job on typed pointers and element counts;
// the executable spec is python/kvx_ref/{wire,codecs}.py and every kernel reproduces it
// bit for bit (same float32 / float64 roundings, same summation order where a sum is
// rounded).  Encoders take `grad` and the worker's `residual` (updated in place) and form
// acc = grad + residual in float32.  Encoders and decoders return a Status; on any
// non-zero status the outputs are zero-filled and the residual / accumulator is left
// untouched, so a bad step or a malformed payload never propagates.
//
// `grad` and `residual` may alias (every element is read before it is written); outputs
// must not alias inputs.
//
// This header gathers the pieces, one file each: the wire format and status codes
// (wire.h), statistics (stats.h), one header per codec (codecs/), and the table of
// server-decoded codecs with the servers' decode_slots (codec_table.h).
#ifndef KVX_KERNELS_H_
#define KVX_KERNELS_H_

#include "codec_table.h"
#include "codecs/adacomp.h"
#include "codecs/element_topk.h"
#include "codecs/fp16.h"
#include "codecs/fp32.h"
#include "codecs/momentum.h"
#include "codecs/outer.h"
#include "codecs/powersgd.h"
#include "codecs/ternary.h"
#include "codecs/thc.h"
#include "codecs/topk.h"
#include "codecs/twobit.h"
#include "stats.h"
#include "wire.h"

#endif  // KVX_KERNELS_H_
