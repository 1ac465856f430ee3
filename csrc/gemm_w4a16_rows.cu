// Small-M NVFP4 W4A16 GEMM, row-stream kernel: Y[M,N] = X[M,K] . dequant(W)^T (+ bias), M <= 16,
// for projections whose 128-row tiles fill the SMs unsplit and whose X block fits in shared memory.
// A CTA owns one 128-row scale group, as gemm_w4a16.cu's does, but each warp streams the whole K of
// its own 16-row tile(s) from global memory straight into registers (two batches of kRowsBatch
// chunks in flight, ping-pong), and X, the same for every warp, is copied into shared memory once,
// whole. The K loop then has no barrier, no cp.async bookkeeping and no buffer ring: per chunk,
// the (weight, scale) loads and the chunk math of w4a16.cuh.
//
// Why a third kernel: glm5 q_b TP 1 (N 16384, K 2048: 128 unsplit 128-row CTAs, one per SM) runs
// the split-K kernel's loop with one warp per scheduler, and that loop is issue-bound: of ~365
// instructions per warp and stage, ~100 are copies, their addresses, the stage barrier and the
// ring (ncu source view, session 15); the chunk math is the rest. Chunks meet every accumulator in
// K order, as in the split-K kernel unsplit, so both give the same bits.
#include "w4a16.cuh"

namespace sm120 {
namespace {

// Chunks per register batch; two batches are in flight per warp (36 KB per SM at 8 warps x 1 tile
// or 4 x 2, about what the split-K kernel's 3 pipeline stages hold).
#ifndef SM120_W4A16_ROWS_RING
#define SM120_W4A16_ROWS_RING 8
#endif
#ifndef SM120_W4A16_ROWS_BATCH
#define SM120_W4A16_ROWS_BATCH 4
#endif
constexpr int kRowsBatch = SM120_W4A16_ROWS_BATCH;

// TPW: 16-row tiles per warp (1: 8 warps, 2: 4 warps; the same bits). PDL: the instantiation for
// programmatic dependent launches (it prefetches its first batches to L2 ahead of the wait).

constexpr int kRowsRing = SM120_W4A16_ROWS_RING;
template <int TPW>
__host__ __device__ constexpr int rows_slot_bytes() { return TPW * (512 + 64); }
__host__ __device__ constexpr int rows_ring_bytes(int tpw) { return (8 / tpw) * kRowsRing * tpw * (512 + 64); }

template <int M_TILES, int TPW, bool PDL>
__global__ void __launch_bounds__(32 * 8 / TPW) gemm_w4a16_rows_kernel(const W4A16Params p) {
  extern __shared__ __align__(128) uint8_t xs[];
  constexpr int kWarps = 8 / TPW, kThreads = 32 * kWarps;
  constexpr int kSlot = rows_slot_bytes<TPW>();
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int group = blockIdx.x;
  const int tok0 = blockIdx.z * 8 * M_TILES;
  const int n = p.n_chunks;
  const int row_bytes = n * 128;
  const int x_bytes = M_TILES * n * 1024;
  // this warp's ring of kRowsRing chunk slots: [TPW][512 B weights] then [TPW][64 B scales]
  const uint32_t ring = smem_addr(xs) + x_bytes + warp * kRowsRing * kSlot;
  const uint8_t* ring_p = xs + x_bytes + warp * kRowsRing * kSlot;

  const uint8_t* w_src[TPW];
#pragma unroll
  for (int i = 0; i < TPW; ++i) w_src[i] = p.qweight + (int64_t)(group * 8 + warp * TPW + i) * n * 512 + lane * 16;
  // scales of this warp's TPW tiles: TPW * 64 contiguous bytes per chunk, lanes < 4 * TPW copy 16 each
  const bool s_lane = lane < 4 * TPW;
  const uint8_t* s_src = p.scales + (int64_t)group * n * 512 + warp * TPW * 64 + (s_lane ? lane : 0) * 16;
  auto issue = [&](int c, int slot) {
    const bool ok = c < n;
    const uint32_t dst = ring + slot * kSlot;
#pragma unroll
    for (int i = 0; i < TPW; ++i)
      cp_async16(dst + i * 512 + lane * 16, ok ? w_src[i] + (int64_t)c * 512 : p.qweight, ok ? 16 : 0);
    if (s_lane) cp_async16(dst + TPW * 512 + lane * 16, ok ? s_src + (int64_t)c * 512 : p.scales, ok ? 16 : 0);
    cp_async_commit();
  };
  if constexpr (PDL) {  // the first chunks to L2 ahead of the wait (ptxas hoists the wait over copies)
#pragma unroll
    for (int s = 0; s < kRowsRing - 1; ++s)
      if (s < n && (lane & 7) == 0) {
#pragma unroll
        for (int i = 0; i < TPW; ++i) prefetch_l2(w_src[i] + (int64_t)s * 512);
        if (lane == 0) prefetch_l2(s_src + (int64_t)s * 512);
      }
  }
  const float alpha = w4a16_alpha(p);
  pdl_wait();
  {  // commit group 0: X (rows of real tokens; K past p.K zero-filled)
    const uint32_t xs_s = smem_addr(xs);
    const int rows = min(8 * M_TILES, p.M - tok0);
    for (int r = 0; r < rows; ++r) {
      const __nv_bfloat16* src = p.x + (int64_t)(tok0 + r) * p.K;
      const int flip = (r & 1) << 2;
      for (int u = tid; u < n * 8; u += kThreads) {
        const bool ok = u * 8 < p.K;
        cp_async16(xs_s + r * row_bytes + (u ^ flip) * 16, ok ? src + u * 8 : p.x, ok ? 16 : 0);
      }
    }
    cp_async_commit();
  }
#pragma unroll
  for (int s = 0; s < kRowsRing - 1; ++s) issue(s, s);  // groups 1..R-1: chunks 0..R-2
  cp_async_wait<kRowsRing - 1>();  // group 0 (X) is in
  __syncthreads();

  float acc[TPW][M_TILES][4] = {};
  const uint32_t scale_sel = w4a16_scale_select(t);
  const int swz = (g & 1) << 2;
  const uint8_t* xl0 = xs + g * row_bytes + (t ^ swz) * 16;
  const uint8_t* xh0 = xs + g * row_bytes + ((4 + t) ^ swz) * 16;
  const int s_off = TPW * 512 + w4a16_scale_offset(g);
  // Unrolled by the ring length, so every slot address is a constant offset.
  for (int c0 = 0; c0 < n; c0 += kRowsRing) {
    const uint8_t* xl_c = xl0 + c0 * 128;
    const uint8_t* xh_c = xh0 + c0 * 128;
#pragma unroll
    for (int u = 0; u < kRowsRing; ++u) {
      if (c0 + u >= n) break;
      cp_async_wait<kRowsRing - 2>();
      __syncwarp();
      uint4 wq[TPW];
      uint2 sc[TPW];
      const uint8_t* slot = ring_p + u * kSlot;
#pragma unroll
      for (int i = 0; i < TPW; ++i) {
        wq[i] = lds128(slot + i * 512 + lane * 16);
        sc[i] = lds64(slot + s_off + i * 64);
      }
      __syncwarp();  // every lane has read the slot the next copy refills (the one before this)
      issue(c0 + u + kRowsRing - 1, (u + kRowsRing - 1) % kRowsRing);
      uint4 xl[M_TILES], xh[M_TILES];
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) {
        xl[mt] = lds128(xl_c + mt * 8 * row_bytes + u * 128);
        xh[mt] = lds128(xh_c + mt * 8 * row_bytes + u * 128);
      }
#pragma unroll
      for (int i = 0; i < TPW; ++i) w4a16_chunk_mma<M_TILES>(acc[i], wq[i], sc[i], scale_sel, xl, xh);
    }
  }
  cp_async_wait<0>();
  pdl_launch_dependents();
#pragma unroll
  for (int i = 0; i < TPW; ++i)
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) w4a16_store(p, group, warp * TPW + i, tok0, g, t, mt, e, acc[i][mt][e], alpha);
}

