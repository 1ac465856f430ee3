// Small-M NVFP4 W4A16 GEMM for few output rows: Y[M,N] = X[M,K] . dequant(W)^T (+ bias), M <= 16.
// One CTA per 16-row weight tile and token block; its 8 or 16 warps split K, each streaming its
// slice of the tile straight into registers (no shared-memory staging), and the partial sums meet
// in shared memory, summed in warp order (deterministic). Where the tiles are too few to fill the
// SMs and K is long, 2..4 CTAs split a tile's K as one thread-block cluster: the other ranks store
// their sums into rank 0's shared memory (DSMEM) and rank 0 adds them in rank order.
//
// Why a second kernel: gemm_w4a16.cu's CTA owns 128 rows, so a projection with few rows (N = 512
// .. 1280 at TP 4/8) has 4-10 CTAs along N and must split K across CTAs to reach the SMs. On the
// H200 the hand-off of those splits (partials through L2, a release/acquire ticket, the last CTA
// loading them back) takes about half of such a call at M = 1 (e.g. qwen3 qkv TP 8), more than the
// weights take to arrive. Here a 16-row tile is its own CTA (40 CTAs for N = 640 instead
// of 5) and K splits inside the CTA, where partials meet through shared memory behind one barrier.
// The chunk math (decode, scale, MMA) and the store are gemm_w4a16.cu's (w4a16.cuh); the plan
// (plan_w4a16) decides which kernel runs.
#include "w4a16.cuh"

namespace sm120 {
namespace {

// Asks L2 for the 128-byte line at p (no register result, so ptxas keeps it where it is written;
// a load's result would be scheduled after griddepcontrol.wait).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
// Activations are written by the previous kernel, which under PDL may still be running when this
// grid starts: read them at L2 (.cg), never through the non-coherent path, and only after
// pdl_wait(). asm volatile keeps them after the wait.
__device__ __forceinline__ uint4 ldg_l2_128(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// Chunks a warp loads before computing them: 4 keeps 4 x 16 B of weights (plus scales and X) in
// flight per thread, at 92-128 registers without spilling. One batch size for every
// instantiation: a deeper batch (6) helps some shapes and slows others, with no net gain.
constexpr int kWarpKBatch = 4;

// PDL: the instantiation for programmatic dependent launches (it prefetches its first batch).
template <int M_TILES, int WARPS, bool PDL>
__global__ void __launch_bounds__(32 * WARPS) gemm_w4a16_warpk_kernel(const W4A16Params p) {
  __shared__ float part[WARPS][M_TILES * 4][32];
  // Cluster plans: the other ranks' sums, written into rank 0's copy (peer[rank - 1]).
  __shared__ float peer[kW4A16WarpKMaxClusterWarps / 8 - 1][M_TILES * 4][32];
  SM120_W4A16_STAMP(0);
  // Phase 1 of the cluster barrier: "this CTA has started" (so its shared memory exists before a
  // peer writes into it); waited for only after the loads, by when every CTA has long arrived.
  if (p.splits > 1) cluster_arrive_relaxed();
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x;  // 16-row tile of the packed weight: group tile / 8, row tile tile % 8
  const int group = tile >> 3, rt = tile & 7;
  const int tok0 = blockIdx.z * 8 * M_TILES;
  // This CTA's K slice (split blockIdx.y of a cluster, or all of K), then this warp's part of it.
  const int c_cta = blockIdx.y * p.chunks_per_split;
  const int c_cta_end = min(c_cta + p.chunks_per_split, p.n_chunks);
  const int per_warp = ceil_div(p.chunks_per_split, WARPS);
  const int c_begin = min(c_cta + warp * per_warp, c_cta_end);
  const int c_end = min(c_begin + per_warp, c_cta_end);

  const uint8_t* w_src = p.qweight + (int64_t)tile * p.n_chunks * 512 + lane * 16;
  const uint8_t* s_src = p.scales + (int64_t)group * p.n_chunks * 512 + rt * 64 + w4a16_scale_offset(g);
  const __nv_bfloat16* x_src[M_TILES];
  bool x_ok[M_TILES];
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt) {
    const int tok = tok0 + mt * 8 + g;
    x_ok[mt] = tok < p.M;
    x_src[mt] = p.x + (int64_t)(x_ok[mt] ? tok : 0) * p.K + 8 * t;
  }
  const uint32_t scale_sel = w4a16_scale_select(t);
  // Needed only by the store; the plain instantiation requests it now, so its latency is not the
  // call's last wait. Under PDL the call's start overlaps the previous one anyway, and the early
  // load does not pay there: load it late.
  const float alpha_early = PDL ? 0.0f : w4a16_alpha(p);

  uint4 wq[kWarpKBatch];
  uint2 sc[kWarpKBatch];
  auto load_weights = [&](int c0) {
#pragma unroll
    for (int u = 0; u < kWarpKBatch; ++u)
      if (c0 + u < c_end) {
        wq[u] = ldg_stream128(w_src + (int64_t)(c0 + u) * 512);
        sc[u] = ldg_stream64(s_src + (int64_t)(c0 + u) * 512);
      }
  };

  float acc[M_TILES][4] = {};
  // Every warp waits, even one without chunks, before anything reads X or writes Y. ptxas 13.0
  // puts the wait (ACQBULK) ahead of the first batch's loads in the plain instantiation, so under
  // PDL those loads would not overlap the previous kernel's tail (the split-K kernel's cp.async
  // copies do). The PDL instantiation prefetches the batch to L2 first, one prefetch per 128-byte
  // line of the weight chunks (lanes 0, 8, 16, 24) and one for the tile's 64 scale bytes (lane 0);
  // the prefetches and the batch's loads then stay ahead of the wait (SASS, checked by
  // test_kernel_build.py). The prefetch speeds up PDL launches but slows plain ones (nothing to
  // overlap there), hence two instantiations.
  if constexpr (PDL) {
#pragma unroll
    for (int u = 0; u < kWarpKBatch; ++u)
      if (c_begin + u < c_end && (lane & 7) == 0) {
        prefetch_l2(w_src + (int64_t)(c_begin + u) * 512);
        if (lane == 0) prefetch_l2(s_src + (int64_t)(c_begin + u) * 512);
      }
  }
  load_weights(c_begin);
  pdl_wait();
  for (int c0 = c_begin; c0 < c_end; c0 += kWarpKBatch) {
    if (c0 != c_begin) load_weights(c0);
    uint4 xl[kWarpKBatch][M_TILES], xh[kWarpKBatch][M_TILES];
#pragma unroll
    for (int u = 0; u < kWarpKBatch; ++u)
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) {
        const int k = (c0 + u) * kChunkK + 8 * t;  // xl at k, xh at k + 32 (16-byte units: K % 8 == 0)
        const bool in = x_ok[mt] && c0 + u < c_end;
        xl[u][mt] = in && k < p.K ? ldg_l2_128(x_src[mt] + (c0 + u) * kChunkK) : make_uint4(0, 0, 0, 0);
        xh[u][mt] = in && k + 32 < p.K ? ldg_l2_128(x_src[mt] + (c0 + u) * kChunkK + 32) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < kWarpKBatch; ++u)
      if (c0 + u < c_end) w4a16_chunk_mma<M_TILES>(acc, wq[u], sc[u], scale_sel, xl[u], xh[u]);
    if (c0 == c_begin) SM120_W4A16_STAMP(1);  // warp 0's first batch arrived and computed
  }
  SM120_W4A16_STAMP(2);
  // Every load of this grid is issued; the next grid may start prefetching its own weights.
  pdl_launch_dependents();

#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) part[warp][mt * 4 + e][lane] = acc[mt][e];
  __syncthreads();
  // Warp q sums accumulator element q (M tile q / 4, element q % 4) over the warps, in warp order.
  const int q = warp;
  const bool summer = q < M_TILES * 4;
  float v = 0.0f;
  if (summer) {
    v = part[0][q][lane];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) v += part[w][q][lane];
  }
  if (p.splits > 1) {
    // The K splits of this tile form one cluster (1, splits, 1): rank r = blockIdx.y. Ranks r > 0
    // store their sums into rank 0's peer[r - 1] (DSMEM), arrive (release) and leave; rank 0 waits
    // for them (acquire) and adds them in rank order. One barrier phase after the loads, not two
    // full cluster syncs: no CTA waits for rank 0's reads, and no shared memory is read remotely.
    cluster_wait();  // phase 1: every CTA of the cluster has started
    if (blockIdx.y != 0) {
      if (summer) st_shared_cluster_f32(cluster_map_shared(&peer[blockIdx.y - 1][q][lane], 0), v);
      cluster_arrive();
      SM120_W4A16_STAMP(3);
      return;
    }
    cluster_arrive();
    cluster_wait();  // phase 2: the peers' sums are in peer[]
    if (summer)
      for (int r = 1; r < p.splits; ++r) v += peer[r - 1][q][lane];
  }
  SM120_W4A16_STAMP(3);
  if (summer) w4a16_store(p, group, rt, tok0, g, t, q >> 2, q & 3, v, PDL ? w4a16_alpha(p) : alpha_early);
  SM120_W4A16_STAMP(4);
}

