// Small-M NVFP4 GEMM, weight-only (W4A16): Y[M,N] = X[M,K] . dequant(W)^T (+ bias), bf16 in/out,
// fp32 accumulation. One source for sm_90a and sm_120a.
//
// Swap-AB: the weights are the MMA's A operand (16 rows per warp), the tokens its N dimension
// (8 per MMA), so M = 1..8 wastes nothing on padding. Per 64-wide K chunk a thread loads one
// 16-byte packed weight fragment (4 words: rows r and r+8, K halves), turns every bf16x2 pair into
// bf16 with one or two rotate+mask ops, multiplies by its block scale (HMUL2 with a broadcast
// half), and issues 4 bf16 m16n8k16 MMAs per 8-token tile, each on 4 consecutive K of one K half
// (the MMA's K order is ours to choose as long as A and B agree).
//   * 128 rows per CTA (one scale group: its scales are one 512-byte block per K chunk) as 4 warps
//     x 2 row tiles x 16 rows, or 8 warps x 1 row tile (twice the warps per SM for the same grid:
//     each warp's instruction stream is half as long; every accumulator sees the same MMAs in the
//     same order, so both give the same bits); stages of 128 K (M <= 16) or 64 K (M <= 64) with
//     3-4 buffers.
//   * multi-stage cp.async pipeline (256-byte L2 fills, no L2 cache hints: see cp_async16 in common.cuh).
//   * split-K over gridDim.y so the grid covers >= 2 CTAs per SM; partial tiles go to a workspace
//     and the last CTA of a tile (atomic ticket) reduces them in a fixed order (deterministic) and
//     resets its ticket, so no memset is needed and CUDA graphs capture the single launch.
//     Or (cluster reduce, up to 8 splits) the splits of a tile form one thread-block cluster and
//     split 0 sums the others' partials from their shared memory: no L2 round trips, no
//     workspace; the same summation order, so both give the same bits.
//   * static shared memory <= 47 KB for every M tile (checked by test_kernel_build.py).
// Values: e2m1 * scale * 2^-8 is exact in bf16; alpha = weight_scale_2 * 2^8 is applied in fp32.
#include <type_traits>

#include "w4a16.cuh"

