// Shared device helpers for the NVFP4 kernels. No torch headers anywhere in csrc/.
//
// Architecture guards: nvcc 13 defines __CUDA_ARCH_FAMILY_SPECIFIC__ for sm_90a too, so the FP4
// instructions (OMMA.SF, F2FP...E2M1) are guarded with __CUDA_ARCH_FEAT_SM120_ALL (sm_120a) or a
// family value >= 1200 (sm_120f). Everything else builds from one source for sm_90a and sm_120a.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#if defined(__CUDA_ARCH_FEAT_SM120_ALL) || \
    (defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1200)
#define SM120_HAS_FP4_MMA 1
#else
#define SM120_HAS_FP4_MMA 0
#endif

namespace sm120 {

// ------------------------------------------------------------------ error codes (C ABI)
enum Status : int {
  kOk = 0,
  kInvalidArgument = 1,
  kLaunchFailed = 2,
  kUnsupportedDevice = 3,
  kWorkspaceTooSmall = 4,
};

// ------------------------------------------------------------------ NVFP4 format constants
constexpr int kBlock = 16;          // elements per e4m3 block scale
constexpr int kChunkK = 64;         // K elements per MMA chunk (4 scale blocks)
constexpr int kGroupRows = 128;     // rows per 128x4 scale tile (and per packed weight group)
constexpr int kTileRows = 16;       // rows per packed weight tile (one MMA M dimension)

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int round_up(int a, int b) { return ceil_div(a, b) * b; }

// Byte offset of the scale of row m, scale column kb in the 128x4 swizzled layout.
__host__ __device__ inline int64_t swizzled_scale_offset(int m, int kb, int n_k_tiles) {
  return (int64_t)(m / 128) * (n_k_tiles * 512) + (int64_t)(kb / 4) * 512 + (m % 32) * 16 +
         ((m % 128) / 32) * 4 + (kb % 4);
}

// Packed weight tiles (see python/sglang/sm120/kernels/layout.py, the reference packer):
// a 16-row tile `rt` (0..7) of a 128-row group holds MMA row r (0..15) = actual row
//   32*a + 4*rt + b   with a = 2*((r>>2)&1) + (r>>3), b = r&3,
// so that the tile's 16 rows own the contiguous bytes [64*rt, 64*rt+64) of every 512-byte block
// of the swizzled scale layout, and rows r and r+8 own adjacent 32-bit scale words.
__host__ __device__ inline int tile_row_to_actual(int rt, int r) {
  const int a = 2 * ((r >> 2) & 1) + (r >> 3);
  const int b = r & 3;
  return 32 * a + 4 * rt + b;
}

// ------------------------------------------------------------------ e2m1 weight word encoding
// A packed weight word holds 8 e2m1 values (K offsets 0..7 of an 8-group), bit-permuted so that
// the bf16x2 pair p (values 2p, 2p+1) is one rotate+mask away (see decode_pair). Bits of value k:
//   {mantissa, exp0, exp1, sign} at kEncBits[k].
// The same word turns into the nibble order used by the W4A4 MMA ("P order", value k at nibble
// kPOrder[k]) with 4 rotate+mask terms (to_p_order).
// Keep in sync with layout.py (a CPU test checks both against each other).

// Pair p of a packed weight word as a bf16x2 whose halves equal e2m1 * 2^-126 (mantissa and exponent
// bits dropped into place; 0.5 lands on a bf16 subnormal, which HMUL2 handles exactly).
__device__ __forceinline__ uint32_t decode_pair0(uint32_t w) { return w & 0x81C081C0u; }
__device__ __forceinline__ uint32_t decode_pair1(uint32_t w) {
  return __funnelshift_r(w, w, 4) & 0x81C081C0u;
}
__device__ __forceinline__ uint32_t decode_pair2(uint32_t w) {
  return __funnelshift_r(w, w, 10) & 0x81C081C0u;
}
__device__ __forceinline__ uint32_t decode_pair3(uint32_t w) {
  return (__funnelshift_r(w, w, 6) & 0x81808180u) | (__funnelshift_r(w, w, 14) & 0x00400040u);
}

// Packed weight word -> plain e2m1 nibbles in P order (what the block-scaled MMA consumes).
__device__ __forceinline__ uint32_t to_p_order(uint32_t w) {
  return (w & 0x60076007u) | (__funnelshift_l(w, w, 24) & 0x18801880u) |
         (__funnelshift_l(w, w, 26) & 0x80088008u) | (__funnelshift_l(w, w, 30) & 0x07700770u);
}

// Nibble position of value k (0..7) in a P-order word. Activations quantized for the W4A4 GEMM use
// the same order, so both MMA operands agree on K inside every 8-value word.
__host__ __device__ constexpr int p_order_nibble(int k) {
  return k == 0 ? 1 : k == 1 ? 5 : k == 2 ? 2 : k == 3 ? 6 : k == 4 ? 4 : k == 5 ? 0 : k == 6 ? 3 : 7;
}

// Four e4m3 scales (bytes 0..3) -> two bf16x2: {byte0, byte1} and {byte2, byte3}, each equal to
// scale * 2^118 (exact). Zero maps to a nonzero constant: the packer zeroes the values of
// zero-scale blocks, so the product stays 0.
__device__ __forceinline__ void e4m3x4_to_bf16x2_x2p118(uint32_t four_bytes, uint32_t& lo,
                                                        uint32_t& hi) {
  uint32_t h0, h1;
  asm("{.reg .b16 l, h; mov.b32 {l, h}, %2; cvt.rn.f16x2.e4m3x2 %0, l; cvt.rn.f16x2.e4m3x2 %1, h;}"
      : "=r"(h0), "=r"(h1)
      : "r"(four_bytes));
  // f16 (bias 15, every e4m3 value is an f16 normal) -> bf16 (bias 127) * 2^118: move the exponent
  // and the 3 mantissa bits down by 3 and add (112 + 118) to each exponent field.
  lo = (h0 >> 3) + 0x73007300u;
  hi = (h1 >> 3) + 0x73007300u;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a),
                             *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t bf16x2_lo(uint32_t s) { return __byte_perm(s, 0, 0x1010); }
__device__ __forceinline__ uint32_t bf16x2_hi(uint32_t s) { return __byte_perm(s, 0, 0x3232); }
__device__ __forceinline__ uint32_t bf16x2_mul_lo(uint32_t a, uint32_t s) {
  __nv_bfloat162 sv = *reinterpret_cast<__nv_bfloat162*>(&s);
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), __low2bfloat162(sv));
  return *reinterpret_cast<uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t bf16x2_mul_hi(uint32_t a, uint32_t s) {
  __nv_bfloat162 sv = *reinterpret_cast<__nv_bfloat162*>(&s);
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), __high2bfloat162(sv));
  return *reinterpret_cast<uint32_t*>(&r);
}

