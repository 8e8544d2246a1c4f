/* C interface of kvstore_ext's codec kernels, for ctypes (benchmarks, and a fallback on
 * servers that cannot run the MXNet operators).
 *
 * Every array is contiguous; sizes are element counts (int64).  Each function returns a
 * status: 0 ok, 1 non-finite input, 2..8 malformed payload or parameter (see
 * python/kvx_ref/wire.py), -1 internal error (out of memory).  On a non-zero status the
 * outputs are zero-filled and residuals / accumulators are left untouched.
 */
#ifndef KVX_CAPI_H_
#define KVX_CAPI_H_

#include <stdint.h>

#ifdef __cplusplus
#define KVX_EXTERN_C extern "C"
#else
#define KVX_EXTERN_C
#endif
#define KVX_API KVX_EXTERN_C __attribute__((visibility("default")))

/* 2: homomorphic ternary words are float32 (were float64 in 1). */
#define KVX_ABI_VERSION 2

/* ---- the tables behind the wire format (cpp/wire.h, cpp/codec_table.h) ----
 * Python reads or checks its constants against these (tests/test_cpp_ops.py). */
KVX_API int kvx_abi_version(void);
KVX_API float kvx_header_magic(void);
KVX_API float kvx_header_version(void);
KVX_API int64_t kvx_header_words(void);
/* Status codes are 0 .. kvx_status_count() - 1: the message, and the name in
 * python/kvx_ref/wire.py (NULL out of range). */
KVX_API int kvx_status_count(void);
KVX_API const char* kvx_status_name(int status);
KVX_API const char* kvx_status_symbol(int status);
/* Server-decoded codecs, index 0 .. kvx_codec_count() - 1: header codec id (-1 out of
 * range), name (NULL), payload words for n elements and header parameters a, b (-1). */
KVX_API int kvx_codec_count(void);
KVX_API int kvx_codec_id(int index);
KVX_API const char* kvx_codec_name(int index);
KVX_API int64_t kvx_codec_payload_words(int index, int64_t n, float a, float b);

/* ---- sizes ---- */
KVX_API int64_t kvx_fp32_payload_words(int64_t n);
KVX_API int64_t kvx_topk_payload_words(int64_t k, int64_t filter_size);
KVX_API int64_t kvx_ternary_payload_words(int64_t n);
/* 0 if num_workers is out of range [1, 2^20]. */
KVX_API int64_t kvx_ternary_sum_words(int64_t n, int64_t num_workers);
KVX_API int64_t kvx_twobit_words(int64_t n);

/* 1 if x holds a NaN or Inf, else 0. */
KVX_API int kvx_finite_check(const float* x, int64_t n);
/* scores[filters]: squared L2 norm of each row, float64, NumPy's summation order. */
KVX_API int kvx_filter_scores(const float* x, int64_t filters, int64_t filter_size,
                              double* scores);

/* ---- fp32 pass-through ---- */
KVX_API int kvx_fp32_encode(const float* grad, int64_t n, float* payload);
KVX_API int kvx_fp32_decode(const float* payload, int64_t payload_words, int64_t n,
                            float* out);
KVX_API int kvx_fp32_decode_add(const float* payload, int64_t payload_words, int64_t n,
                                float* acc);

/* ---- conv filter selection (top-k) ---- */
KVX_API int kvx_topk_encode(const float* grad, float* residual, int64_t filters,
                            int64_t filter_size, int64_t k, float* payload);
KVX_API int kvx_topk_decode(const float* payload, int64_t payload_words, int64_t n,
                            float* out);
KVX_API int kvx_topk_decode_add(const float* payload, int64_t payload_words, int64_t n,
                                float* acc);
KVX_API int kvx_topk_gather(const float* grad, float* residual, int64_t filters,
                            int64_t filter_size, const float* indices, int64_t k,
                            float* values);
KVX_API int kvx_topk_scatter(const float* values, const float* indices, int64_t k,
                             int64_t filters, int64_t filter_size, float* out);

/* ---- ternary (Hylo FC) ---- */
KVX_API int kvx_ternary_encode(const float* grad, float* residual, int64_t n, double scale,
                               double threshold, float* payload);
KVX_API int kvx_ternary_decode(const float* payload, int64_t payload_words, int64_t n,
                               float* out);
KVX_API int kvx_ternary_decode_add(const float* payload, int64_t payload_words, int64_t n,
                                   float* acc);
/* Homomorphic: float32 words, ceil(n / D) of them (kvx_ternary_sum_words). */
KVX_API int kvx_ternary_encode_sum(const float* grad, float* residual, int64_t n,
                                   double threshold, int64_t num_workers, float* words);
KVX_API int kvx_ternary_decode_sum(const float* words, int64_t num_words, double threshold,
                                   int64_t num_workers, int64_t n, float* out);

/* ---- MXNet's 2-bit layout ---- */
KVX_API int kvx_twobit_encode(const float* grad, float* residual, int64_t n,
                              double threshold, uint32_t* words);
KVX_API int kvx_twobit_decode(const uint32_t* words, int64_t n, double threshold,
                              float* out);

/* ---- dAD's captured rows (cpp/ops/dad.cc, kvstore_ext/dad.py) ----
 * kvx_dad_capture's backward appends (A, D) rows to its layer's pending rows.
 * kvx_dad_pending: their count, and the widths of A and D.  kvx_dad_copy: the first
 * `rows` of them into a (rows x in) and d (rows x out), removed if `take` (rows added
 * since stay); kBadParam if fewer are pending.  kvx_dad_forget drops a layer's rows. */
KVX_API int64_t kvx_dad_pending(int64_t layer, int64_t* in, int64_t* out);
KVX_API int kvx_dad_copy(int64_t layer, int64_t rows, int take, float* a, float* d);
KVX_API void kvx_dad_forget(int64_t layer);

#endif /* KVX_CAPI_H_ */
