// What the two W4A16 kernels share: their parameters, the math of one 64-K chunk of one 16-row
// weight tile, and the output store. gemm_w4a16.cu (128-row CTAs, split-K across CTAs) and
// gemm_w4a16_warpk.cu (one 16-row tile per CTA, K split across its warps) differ only in how
// operands reach registers and how partial sums meet.
#pragma once

#include "kernels.h"

namespace sm120 {

#ifdef SM120_W4A16_TIMELINE
// Diagnostics build only (lab/w4a16_timeline.cu, in git at ada4aec; never in the library): thread 0 of
// every CTA stamps the global timer at the milestones of a call, so the probe can say where a
// small call's microseconds go (first bytes, compute, split-K hand-off, reduction). One pointer
// per kernel file (static: no relocatable device code), set for both by w4a16_attach_stamps.
static __device__ W4A16Stamps* g_w4a16_stamps;  // null: no stamps
#define SM120_W4A16_STAMP(k)                                                                   \
  do {                                                                                         \
    if (g_w4a16_stamps != nullptr && threadIdx.x == 0) {                                       \
      unsigned long long now;                                                                  \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));                                  \
      W4A16Stamps& st = g_w4a16_stamps[blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)]; \
      st.t[k] = now;                                                                           \
      if ((k) == 0) asm volatile("mov.u32 %0, %%smid;" : "=r"(st.smid));                      \
    }                                                                                          \
  } while (0)
#else
#define SM120_W4A16_STAMP(k) ((void)0)
#endif
#ifdef SM120_W4A16_TIMELINE
cudaError_t w4a16_warpk_attach_stamps(W4A16Stamps* device_buffer);  // gemm_w4a16_warpk.cu's pointer
#endif

struct W4A16Params {
  const __nv_bfloat16* x;
  const uint8_t* qweight;
  const uint8_t* scales;
  const float* weight_scale_2;
  const __nv_bfloat16* bias;
  __nv_bfloat16* y;
  float* partial;
  int* tickets;
  int M, N, K;
  int n_chunks;
  int chunks_per_split;  // chunks per split (gemm_w4a16) or per warp (warp-K)
  int splits;
  int cluster_reduce;  // the splits of a tile are one cluster (gridDim.y == splits <= 8)
};

// A streamed weight or scale fragment: read once per call, so it does not displace L1 lines; a
// miss fills 256 bytes of L2 (as cp_async16 in common.cuh). Shared by the
// warp-K and the grouped MoE kernels, which stream weights straight into registers.
__device__ __forceinline__ uint4 ldg_stream128(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldg_stream64(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Lane (g = lane / 4, t = lane % 4) of a 16-row tile: which scale bytes it needs from the words of
// rows g and g+8 (K halves lo = block t/2 and hi = block 2 + t/2 -> [g_lo, g8_lo, g_hi, g8_hi]),
// and where those two words sit in the tile's 64 bytes of a 512-byte scale block.
__device__ __forceinline__ uint32_t w4a16_scale_select(int t) {
  const int tb = t >> 1;
  return tb | ((4 + tb) << 4) | ((2 + tb) << 8) | ((6 + tb) << 12);
}
__device__ __forceinline__ int w4a16_scale_offset(int g) { return (g & 3) * 16 + (g >> 2) * 8; }

// acc[mt] += one 64-K chunk: the lane's 16-byte packed weight fragment `wq` (rows g and g+8, both
// K halves), its two scale words `sc` (at w4a16_scale_offset) and the X fragments of M_TILES
// 8-token tiles (xl: K 8t..8t+7, xh: K 32+8t.., the MMA's K order being ours to choose as long as
// A and B agree). One MMA per 4 consecutive K of a K half: a0/a2 = pairs (2s, 2s+1) of row g's
// word, a1/a3 of row g+8's, times that half's block scale; its B pair is two adjacent words of one
// X load, so the MMA reads them in place.
template <int M_TILES>
__device__ __forceinline__ void w4a16_chunk_mma(float (&acc)[M_TILES][4], const uint4& wq, const uint2& sc,
                                                uint32_t scale_sel, const uint4 (&xl)[M_TILES],
                                                const uint4 (&xh)[M_TILES]) {
  uint32_t s_lo, s_hi;
  e4m3x4_to_bf16x2_x2p118(__byte_perm(sc.x, sc.y, scale_sel), s_lo, s_hi);
#define SM120_W4A16_STEP(DEC_A, DEC_B, W_G, W_G8, S, X, XA, XB)    \
  {                                                               \
    const uint32_t a0 = bf16x2_mul_lo(DEC_A(W_G), S);             \
    const uint32_t a1 = bf16x2_mul_hi(DEC_A(W_G8), S);            \
    const uint32_t a2 = bf16x2_mul_lo(DEC_B(W_G), S);             \
    const uint32_t a3 = bf16x2_mul_hi(DEC_B(W_G8), S);            \
    _Pragma("unroll") for (int mt = 0; mt < M_TILES; ++mt)        \
        mma_bf16_16816(acc[mt], a0, a1, a2, a3, X[mt].XA, X[mt].XB); \
  }
  SM120_W4A16_STEP(decode_pair0, decode_pair1, wq.x, wq.y, s_lo, xl, x, y)
  SM120_W4A16_STEP(decode_pair2, decode_pair3, wq.x, wq.y, s_lo, xl, z, w)
  SM120_W4A16_STEP(decode_pair0, decode_pair1, wq.z, wq.w, s_hi, xh, x, y)
  SM120_W4A16_STEP(decode_pair2, decode_pair3, wq.z, wq.w, s_hi, xh, z, w)
#undef SM120_W4A16_STEP
}

// The fp32 epilogue factor: weight_scale_2 * 2^8 (the MMA operands carry e2m1 * scale * 2^-8).
__device__ __forceinline__ float w4a16_alpha(const W4A16Params& p) {
  return __ldg(p.weight_scale_2) * 256.0f;
}

// Stores accumulator element e of M tile mt (lane g, t) of row tile `rt` in 128-row group `group`:
// y = v * alpha (+ bias), skipping rows >= N and tokens >= M.
__device__ __forceinline__ void w4a16_store(const W4A16Params& p, int group, int rt, int tok0, int g, int t,
                                            int mt, int e, float v, float alpha) {
  const int r = (e < 2) ? g : g + 8;
  const int tok = tok0 + mt * 8 + 2 * t + (e & 1);
  const int n = group * kGroupRows + tile_row_to_actual(rt, r);
  if (tok < p.M && n < p.N) {
    float out = v * alpha;
    if (p.bias != nullptr) out += __bfloat162float(p.bias[n]);
    p.y[(int64_t)tok * p.N + n] = __float2bfloat16_rn(out);
  }
}

// gemm_w4a16_warpk.cu's launcher (plan.warpk); launch_gemm_w4a16 calls it.
int launch_gemm_w4a16_warpk(const W4A16Params& p, const W4A16Plan& plan, bool pdl, cudaStream_t stream);

}  // namespace sm120