namespace sm120 {
namespace {

template <int M_TILES, int WARPS>
struct W4A16Traits {
  static_assert(WARPS == 4 || WARPS == 8, "4 or 8 warps per 128-row CTA");
  static constexpr int kWarps = WARPS;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kTilesPerWarp = 8 / kWarps;  // 16-row tiles a warp owns (X fragments reused)
  static constexpr int kRows = kWarps * kTilesPerWarp * kTileRows;  // 128 = one scale group
  static_assert(kRows == kGroupRows, "a CTA owns one 128-row scale group");
  static constexpr int kChunksPerStage = M_TILES <= 2 ? 2 : 1;
  static constexpr int kTokens = 8 * M_TILES;
  static constexpr int kWBytes = 8 * kChunksPerStage * 512;
  static constexpr int kSBytes = kChunksPerStage * 512;
  static constexpr int kXRowBytes = kChunksPerStage * kChunkK * 2;
  static constexpr int kXBytes = kTokens * kXRowBytes;
  static constexpr int kStageBytes = kWBytes + kSBytes + kXBytes;
  static constexpr int kStagesRaw = (46 * 1024) / kStageBytes;
  static constexpr int kStages = kStagesRaw > 8 ? 8 : kStagesRaw;
  static constexpr int kWItems = 8 * kChunksPerStage * 32 / kThreads;        // 16-B copies a thread
  static constexpr int kXUnits = kTokens * kChunksPerStage * 8;  // 16-B copies of X per stage
  static constexpr int kXItems = (kXUnits + kThreads - 1) / kThreads;
  static constexpr bool kXSomeThreads = kXUnits < kThreads;  // M tile 8 with 8 warps: 128 of 256
  static constexpr int kAcc = kTilesPerWarp * M_TILES * 4;
  static constexpr int kTileElems = kThreads * kAcc;  // fp32 partials per CTA
  static_assert(kStages >= 3, "W4A16 tile does not fit three stages in 46 KB");
  static_assert(kXSomeThreads ? kXItems == 1 : kXItems * kThreads == kXUnits, "X split");
};

enum : int { kLoadWeights = 1, kLoadX = 2 };  // what a pipeline stage load issues

template <int M_TILES, int WARPS>
__global__ void __launch_bounds__(32 * WARPS) gemm_w4a16_kernel(const W4A16Params p) {
  using T = W4A16Traits<M_TILES, WARPS>;
  constexpr int CPS = T::kChunksPerStage;
  __shared__ __align__(128) uint8_t smem[T::kStages * T::kStageBytes];
  __shared__ int s_is_last;

  SM120_W4A16_STAMP(0);
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int group = blockIdx.x;
  const int split = blockIdx.y;
  const int tok0 = blockIdx.z * T::kTokens;
  const int c_begin = split * p.chunks_per_split;
  const int c_end = min(c_begin + p.chunks_per_split, p.n_chunks);
  const int n_stages = ceil_div(c_end - c_begin, CPS);
  // Stages inside both the split and K (all but possibly the last) skip the bounds tests.
  const int n_full_stages = max(0, (min(c_end, p.K / kChunkK) - c_begin) / CPS);


  // Per-thread copy sources at chunk 0, advanced by the chunk offset each stage. Weights: item j
  // is row tile rt0 + j * kItemTiles of chunk cc0 (one chunk per warp, W being a multiple of CPS),
  // so every item's shared destination is the first one's plus a constant: one address register
  // per stage instead of one per item (the copy loop is bound by instruction issue, not DRAM).
  static_assert(T::kWarps % CPS == 0, "a warp's weight items share one chunk");
  constexpr int kItemTiles = T::kWarps / CPS;
  const int rt0 = warp / CPS, cc0 = warp % CPS;
  const uint8_t* w_src[T::kWItems];
#pragma unroll
  for (int j = 0; j < T::kWItems; ++j)
    w_src[j] = p.qweight + (((int64_t)group * 8 + rt0 + kItemTiles * j) * p.n_chunks + cc0) * 512 + lane * 16;
  const uint32_t w_dst = (cc0 * 8 + rt0) * 512 + lane * 16;  // item j: + j * kItemTiles * 512
  const int s_cc = tid >> 5;  // scales: CPS x 512 B, threads tid < 32 * CPS
  const uint8_t* s_src = p.scales + ((int64_t)group * p.n_chunks + s_cc) * 512 + lane * 16;
  // X: item (row r, unit u of 16 B) = i / (8 * CPS), i % (8 * CPS)
  const __nv_bfloat16* x_src[T::kXItems];
  int x_dst[T::kXItems], x_k[T::kXItems], x_bytes[T::kXItems];  // 0: a token row past M (zero-filled)
  const bool x_loader = !T::kXSomeThreads || tid < T::kXUnits;  // threads that own an X unit
#pragma unroll
  for (int j = 0; j < T::kXItems; ++j) {
    const int i = (T::kXSomeThreads ? tid % T::kXUnits : tid) + j * T::kThreads;
    const int r = i / (8 * CPS), u = i % (8 * CPS);
    const int tok = tok0 + r;
    x_k[j] = (u >> 3) * kChunkK + (u & 7) * 8;
    x_bytes[j] = tok < p.M ? 16 : 0;
    x_src[j] = p.x + (int64_t)(tok < p.M ? tok : 0) * p.K + x_k[j];  // a valid address either way
    // XOR swizzle of the 16-byte unit by row parity: conflict-free LDS.128 in compute()
    x_dst[j] = T::kWBytes + T::kSBytes + r * T::kXRowBytes + ((u ^ ((r & 1) << 2)) * 16);
  }

  // kWhat selects the weights + scales (no earlier kernel writes them, so they may be read before
  // pdl_wait) and/or the activations X (written by the previous kernel).
  // `base`: the stage buffer's shared-window address.
  auto load_stage = [&](int stage, uint32_t base, auto what_tag) {
    constexpr int kWhat = decltype(what_tag)::value;
    const int c0 = c_begin + stage * CPS;
    const bool full = stage < n_full_stages;
    const int rem = c_end - c0;  // partial stage: chunks left in the split
    auto issue = [&](auto full_tag) {
      constexpr bool kFull = decltype(full_tag)::value;
      if constexpr ((kWhat & kLoadWeights) != 0) {
#pragma unroll
        for (int j = 0; j < T::kWItems; ++j) {
          const bool ok = kFull || cc0 < rem;
          cp_async16(base + w_dst + j * kItemTiles * 512, ok ? w_src[j] + (int64_t)c0 * 512 : p.qweight, ok ? 16 : 0);
        }
        if (tid < 32 * CPS) {
          const bool ok = kFull || s_cc < rem;
          cp_async16(base + T::kWBytes + tid * 16,
                     ok ? s_src + (int64_t)c0 * 512 : p.scales, ok ? 16 : 0);
        }
      }
      if constexpr ((kWhat & kLoadX) != 0) {
        if (x_loader) {
#pragma unroll
          for (int j = 0; j < T::kXItems; ++j) {
            const bool ok = kFull || (x_k[j] < p.K - c0 * kChunkK && (x_k[j] >> 6) < rem);
            cp_async16(base + x_dst[j], ok ? x_src[j] + c0 * kChunkK : p.x, ok ? x_bytes[j] : 0);
          }
        }
      }
    };
    if (full) {
      issue(std::true_type{});
    } else {
      issue(std::false_type{});
    }
  };

  float acc[T::kTilesPerWarp][M_TILES][4] = {};

  const uint32_t scale_sel = w4a16_scale_select(t);
  const int swz = (g & 1) << 2;
  const int s_off = w4a16_scale_offset(g);

  // A thread's read offsets in a stage buffer; the rest of each address is a constant.
  // (cc * 8 + t) ^ swz = cc * 8 + (t ^ swz): the swizzle only flips bit 2.
  const int wq_off = warp * T::kTilesPerWarp * 512 + lane * 16;
  const int sc_off = T::kWBytes + warp * T::kTilesPerWarp * 64 + s_off;
  const int xl_off = T::kWBytes + T::kSBytes + g * T::kXRowBytes + (t ^ swz) * 16;
  const int xh_off = T::kWBytes + T::kSBytes + g * T::kXRowBytes + ((4 + t) ^ swz) * 16;
  auto compute = [&](const uint8_t* base) {
#pragma unroll
    for (int cc = 0; cc < CPS; ++cc) {
      uint4 xl[M_TILES], xh[M_TILES];
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) {
        xl[mt] = lds128(base + xl_off + mt * 8 * T::kXRowBytes + cc * 128);
        xh[mt] = lds128(base + xh_off + mt * 8 * T::kXRowBytes + cc * 128);
      }
#pragma unroll
      for (int i = 0; i < T::kTilesPerWarp; ++i) {
        const uint4 wq = lds128(base + wq_off + (cc * 8 + i) * 512);
        const uint2 sc = lds64(base + sc_off + cc * 512 + i * 64);
        w4a16_chunk_mma<M_TILES>(acc[i], wq, sc, scale_sel, xl, xh);
      }
    }
  };

