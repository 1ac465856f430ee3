// Large-M NVFP4 GEMM, W4A4: Y[M,N] = alpha * Xq . Wq^T (+ bias), with Xq quantized by
// quantize_nvfp4 (P nibble order, swizzled scales) and alpha = input_scale * weight_scale_2.
//
// One tile/pipeline for both builds; only the MMA unit differs:
//   * sm_120a: mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X
//              .f32.e2m1.e2m1.f32.ue4m3 (OMMA.SF) on the packed registers and scale words as loaded.
//   * emulation (sm_90a, or forced on sm_120a): the same registers and scale words, decoded to
//     bf16 (e2m1 * e4m3 is exact in bf16) and fed to 4 bf16 m16n8k16 MMAs, fp32 accumulate.
// Swap-AB: weights are the A operand (row tiles of the packed layout), tokens the N dimension.
// CTA: 8 warps, 128 weight rows x 128 tokens, K stage 64, 4 cp.async stages, 44 KB static smem.
#include "kernels.h"

namespace sm120 {
namespace {

constexpr int kThreads = 256;
constexpr int kStages = 4;
constexpr int kWBytes = 8 * 512;        // 8 row tiles x (16 rows x 64 K / 2)
constexpr int kWSBytes = 512;           // one 128x4 scale block
constexpr int kARowBytes = 48;          // 32 bytes of activations per token + 16 pad (ldmatrix)
constexpr int kABytes = 128 * kARowBytes;
constexpr int kASBytes = 512;
constexpr int kStageBytes = kWBytes + kWSBytes + kABytes + kASBytes;
constexpr int kOutStride = 136;         // bf16 elements per staged output row
static_assert(kStages * kStageBytes <= 46 * 1024, "W4A4 stages exceed 46 KB");
static_assert(128 * kOutStride * 2 <= kStages * kStageBytes, "output staging does not fit");

struct W4A4Params {
  const uint8_t* xq;
  const uint8_t* x_scales;
  const float* input_scale;
  const uint8_t* qweight;
  const uint8_t* w_scales;
  const float* weight_scale_2;
  const __nv_bfloat16* bias;
  __nv_bfloat16* y;
  int M, N, K;
  int n_chunks;
};

__device__ __forceinline__ float e4m3_to_float(uint32_t byte) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)(byte & 0xFF), __NV_E4M3)));
}

__device__ __forceinline__ float e2m1_to_float(uint32_t code) {
  const uint32_t c = code & 7;
  const uint32_t mag = c >= 2 ? ((((c >> 1) + 126u) << 23) | ((c & 1) << 22)) : (c ? (126u << 23) : 0u);
  return __uint_as_float(mag | ((code & 8u) << 28));
}

// Values 2j (low half) and 2j+1 (high half) of a P-order word, times `scale`, as bf16x2.
__device__ __forceinline__ uint32_t emu_pair(uint32_t word, int j, float scale) {
  const float lo = e2m1_to_float(word >> (4 * p_order_nibble(2 * j))) * scale;
  const float hi = e2m1_to_float(word >> (4 * p_order_nibble(2 * j + 1))) * scale;
  __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);  // exact: <= 5 significant bits
  return *reinterpret_cast<uint32_t*>(&r);
}

// Software block-scaled MMA, split in the pieces the tile loop hoists: B operands are decoded once
// per chunk and token tile, A operands once per row tile, then 4 bf16 m16n8k16 MMAs per
// m16n8k64. Scale words: sfa holds row g + 8*(lane&1) (the hardware layout), sfb token g; byte j
// is the scale of K 16j..16j+15 of the chunk, and a thread's K halves use blocks t/2 and 2 + t/2.
struct EmuB {
  uint32_t lo[4], hi[4];  // per MMA step j: K (8t+2j, +1) and (32+8t+2j, +1)
};
struct EmuA {
  uint32_t r[4][4];  // per step j: rows g / g+8 x K halves, as the m16n8k16 A fragment
};

__device__ __forceinline__ EmuB emu_decode_b(const uint32_t (&b)[2], uint32_t sfb) {
  const int lo = (((threadIdx.x & 3) >> 1) * 8), hi = lo + 16;
  const float s_lo = e4m3_to_float(sfb >> lo), s_hi = e4m3_to_float(sfb >> hi);
  EmuB out;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out.lo[j] = emu_pair(b[0], j, s_lo);
    out.hi[j] = emu_pair(b[1], j, s_hi);
  }
  return out;
}

