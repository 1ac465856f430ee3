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
#ifndef SM120_W4A16_ROWS_BATCH
#define SM120_W4A16_ROWS_BATCH 4
#endif
constexpr int kRowsBatch = SM120_W4A16_ROWS_BATCH;

// TPW: 16-row tiles per warp (1: 8 warps, 2: 4 warps; the same bits). PDL: the instantiation for
// programmatic dependent launches (it prefetches its first batches to L2 ahead of the wait).
template <int M_TILES, int TPW, bool PDL>
__global__ void __launch_bounds__(32 * 8 / TPW) gemm_w4a16_rows_kernel(const W4A16Params p) {
  // X block: row r (token tok0 + r) at r * row_bytes; in each 128-byte chunk the 16-byte unit u
  // sits at u ^ ((r & 1) << 2) (conflict-free LDS.128 for the lanes' rows g and units t, 4 + t).
  extern __shared__ __align__(128) uint8_t xs[];
  constexpr int kWarps = 8 / TPW, kThreads = 32 * kWarps;
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int group = blockIdx.x;
  const int tok0 = blockIdx.z * 8 * M_TILES;
  const int n = p.n_chunks;
  const int row_bytes = n * 128;

  const uint8_t* w_src[TPW];
  const uint8_t* s_src[TPW];
#pragma unroll
  for (int i = 0; i < TPW; ++i) {
    const int rt = warp * TPW + i;
    w_src[i] = p.qweight + (int64_t)(group * 8 + rt) * n * 512 + lane * 16;
    s_src[i] = p.scales + (int64_t)group * n * 512 + rt * 64 + w4a16_scale_offset(g);
  }
  uint4 wa[kRowsBatch][TPW], wb[kRowsBatch][TPW];
  uint2 sa[kRowsBatch][TPW], sb[kRowsBatch][TPW];
  auto load = [&](uint4 (&wq)[kRowsBatch][TPW], uint2 (&sc)[kRowsBatch][TPW], int c0) {
#pragma unroll
    for (int u = 0; u < kRowsBatch; ++u)
      if (c0 + u < n)
#pragma unroll
        for (int i = 0; i < TPW; ++i) {
          wq[u][i] = ldg_stream128(w_src[i] + (int64_t)(c0 + u) * 512);
          sc[u][i] = ldg_stream64(s_src[i] + (int64_t)(c0 + u) * 512);
        }
  };
  // Under PDL, ptxas 13.0 may put the wait ahead of register loads (see the warp-K kernel), so the
  // PDL instantiation asks L2 for its first two batches first: one prefetch per 128-byte line of
  // a weight chunk (lanes 0, 8, 16, 24), one for the tile's 64 scale bytes (lane 0).
  if constexpr (PDL) {
#pragma unroll
    for (int u = 0; u < 2 * kRowsBatch; ++u)
      if (u < n && (lane & 7) == 0)
#pragma unroll
        for (int i = 0; i < TPW; ++i) {
          prefetch_l2(w_src[i] + (int64_t)u * 512);
          if (lane == 0) prefetch_l2(s_src[i] + (int64_t)u * 512);
        }
  }
  load(wa, sa, 0);
  load(wb, sb, kRowsBatch);
  const float alpha = w4a16_alpha(p);  // needed by the store only; requested early (see gemm_w4a16.cu)

  // X after the wait (the previous kernel writes it). Only the rows of real tokens: an MMA column
  // (token) depends on its own X row alone, and the store skips tokens >= M, so rows past M may
  // hold anything. K past p.K (the last chunk's padding, where the weights are zero) is zero-filled.
  pdl_wait();
  {
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
    cp_async_wait<0>();
    __syncthreads();
  }

  float acc[TPW][M_TILES][4] = {};
  const uint32_t scale_sel = w4a16_scale_select(t);
  const int swz = (g & 1) << 2;
  const uint8_t* xl0 = xs + g * row_bytes + (t ^ swz) * 16;
  const uint8_t* xh0 = xs + g * row_bytes + ((4 + t) ^ swz) * 16;
  auto compute = [&](const uint4 (&wq)[kRowsBatch][TPW], const uint2 (&sc)[kRowsBatch][TPW], int c0) {
#pragma unroll
    for (int u = 0; u < kRowsBatch; ++u)
      if (c0 + u < n) {
        uint4 xl[M_TILES], xh[M_TILES];
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {  // row mt * 8 + g has g's parity
          xl[mt] = lds128(xl0 + mt * 8 * row_bytes + (c0 + u) * 128);
          xh[mt] = lds128(xh0 + mt * 8 * row_bytes + (c0 + u) * 128);
        }
#pragma unroll
        for (int i = 0; i < TPW; ++i) w4a16_chunk_mma<M_TILES>(acc[i], wq[u][i], sc[u][i], scale_sel, xl, xh);
      }
  };
  for (int c0 = 0; c0 < n; c0 += 2 * kRowsBatch) {
    compute(wa, sa, c0);
    load(wa, sa, c0 + 2 * kRowsBatch);
    compute(wb, sb, c0 + kRowsBatch);
    load(wb, sb, c0 + 3 * kRowsBatch);
  }
  // Every load of this grid is issued; the next grid may start prefetching its own weights.
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
  const size_t smem = w4a16_rows_x_bytes(plan.m_tiles, p.n_chunks);
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