  // Prologue: the weights of the first stages are requested before pdl_wait(), so under PDL their
  // DRAM latency overlaps the previous kernel's tail. Commit group 0 then holds those weights plus
  // X of stage 0, group s (s > 0) X of stage s: waiting for group `it` still covers stage `it`.
  using LoadWeights = std::integral_constant<int, kLoadWeights>;
  using LoadX = std::integral_constant<int, kLoadX>;
  using LoadAll = std::integral_constant<int, kLoadWeights | kLoadX>;
  const uint32_t smem_s = smem_addr(smem);
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s)
    if (s < n_stages) load_stage(s, smem_s + s * T::kStageBytes, LoadWeights{});
  // Needed only by the store, but requested now: issued after the loop, its DRAM latency would be
  // the last thing each CTA waits for.
  const float alpha = w4a16_alpha(p);
  pdl_wait();
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < n_stages) load_stage(s, smem_s + s * T::kStageBytes, LoadX{});
    cp_async_commit();
  }
  // The buffers as a ring of addresses (read and write side), advanced once per stage.
  constexpr int kLastBuf = (T::kStages - 1) * T::kStageBytes;
  const uint8_t* rd = smem;
  uint32_t wr = smem_s + kLastBuf;
  for (int it = 0; it < n_stages; ++it) {
    cp_async_wait<T::kStages - 2>();
    __syncthreads();
    if (it == 0) SM120_W4A16_STAMP(1);
    if (it + T::kStages - 1 < n_stages) load_stage(it + T::kStages - 1, wr, LoadAll{});
    cp_async_commit();
    compute(rd);
    rd = rd == smem + kLastBuf ? smem : rd + T::kStageBytes;
    wr = wr == smem_s + kLastBuf ? smem_s : wr + T::kStageBytes;
  }
  cp_async_wait<0>();
  SM120_W4A16_STAMP(2);

  auto store = [&](const float (&v)[T::kTilesPerWarp][M_TILES][4]) {
#pragma unroll
    for (int i = 0; i < T::kTilesPerWarp; ++i)
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) w4a16_store(p, group, warp * T::kTilesPerWarp + i, tok0, g, t, mt, e, v[i][mt][e], alpha);
  };

  // One store for all three paths (it is long: per-element bounds and bias), so one copy of it.
  float sum[T::kTilesPerWarp][M_TILES][4] = {};
  // A thread's partial of one split is kTilesPerWarp * M_TILES float4s (one per MMA accumulator),
  // stored as [accumulator][thread] so every warp access is 512 contiguous bytes. The sum is
  // unrolled so up to 16 float4 loads (several splits) are in flight at once: one L2 round trip
  // per group of splits instead of per split (at M tile 8, 16 splits: 2 instead of 4).
  constexpr int kPartVecs = T::kTilesPerWarp * M_TILES;
  static_assert(kPartVecs <= 16, "at least one split per group");
  constexpr int kSumUnroll = 16 / kPartVecs < 8 ? 16 / kPartVecs : 8;
  if (p.splits == 1) {
#pragma unroll
    for (int i = 0; i < T::kTilesPerWarp; ++i)
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[i][mt][e] = acc[i][mt][e];
  } else if (p.cluster_reduce) {
    static_assert(T::kTileElems * sizeof(float) <= sizeof(smem), "partial tile must fit the pipeline buffers");
    float* part_s = reinterpret_cast<float*>(smem);
    __syncthreads();  // every warp is done reading the pipeline buffers
#pragma unroll
    for (int i = 0; i < T::kTilesPerWarp; ++i)
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) part_s[((i * M_TILES + mt) * 4 + e) * T::kThreads + tid] = acc[i][mt][e];
    cluster_sync();
    // Cluster (1, splits, 1) spans gridDim.y, so the CTA of split s is cluster rank s.
    if (split == 0) {
#pragma unroll kSumUnroll
      for (int s = 0; s < p.splits; ++s) {
        const uint32_t part = cluster_map_shared(part_s, s);
#pragma unroll
        for (int i = 0; i < T::kTilesPerWarp; ++i)
#pragma unroll
          for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              sum[i][mt][e] += ld_shared_cluster_f32(part + 4 * (((i * M_TILES + mt) * 4 + e) * T::kThreads + tid));
      }
    }
    cluster_sync();  // a CTA's shared memory must outlive split 0's reads of it
    if (split != 0) return;
  } else {
    const int64_t tile_id = (int64_t)blockIdx.z * gridDim.x + blockIdx.x;
    float4* mine = reinterpret_cast<float4*>(p.partial + (tile_id * p.splits + split) * T::kTileElems);
#pragma unroll
    for (int i = 0; i < T::kTilesPerWarp; ++i)
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt)
        __stcg(mine + (i * M_TILES + mt) * T::kThreads + tid,
               make_float4(acc[i][mt][0], acc[i][mt][1], acc[i][mt][2], acc[i][mt][3]));
    // Hand-off as in CUTLASS's GenericBarrier: the CTA barrier orders every thread's partial stores
    // before thread 0's release; thread 0's acquire plus the barrier order the last CTA's loads
    // after every other CTA's release. No per-thread fence.sc (MEMBAR.SC.GPU) on this path.
    __syncthreads();
    if (tid == 0) s_is_last = (atomic_add_acq_rel_gpu(p.tickets + tile_id, 1) == p.splits - 1);
    __syncthreads();
    SM120_W4A16_STAMP(3);
    if (!s_is_last) return;
    // Groups of kSumUnroll splits: every load of a group is issued before its adds, including the
    // last, partial group (a compiler remainder loop would take one round trip per split there).
    const float4* parts = reinterpret_cast<const float4*>(p.partial + tile_id * p.splits * T::kTileElems);
    for (int s0 = 0; s0 < p.splits; s0 += kSumUnroll) {
      float4 v[kSumUnroll][kPartVecs];
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u)
        if (s0 + u < p.splits)