template <int M_TILES, int TPW>
cudaError_t launch_rows(const W4A16Params& p, const W4A16Plan& plan, bool pdl, cudaStream_t stream) {
  auto kernel = pdl ? gemm_w4a16_rows_kernel<M_TILES, TPW, true> : gemm_w4a16_rows_kernel<M_TILES, TPW, false>;
  const size_t smem = w4a16_rows_x_bytes(plan.m_tiles, p.n_chunks) + rows_ring_bytes(TPW);
  // Past 48 KB the kernel must opt in, per device; cheap, not a stream operation (graph-capturable).
  if (smem > (48u << 10)) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(plan.n_ctas, 1, plan.m_blocks), block(32 * 8 / TPW);
  return launch_kernel_smem(kernel, grid, block, smem, stream, pdl, 1u, p);
}

}  // namespace

int launch_gemm_w4a16_rows(const W4A16Params& p, const W4A16Plan& plan, bool pdl, cudaStream_t stream) {
  const cudaError_t err = plan.eight_warps ? (plan.m_tiles == 1 ? launch_rows<1, 1>(p, plan, pdl, stream)
                                                                : launch_rows<2, 1>(p, plan, pdl, stream))
                                           : (plan.m_tiles == 1 ? launch_rows<1, 2>(p, plan, pdl, stream)
                                                                : launch_rows<2, 2>(p, plan, pdl, stream));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // the same error is pending there: do not report it twice
    return set_error(kLaunchFailed, "gemm_w4a16 (row-stream): launch failed (pdl=%d, m_tiles=%d, warps=%d): %s",
                     pdl ? 1 : 0, plan.m_tiles, plan.eight_warps ? 8 : 4, cudaGetErrorString(err));
  }
  return check_launch("gemm_w4a16_rows");
}

}  // namespace sm120
