// Activation quantization: bf16 [M, K] -> packed e2m1 [M, K/2] + e4m3 block scales in the 128x4
// swizzled layout. Bit-exact with python/sglang/sm120/nvfp4.py::quantize_nvfp4 (see its docstring
// for the exact arithmetic and the zero / NaN / Inf rules); every step below is the same IEEE fp32
// operation, so this file must never be compiled with fast-math.
#include "kernels.h"

namespace sm120 {
namespace {

// Software e2m1: round to nearest even, saturating at +-6, sign kept (-0 -> 0x8).
__device__ __forceinline__ uint32_t e2m1_soft(float q) {
  const float a = fabsf(q);
  uint32_t c = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
               (a >= 3.5f) + (a > 5.0f);
  return c | (signbit(q) ? 8u : 0u);
}

// Two values -> two codes (lo in bits 0-3, hi in bits 4-7).
__device__ __forceinline__ uint32_t e2m1x2(float lo, float hi) {
#if SM120_HAS_FP4_MMA
  uint32_t r;
  asm("{.reg .b8 t; cvt.rn.satfinite.e2m1x2.f32 t, %1, %2; cvt.u32.u8 %0, t;}"
      : "=r"(r)
      : "f"(hi), "f"(lo));
  return r;
#else
  return e2m1_soft(lo) | (e2m1_soft(hi) << 4);
#endif
}

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits16) {
  return __uint_as_float(bits16 << 16);
}

template <bool kPOrder>
__global__ void __launch_bounds__(256) quantize_nvfp4_kernel(
    const __nv_bfloat16* __restrict__ x, const float* __restrict__ global_scale,
    uint8_t* __restrict__ packed, uint8_t* __restrict__ scales, int M, int K, int kb_pad) {
  // One thread per (row, 16-element block) of the padded scale grid; 4 consecutive threads share
  // one 32-bit word of the swizzled layout. The grid is exact (Mpad*kb_pad is a multiple of 512).
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int m = (int)(idx / kb_pad);
  const int kb = (int)(idx % kb_pad);
  const int kblocks = K / kBlock;

  uint32_t sf_byte = 0;
  if (m < M && kb < kblocks) {
    const float gs = __ldg(global_scale);
    const uint4* src = reinterpret_cast<const uint4*>(x + (int64_t)m * K + kb * kBlock);
    const uint4 v0 = __ldg(src), v1 = __ldg(src + 1);
    const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    float f[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      f[2 * i] = bf16_bits_to_float(w[i] & 0xFFFFu);
      f[2 * i + 1] = bf16_bits_to_float(w[i] >> 16);
    }
    float amax = 0.0f;
    bool has_nan = false;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      has_nan |= isnan(f[i]);
      amax = fmaxf(amax, fabsf(f[i]));  // fmaxf ignores NaN; NaN blocks are handled below
    }
    const float s = (amax / 6.0f) * gs;
    const __nv_fp8_storage_t sf = __nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3);
    const float sf_f = __half2float(__half(__nv_cvt_fp8_to_halfraw(sf, __NV_E4M3)));
    const float inv = (sf_f == 0.0f) ? 0.0f : gs / sf_f;

    uint32_t lo = 0, hi = 0;  // codes of values 0..7 and 8..15
    if (!has_nan) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t c01 = e2m1x2(f[2 * i] * inv, f[2 * i + 1] * inv);
        const uint32_t c89 = e2m1x2(f[8 + 2 * i] * inv, f[8 + 2 * i + 1] * inv);
        if (kPOrder) {
          lo |= ((c01 & 0xF) << (4 * p_order_nibble(2 * i))) |
                ((c01 >> 4) << (4 * p_order_nibble(2 * i + 1)));
          hi |= ((c89 & 0xF) << (4 * p_order_nibble(2 * i))) |
                ((c89 >> 4) << (4 * p_order_nibble(2 * i + 1)));
        } else {
          lo |= c01 << (8 * i);
          hi |= c89 << (8 * i);
        }
      }
      sf_byte = sf;
    } else {
      sf_byte = 0x7Fu;  // e4m3 NaN: the whole block dequantizes to NaN
    }
    *reinterpret_cast<uint2*>(packed + (int64_t)m * (K / 2) + kb * 8) = make_uint2(lo, hi);
  }
  uint32_t word = sf_byte << (8 * (kb & 3));
  word |= __shfl_xor_sync(0xFFFFFFFFu, word, 1);
  word |= __shfl_xor_sync(0xFFFFFFFFu, word, 2);
  if ((kb & 3) == 0) {
    *reinterpret_cast<uint32_t*>(scales + swizzled_scale_offset(m, kb, kb_pad / 4)) = word;
  }
}

}  // namespace

int launch_quantize_nvfp4(const void* x, const float* global_scale, void* packed, void* scales,
                          int M, int K, bool p_order, cudaStream_t stream) {
  const int m_pad = round_up(M, kGroupRows);
  const int kb_pad = round_up(K / kBlock, 4);
  const int64_t threads = (int64_t)m_pad * kb_pad;  // multiple of 512
  const int block = 256;
  const int64_t grid = threads / block;
  if (grid > 0x7FFFFFFF) return set_error(kInvalidArgument, "quantize: M*K too large");
  auto* xp = static_cast<const __nv_bfloat16*>(x);
  auto* pp = static_cast<uint8_t*>(packed);
  auto* sp = static_cast<uint8_t*>(scales);
  if (p_order) {
    quantize_nvfp4_kernel<true><<<(unsigned)grid, block, 0, stream>>>(xp, global_scale, pp, sp, M,
                                                                       K, kb_pad);
  } else {
    quantize_nvfp4_kernel<false><<<(unsigned)grid, block, 0, stream>>>(xp, global_scale, pp, sp,
                                                                        M, K, kb_pad);
  }
  return check_launch("quantize_nvfp4");
}

}  // namespace sm120