#pragma unroll
          for (int q = 0; q < kPartVecs; ++q)
            v[u][q] = __ldcg(parts + ((int64_t)(s0 + u) * kPartVecs + q) * T::kThreads + tid);
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u)
        if (s0 + u < p.splits)
#pragma unroll
          for (int i = 0; i < T::kTilesPerWarp; ++i)
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
              const float4 w = v[u][i * M_TILES + mt];
              sum[i][mt][0] += w.x;
              sum[i][mt][1] += w.y;
              sum[i][mt][2] += w.z;
              sum[i][mt][3] += w.w;
            }
    }
    if (tid == 0) p.tickets[tile_id] = 0;  // ready for the next launch on this workspace
  }
  store(sum);
  SM120_W4A16_STAMP(4);
  // The next grid may launch once every CTA has stored (or exited: split-K CTAs that hand off
  // their partials return above), not right after the K loop: triggered there, a chain of one-wave
  // calls (e.g. glm5 q_b TP 1, 128 CTAs) ran slower under PDL than with plain launches from M = 7
  // on, and triggered here no measured shape loses.
  pdl_launch_dependents();
}

constexpr int tile_elems(int m_tiles) { return 128 * 2 * m_tiles * 4; }
// the host's slot size is the kernel's partial tile, for every instantiated M tile and warp count
template <int W>
constexpr bool tile_sizes_match() {
  return W4A16Traits<1, W>::kTileElems == tile_elems(1) && W4A16Traits<2, W>::kTileElems == tile_elems(2) &&
         W4A16Traits<4, W>::kTileElems == tile_elems(4) && W4A16Traits<8, W>::kTileElems == tile_elems(8);
}
static_assert(tile_sizes_match<4>() && tile_sizes_match<8>(), "W4A16 partial tile size");