__device__ __forceinline__ EmuA emu_decode_a(const uint32_t (&a)[4], uint32_t sfa) {
  const int lane = threadIdx.x & 31;
  const uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, sfa, 1);
  const uint32_t sa_g = (lane & 1) ? other : sfa;
  const uint32_t sa_g8 = (lane & 1) ? sfa : other;
  const int lo = ((lane & 3) >> 1) * 8, hi = lo + 16;
  const float g_lo = e4m3_to_float(sa_g >> lo), g_hi = e4m3_to_float(sa_g >> hi);
  const float g8_lo = e4m3_to_float(sa_g8 >> lo), g8_hi = e4m3_to_float(sa_g8 >> hi);
  EmuA out;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out.r[j][0] = emu_pair(a[0], j, g_lo);
    out.r[j][1] = emu_pair(a[1], j, g8_lo);
    out.r[j][2] = emu_pair(a[2], j, g_hi);
    out.r[j][3] = emu_pair(a[3], j, g8_hi);
  }
  return out;
}

__device__ __forceinline__ void mma_fp4_emulated(float (&d)[4], const EmuA& a, const EmuB& b) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    mma_bf16_16816(d, a.r[j][0], a.r[j][1], a.r[j][2], a.r[j][3], b.lo[j], b.hi[j]);
}

__device__ __forceinline__ void mma_fp4_hw(float (&d)[4], const uint32_t (&a)[4],
                                           const uint32_t (&b)[2], uint32_t sfa, uint32_t sfb) {
#if SM120_HAS_FP4_MMA
  const uint16_t zero = 0;
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1"
      ".f32.ue4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, {%10}, {%11,%12}, "
      "{%13}, {%14,%15};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(sfa), "h"(zero),
        "h"(zero), "r"(sfb), "h"(zero), "h"(zero));
#else
  __trap();
#endif
}