// The PDL launch runs the PDL instantiation (template flag = launch attribute).
template <int WARPS, bool PDL>
cudaError_t launch_warpk(const W4A16Params& p, const W4A16Plan& plan, cudaStream_t stream) {
  const dim3 grid(plan.n_ctas, plan.splits, plan.m_blocks), block(32 * WARPS);
  const unsigned cluster_y = (unsigned)plan.splits;  // 1: no cluster
  return plan.m_tiles == 1
             ? launch_kernel(gemm_w4a16_warpk_kernel<1, WARPS, PDL>, grid, block, stream, PDL, cluster_y, p)
             : launch_kernel(gemm_w4a16_warpk_kernel<2, WARPS, PDL>, grid, block, stream, PDL, cluster_y, p);
}
template <int WARPS>
cudaError_t launch_warpk(const W4A16Params& p, const W4A16Plan& plan, bool pdl, cudaStream_t stream) {
  return pdl ? launch_warpk<WARPS, true>(p, plan, stream) : launch_warpk<WARPS, false>(p, plan, stream);
}

}  // namespace

#ifdef SM120_W4A16_TIMELINE
cudaError_t w4a16_warpk_attach_stamps(W4A16Stamps* device_buffer) {
  return cudaMemcpyToSymbol(g_w4a16_stamps, &device_buffer, sizeof(device_buffer));
}
#endif

int launch_gemm_w4a16_warpk(const W4A16Params& p, const W4A16Plan& plan, bool pdl, cudaStream_t stream) {
  const cudaError_t err = plan.warpk_warps == 16 ? launch_warpk<16>(p, plan, pdl, stream)
                                                 : launch_warpk<8>(p, plan, pdl, stream);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // the same error is pending there: do not report it twice
    return set_error(kLaunchFailed, "gemm_w4a16 (warp-K): launch failed (pdl=%d, m_tiles=%d, warps=%d): %s",
                     pdl ? 1 : 0, plan.m_tiles, plan.warpk_warps, cudaGetErrorString(err));
  }
  return check_launch("gemm_w4a16_warpk");
}

}  // namespace sm120