template <int W>
cudaError_t launch_w4a16_warps(int m_tiles, dim3 grid, cudaStream_t stream, bool pdl, unsigned cluster_y,
                               const W4A16Params& p) {
  const dim3 block(32 * W);
  switch (m_tiles) {
    case 1: return launch_kernel(gemm_w4a16_kernel<1, W>, grid, block, stream, pdl, cluster_y, p);
    case 2: return launch_kernel(gemm_w4a16_kernel<2, W>, grid, block, stream, pdl, cluster_y, p);
    case 4: return launch_kernel(gemm_w4a16_kernel<4, W>, grid, block, stream, pdl, cluster_y, p);
    default: return launch_kernel(gemm_w4a16_kernel<8, W>, grid, block, stream, pdl, cluster_y, p);
  }
}

}  // namespace

// Bytes of a packed weight: e2m1 values + e4m3 scales (what the split and kernel rules are keyed on).
static int64_t w4a16_weight_bytes(int N, int K) { return (int64_t)N * K / 2 + (int64_t)N * K / 16; }

int64_t default_split_target_w4a16(int M, int N, int K, int sm_count, int64_t tiles) {
  if (4 * tiles >= 3 * (int64_t)sm_count) return tiles;  // one split
  if (K <= kW4A16ShortK && 3 * tiles >= (int64_t)sm_count) return tiles;  // one split
  const int64_t weight_bytes = w4a16_weight_bytes(N, K);
  if (weight_bytes >= kW4A16HugeWeightBytes) return 4 * (int64_t)sm_count;
  if (weight_bytes >= kW4A16LargeWeightBytes) return 2 * (int64_t)sm_count;
  const int64_t target = M <= 16 ? sm_count : sm_count / 2;
  return target > 0 ? target : 1;
}