template <bool kHw>
__global__ void __launch_bounds__(kThreads) gemm_w4a4_kernel(const W4A4Params p) {
  if constexpr (kHw && !SM120_HAS_FP4_MMA) {
    __trap();  // the hardware variant is only launched on SM120 devices
  } else {
    __shared__ __align__(128) uint8_t smem[kStages * kStageBytes];
    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2;
    const int wr = warp & 1, wc = warp >> 1;  // row half (4 row tiles), token quarter (32)
    const int group = blockIdx.x;
    const int tok0 = blockIdx.y * 128;
    const int row_bytes = p.K / 2;

    auto load_stage = [&](int c, int buf) {
      uint8_t* base = smem + buf * kStageBytes;
      {  // weights: 8 row tiles x 32 lanes x 16 B
        const int rt = tid >> 5, ln = tid & 31;
        const int64_t tile = (int64_t)group * 8 + rt;
        cp_async16(base + rt * 512 + ln * 16, p.qweight + (tile * p.n_chunks + c) * 512 + ln * 16,
                   16);
      }
      if (tid < 32) {
        cp_async16(base + kWBytes + tid * 16,
                   p.w_scales + ((int64_t)group * p.n_chunks + c) * 512 + tid * 16, 16);
      } else if (tid < 64) {
        const int q = tid - 32;
        cp_async16(base + kWBytes + kWSBytes + kABytes + q * 16,
                   p.x_scales + ((int64_t)blockIdx.y * p.n_chunks + c) * 512 + q * 16, 16);
      }
      {  // activations: 128 tokens x 2 x 16 B
        const int r = tid >> 1, h = tid & 1;
        const int tok = tok0 + r;
        const bool ok = tok < p.M && c * kChunkK + h * 32 < p.K;
        const uint8_t* src = ok ? p.xq + (int64_t)tok * row_bytes + c * 32 + h * 16 : p.xq;
        cp_async16(base + kWBytes + kWSBytes + r * kARowBytes + h * 16, src, ok ? 16 : 0);
      }
    };

    float acc[4][4][4] = {};

    auto compute = [&](int buf) {
      const uint8_t* base = smem + buf * kStageBytes;
      const uint8_t* acts = base + kWBytes + kWSBytes;
      // A operand of row tile rt: packed e2m1 in the MMA's register order, plus its scale word.
      auto load_a = [&](int rt, uint32_t (&a)[4], uint32_t& sfa) {
        const uint4 wq = lds128(base + rt * 512 + lane * 16);
        a[0] = to_p_order(wq.x);
        a[1] = to_p_order(wq.y);
        a[2] = to_p_order(wq.z);
        a[3] = to_p_order(wq.w);
        sfa = lds32(base + kWBytes + rt * 64 + (g & 3) * 16 + (2 * (g >> 2) + (lane & 1)) * 4);
      };
      uint32_t b[4][2];
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {
        uint32_t r4[4];
        const int tok = 32 * wc + 8 * (2 * pr + (lane >> 4)) + (lane & 7);
        ldmatrix_x4(r4, acts + tok * kARowBytes + ((lane >> 3) & 1) * 16);
        b[2 * pr][0] = r4[0];
        b[2 * pr][1] = r4[1];
        b[2 * pr + 1][0] = r4[2];
        b[2 * pr + 1][1] = r4[3];
      }
      uint32_t sfb[4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) sfb[nt] = lds32(acts + kABytes + (8 * nt + g) * 16 + wc * 4);
      if constexpr (kHw) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint32_t a[4], sfa;
          load_a(4 * wr + i, a, sfa);
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) mma_fp4_hw(acc[i][nt], a, b[nt], sfa, sfb[nt]);
        }
      } else {
        EmuB bd[4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) bd[nt] = emu_decode_b(b[nt], sfb[nt]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint32_t a[4], sfa;
          load_a(4 * wr + i, a, sfa);
          const EmuA ad = emu_decode_a(a, sfa);
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) mma_fp4_emulated(acc[i][nt], ad, bd[nt]);
        }
      }
    };

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < p.n_chunks) load_stage(s, s);
      cp_async_commit();
    }
    for (int c = 0; c < p.n_chunks; ++c) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      const int next = c + kStages - 1;
      if (next < p.n_chunks) load_stage(next, next % kStages);
      cp_async_commit();
      compute(c % kStages);
    }
    cp_async_wait<0>();
    __syncthreads();

    // Epilogue: scale, bias, bf16, stage through shared memory, 16-byte coalesced stores.
    const float alpha = __ldg(p.input_scale) * __ldg(p.weight_scale_2);
    __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(smem);
    const int t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e < 2 ? g : g + 8;
          const int n_local = tile_row_to_actual(4 * wr + i, r);
          const int tok_local = 32 * wc + 8 * nt + 2 * t + (e & 1);
          const int n = group * kGroupRows + n_local;
          float v = acc[i][nt][e] * alpha;
          if (p.bias != nullptr && n < p.N) v += __bfloat162float(p.bias[n]);
          out[tok_local * kOutStride + n_local] = __float2bfloat16_rn(v);
        }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = tid + j * kThreads;
      const int r = i >> 4, u = i & 15;
      const int tok = tok0 + r;
      const int n = group * kGroupRows + u * 8;
      if (tok < p.M && n < p.N) {
        *reinterpret_cast<uint4*>(p.y + (int64_t)tok * p.N + n) =
            *reinterpret_cast<const uint4*>(out + r * kOutStride + u * 8);
      }
    }
  }
}

}  // namespace

int launch_gemm_w4a4(const void* xq, const void* x_scales, const float* input_scale,
                     const void* qweight, const void* w_scales, const float* weight_scale_2,
                     const void* bias, void* y, int M, int N, int K, bool hardware_mma,
                     cudaStream_t stream) {
  W4A4Params p{};
  p.xq = static_cast<const uint8_t*>(xq);
  p.x_scales = static_cast<const uint8_t*>(x_scales);
  p.input_scale = input_scale;
  p.qweight = static_cast<const uint8_t*>(qweight);
  p.w_scales = static_cast<const uint8_t*>(w_scales);
  p.weight_scale_2 = weight_scale_2;
  p.bias = static_cast<const __nv_bfloat16*>(bias);
  p.y = static_cast<__nv_bfloat16*>(y);
  p.M = M;
  p.N = N;
  p.K = K;
  p.n_chunks = ceil_div(K, kChunkK);
  const dim3 grid(round_up(N, kGroupRows) / kGroupRows, ceil_div(M, 128));
  if (grid.y > 65535) return set_error(kInvalidArgument, "gemm_w4a4: M=%d too large", M);
  if (hardware_mma) {
    gemm_w4a4_kernel<true><<<grid, kThreads, 0, stream>>>(p);
  } else {
    gemm_w4a4_kernel<false><<<grid, kThreads, 0, stream>>>(p);
  }
  return check_launch(hardware_mma ? "gemm_w4a4(sm120 mma)" : "gemm_w4a4(emulated)");
}

}  // namespace sm120