// ------------------------------------------------------------------ MMA wrappers
// D += A(16x16 bf16, row) * B(16x8 bf16, col), fp32 accumulate. Present on SM80, SM90, SM120.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1,
                                               uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ------------------------------------------------------------------ memory helpers
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global->shared; bytes past src_bytes (0 or 16) are zero-filled.
// No L2 cache hint (createpolicy + .L2::cache_hint) on purpose: ptxas 13.0 (the toolkit of the
// build and GPU hosts) folds the shared-memory base and the policy into one uniform-register pair
// of LDGSTS and encodes that pair as UR0/UR1, registers the kernel never writes. The copy then
// runs with a garbage memory descriptor and the H200 stops the kernel with "illegal instruction"
// (ptxas 13.5 encodes the same instruction correctly). test_kernel_build.py rejects any SASS that
// reads a uniform register the kernel never writes.
// .L2::256B: a miss fills 256 bytes of L2, so the neighbouring lines of a streamed tile arrive with
// it instead of as separate misses; a prefetch size, not a cache hint, so the LDGSTS above encodes
// correctly (SASS-checked).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  cp_async16(smem_addr(dst), src, src_bytes);
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Device-scope atomic add with acquire-release semantics; returns the old value.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// ------------------------------------------------------------------ programmatic dependent launch
// With cudaLaunchAttributeProgrammaticStreamSerialization a grid may start while the previous
// kernel on the stream is still finishing. Before pdl_wait() a kernel may only read memory no
// earlier kernel writes (weights, scales); pdl_wait() returns once the previous grid has completed
// and its writes are visible. Without the attribute both are no-ops. SM90 and SM120 alike.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// Lets the next PDL-launched grid start its own prologue (it still waits for this grid's end
// before touching anything this grid writes).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ------------------------------------------------------------------ thread-block clusters (SM90+)
// Cluster barrier halves: every thread of every CTA of the cluster arrives once per phase and
// waits before arriving again. arrive (release) makes this thread's earlier shared-memory writes
// visible to the other CTAs after their wait (acquire); relaxed orders nothing (e.g. "this CTA
// has started", arrived at kernel entry).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
// Barrier over the CTAs of this cluster; shared-memory writes before it are visible to the other
// CTAs' distributed-shared-memory reads after it.
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}
// Shared-window address of the variable at `p` (this CTA's shared memory) in cluster CTA `rank`.
__device__ __forceinline__ uint32_t cluster_map_shared(const void* p, uint32_t rank) {
  uint32_t out = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(smem_addr(p)), "r"(rank));
#endif
  return out;
}
__device__ __forceinline__ float ld_shared_cluster_f32(uint32_t addr) {
  float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
#endif
  return v;
}

__device__ __forceinline__ void st_shared_cluster_f32(uint32_t addr, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
#endif
}

// Plain C++ shared-memory loads (not asm): the compiler may schedule them early, and it still
// orders them against __syncthreads() and the cp.async waits (which clobber "memory").
__device__ __forceinline__ uint4 lds128(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint2 lds64(const void* p) { return *reinterpret_cast<const uint2*>(p); }
__device__ __forceinline__ uint32_t lds32(const void* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

}  // namespace sm120