bool default_w4a16_warpk(int M, int N, int K, int sm_count) {
  if (M > kW4A16WarpKMaxM) return false;
  // Where the 128-row kernel runs unsplit, its tiles already fill the SMs: keep it.
  const int64_t tiles = round_up(N, kGroupRows) / kGroupRows;  // one token block at M <= 16
  if (default_split_target_w4a16(M, N, K, sm_count, tiles) <= tiles) return false;
  return w4a16_weight_bytes(N, K) < w4a16_warpk_max_weight_bytes(M);
}

W4A16Plan plan_w4a16(int M, int N, int K, int sm_count, size_t workspace_bytes, int split_target,
                     int flags) {
  W4A16Plan plan{};
  const bool cluster = (flags & kW4A16ClusterReduce) != 0;
  // Token tiling and workspace layout are the same for both kernels (warp-K serves M <= 16).
  plan.m_tiles = M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8;
  plan.m_blocks = ceil_div(M, 8 * plan.m_tiles);
  plan.partial_offset = kW4A16TicketRegionBytes;
  plan.partial_tile_bytes = (size_t)tile_elems(plan.m_tiles) * sizeof(float);
  const int n_chunks = ceil_div(K, kChunkK);
  // A caller's split target asks for the split-K kernel unless kW4A16WarpK says otherwise.
  if ((flags & kW4A16WarpK) ||
      (!(flags & kW4A16SplitK) && split_target <= 0 && default_w4a16_warpk(M, N, K, sm_count))) {
    // One CTA per 16-row tile and token block, K in 8 or 16 slices of whole chunks, nothing to
    // hand off.
    plan.warpk = true;
    plan.n_ctas = round_up(N, kGroupRows) / kTileRows;
    const int64_t tiles = (int64_t)plan.n_ctas * plan.m_blocks;
    // Few tiles and a long K (more than one load batch per warp at 16 warps): split each tile's K
    // over a cluster of CTAs, up to one CTA per SM.
    constexpr int kMaxSplits = kW4A16WarpKMaxClusterWarps / 8;
    int splits = 1;
    if (n_chunks > kW4A16WarpKClusterMinChunks && tiles < sm_count) {
      const int64_t fit = sm_count / tiles;
      splits = (int)(fit < kMaxSplits ? fit : kMaxSplits);
    }
    plan.chunks_per_split = ceil_div(n_chunks, splits);
    plan.splits = ceil_div(n_chunks, plan.chunks_per_split);
    plan.cluster = plan.splits > 1;
    plan.warpk_warps = plan.chunks_per_split > kW4A16WarpK16MinChunks && tiles * plan.splits <= sm_count &&
                               16 * plan.splits <= kW4A16WarpKMaxClusterWarps
                           ? 16
                           : 8;
    plan.split_target = plan.n_ctas * plan.m_blocks;
    return plan;
  }
  plan.n_ctas = round_up(N, kGroupRows) / kGroupRows;
  const int64_t base = (int64_t)plan.n_ctas * plan.m_blocks;
  const int64_t target = split_target > 0 ? split_target : default_split_target_w4a16(M, N, K, sm_count, base);
  plan.split_target = target > INT32_MAX ? INT32_MAX : (int)target;
  int64_t splits = base >= target ? 1 : (target + base - 1) / base;
  // One-wave targets (at most one CTA per SM): a split count whose grid overflows the SMs gives
  // some SMs two CTAs, twice the work of the rest; take the most splits that fit.
  if (target <= sm_count && base * splits > sm_count)
    splits = sm_count / base > 1 ? sm_count / base : 1;
  const int max_splits = n_chunks / 2 > 1 ? n_chunks / 2 : 1;  // >= 128 K per split
  if (splits > max_splits) splits = max_splits;
  if (splits > 65535) splits = 65535;
  if (base > kW4A16MaxTicketTiles) splits = 1;  // more tiles than tickets (only with a huge target)
  const int cps_unit = plan.m_tiles <= 2 ? 2 : 1;  // whole pipeline stages per split
  for (;;) {
    const int cps = round_up(ceil_div(n_chunks, (int)splits), cps_unit);
    splits = ceil_div(n_chunks, cps);
    plan.chunks_per_split = cps;
    plan.splits = (int)splits;
    if (splits == 1) {
      plan.workspace_bytes = 0;
      break;
    }
    if (cluster && splits <= kW4A16MaxClusterSplits) {
      plan.cluster = true;
      plan.workspace_bytes = 0;
      break;
    }
    plan.workspace_bytes = plan.partial_offset + (size_t)base * splits * plan.partial_tile_bytes;
    if (plan.workspace_bytes <= workspace_bytes) break;
    // The most splits whose partials fit (each pass strictly lowers the count after the rounding
    // above). Not halving: that throws away up to half the splits (e.g. glm5 o_proj TP 1 at M = 64
    // would run 3 splits where 5 fit the 8 MB workspace).
    splits = splits - 1;
  }
  plan.eight_warps = (flags & kW4A16EightWarps) != 0 ||
                     ((flags & kW4A16AutoWarps) != 0 && w4a16_eight_warps(M, base * plan.splits, sm_count));
  return plan;
}

int launch_gemm_w4a16(const void* x, const void* qweight, const void* scales,
                      const float* weight_scale_2, const void* bias, void* y, int M, int N, int K,
                      void* workspace, size_t workspace_bytes, const W4A16Plan& plan, bool pdl,
                      cudaStream_t stream) {
  const bool tickets = plan.splits > 1 && !plan.cluster;  // plan_w4a16 clusters only 2..8 splits
  if (tickets && (workspace == nullptr || plan.workspace_bytes > workspace_bytes))
    return set_error(kWorkspaceTooSmall, "gemm_w4a16: workspace of %zu bytes, plan needs %zu",
                     workspace_bytes, plan.workspace_bytes);
  if (tickets && (int64_t)plan.n_ctas * plan.m_blocks > kW4A16MaxTicketTiles)
    return set_error(kInvalidArgument, "gemm_w4a16: %lld tiles exceed the %lld split-K tickets",
                     (long long)plan.n_ctas * plan.m_blocks, (long long)kW4A16MaxTicketTiles);
  W4A16Params p{};
  p.x = static_cast<const __nv_bfloat16*>(x);
  p.qweight = static_cast<const uint8_t*>(qweight);
  p.scales = static_cast<const uint8_t*>(scales);
  p.weight_scale_2 = weight_scale_2;
  p.bias = static_cast<const __nv_bfloat16*>(bias);
  p.y = static_cast<__nv_bfloat16*>(y);
  p.M = M;
  p.N = N;
  p.K = K;
  p.n_chunks = ceil_div(K, kChunkK);
  p.chunks_per_split = plan.chunks_per_split;
  p.splits = plan.splits;
  p.cluster_reduce = plan.cluster ? 1 : 0;
  if (plan.warpk) return launch_gemm_w4a16_warpk(p, plan, pdl, stream);
  if (tickets) {
    p.tickets = static_cast<int*>(workspace);
    p.partial = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + plan.partial_offset);
  }
  const dim3 grid(plan.n_ctas, plan.splits, plan.m_blocks);
  const unsigned cluster_y = plan.cluster ? (unsigned)plan.splits : 1u;
  const cudaError_t err = plan.eight_warps ? launch_w4a16_warps<8>(plan.m_tiles, grid, stream, pdl, cluster_y, p)
                                      : launch_w4a16_warps<4>(plan.m_tiles, grid, stream, pdl, cluster_y, p);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // the same error is pending there: do not report it twice
    return set_error(kLaunchFailed, "gemm_w4a16: launch failed (pdl=%d, cluster=%u, warps=%d): %s", pdl ? 1 : 0,
                     cluster_y, plan.eight_warps ? 8 : 4, cudaGetErrorString(err));
  }
  return check_launch("gemm_w4a16");
}

#ifdef SM120_W4A16_TIMELINE
cudaError_t w4a16_attach_stamps(W4A16Stamps* device_buffer) {
  const cudaError_t err = cudaMemcpyToSymbol(g_w4a16_stamps, &device_buffer, sizeof(device_buffer));
  return err != cudaSuccess ? err : w4a16_warpk_attach_stamps(device_buffer);
}
#endif

}  // namespace sm120
