// Internal interface between the kernel files and the one binding file (bindings.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.cuh"

namespace sm120 {

// Records a message for sm120_last_error() and returns `code`.
int set_error(int code, const char* fmt, ...);
// Turns a pending launch error into kLaunchFailed with the kernel name in the message.
int check_launch(const char* what);

// Device facts, cached per device (no host sync).
struct DeviceInfo {
  int sm_count;
  int major;
  int minor;
};
int device_info(int device, DeviceInfo* out);

// Launch on `stream`; with pdl, as a programmatic dependent launch (the kernel must pdl_wait()
// before reading anything an earlier kernel writes). Captured into CUDA graphs as a programmatic
// edge. cluster_y > 1 groups each run of cluster_y CTAs along y into one thread-block cluster.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                          bool pdl, unsigned cluster_y, Args&&... args) {
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_y > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = 1;
    attrs[n].val.clusterDim.y = cluster_y;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...);
}

int launch_quantize_nvfp4(const void* x, const float* global_scale, void* packed, void* scales,
                          int M, int K, bool p_order, cudaStream_t stream);

// Split-K plan of the W4A16 GEMM (computed on the host, no device access).
struct W4A16Plan {
  int m_tiles;        // 8-token MMA tiles per CTA (1, 2, 4 or 8)
  int m_blocks;       // CTAs along M
  int n_ctas;         // CTAs along N (128 rows each)
  int splits;         // CTAs along K
  int chunks_per_split;
  size_t workspace_bytes;  // bytes of workspace the plan uses (0 when splits == 1)
  size_t partial_offset;   // where the fp32 partial tiles start (== kW4A16TicketRegionBytes)
  size_t partial_tile_bytes;  // bytes of one (tile, split) partial slot
  bool cluster;               // split-K reduced inside a thread-block cluster (no workspace)
  bool warpk;                 // gemm_w4a16_warpk: one CTA per 16-row tile, K split over its warps
  int warpk_warps;            // its warps per CTA (8 or 16; 0 for the split-K kernel)
  int split_target;           // CTAs aimed for: the caller's, or default_split_target_w4a16's
  bool eight_warps;           // split-K kernel: 8 warps per CTA (flags; kW4A16AutoWarps: w4a16_eight_warps)
};
// Flags of sm120_gemm_w4a16 / sm120_w4a16_plan.
// kW4A16EightWarps: 8 warps x 1 row tile per 128-row CTA instead of 4 x 2 (same bits).
// kW4A16WarpK / kW4A16SplitK: run the warp-K kernel (M <= 16 only) / the 128-row split-K kernel;
// neither: default_w4a16_warpk decides. kW4A16AutoWarps: 8 or 4 warps by w4a16_eight_warps
// (kW4A16EightWarps, if also given, wins).
enum : int {
  kW4A16Pdl = 1,
  kW4A16ClusterReduce = 2,
  kW4A16EightWarps = 4,
  kW4A16WarpK = 8,
  kW4A16SplitK = 16,
  kW4A16AutoWarps = 32,
  kW4A16KnownFlags =
      kW4A16Pdl | kW4A16ClusterReduce | kW4A16EightWarps | kW4A16WarpK | kW4A16SplitK | kW4A16AutoWarps
};
// The default warp count of the split-K kernel: 8 for the 16-token M tile (9 <= M <= 16) unless
// the grid already puts more than kW4A16EightWarpsMaxCtasPerSm CTAs on an SM, else 4: more warps
// per SM hide the decode's DRAM latency, while a grid that already has several CTAs per SM
// (e.g. glm5 o_proj TP 1 at M = 16, 4 splits per SM) hides it without them and only pays for
// the larger CTAs.
constexpr int kW4A16EightWarpsMaxCtasPerSm = 3;
constexpr bool w4a16_eight_warps(int M, int64_t ctas, int sm_count) {
  return M > 8 && M <= 16 && ctas <= (int64_t)kW4A16EightWarpsMaxCtasPerSm * sm_count;
}
// Warps of a warp-K CTA: 8, or 16 where a CTA's K slice has more than kW4A16WarpK16MinChunks
// 64-K chunks (more than 4 per warp at 8 warps) and its CTAs fit the SMs one each: each warp's
// slice then needs fewer serial DRAM round trips (glm5 shared gate_up TP 4/8 0.88x the 8-warp
// time; with more CTAs than SMs, 16 warps took 1.1-1.3x). Past kW4A16WarpKClusterMinChunks chunks
// (more than 4 per warp at 16 warps) with fewer tiles than SMs, a cluster of up to 4 CTAs splits
// each tile's K (one CTA per SM at most). And the largest M it serves (two 8-token tiles).
// At most 32 warps per cluster: clusters of 64 warps (8 CTAs x 8 warps, or 4 x 16) ran glm5 shared
// gate_up TP 8 slower than 4 x 8 on the H200, so a cluster has at most 4 CTAs of 8 warps or 2
// of 16.
constexpr int kW4A16WarpK16MinChunks = 32;
constexpr int kW4A16WarpKClusterMinChunks = 64;
constexpr int kW4A16WarpKMaxClusterWarps = 32;
constexpr int kW4A16WarpKMaxM = 16;
// The splits of one tile form one cluster: at most the portable cluster size.
constexpr int kW4A16MaxClusterSplits = 8;
// Split-K workspace layout, the same for EVERY plan: one int ticket per (N, M) tile in the first
// 256 KB, partial tiles after it. The ticket region must not move with the plan: a workspace
// outlives calls, and a later plan's tickets must never land on an earlier plan's partials
// (they would start at garbage counts and the tile would never be reduced).
constexpr size_t kW4A16TicketRegionBytes = 256u << 10;
constexpr int64_t kW4A16MaxTicketTiles = kW4A16TicketRegionBytes / sizeof(int);
// The split-K target (CTAs to aim for) when the caller gives none. Fitted on the H200 (22 shapes
// x M 1..128, PDL launches, targets 0.25x..2x SMs timed on every row; the bench's split columns in
// benchmarks/bench_fp4_gemm.py re-time it): output
// tiles (`tiles`, 128 rows x one token block each) that already fill 3/4 of the SMs do not split
// (a split's hand-off costs more than the extra CTAs give); otherwise a weight of >= 8 MB (packed
// FP4 + scales) needs 2 CTAs per SM in flight to stream, and a smaller one 1 per SM at M <= 16 and
// 1 per 2 SMs above (where M > 64 already multiplies the tiles by its token blocks).
// Short K: with K <= 512 a tile streams in well under a microsecond, so once the tiles fill a
// third of the SMs the split's hand-off (partials through L2, a ticket, the last CTA's loads)
// costs more than it saves, and the tiles run unsplit (e.g. glm5 kv_b / shared down at TP 4 and 8).
// One wave: where the target is at most one CTA per SM, the split count is rounded down so that
// the grid fits the SMs: a split count whose grid overflows the SMs puts two CTAs on some SMs
// and the call waits for that second wave (e.g. glm5 o_proj TP 8 / shared down TP 1, 48 tiles on
// 132 SMs: 2 splits, not 3).
// Huge weights (>= 32 MB): 4 CTAs per SM, as more loads in flight keep DRAM busy on such a
// stream (glm5 o_proj TP 1, 56.6 MB, is the only such shape in the fitted table, so in-sample).
constexpr int64_t kW4A16LargeWeightBytes = 8000000;
constexpr int64_t kW4A16HugeWeightBytes = 32000000;
constexpr int kW4A16ShortK = 512;
int64_t default_split_target_w4a16(int M, int N, int K, int sm_count, int64_t tiles);
// Whether a call runs the warp-K kernel when the caller does not say. Fitted on the H200
// (lab/fp4_lab.py kernel-ab, in git at ada4aec: 22 shapes x M 1..16, both kernels timed on every row):
// warp-K wherever the split-K kernel would split K and the weight (packed + scales) is under
// 16 MB at M <= 2, 12 MB at M <= 8 (0.61-0.93x the split-K time there) or 5 MB at M 9..16
// (0.66-0.99x; its 16-token tile reads X twice per weight fragment, which larger weights do not
// hide). Where the 128-row tiles run unsplit, or for larger weights, warp-K took 1.02-2.3x.
constexpr int64_t w4a16_warpk_max_weight_bytes(int M) {
  return M <= 2 ? 16000000 : M <= 8 ? 12000000 : 5000000;
}
bool default_w4a16_warpk(int M, int N, int K, int sm_count);
// cluster: reduce the splits of a tile inside one thread-block cluster where they fit in one.
// flags: kW4A16WarpK / kW4A16SplitK pick the kernel (the caller has checked they fit M).
W4A16Plan plan_w4a16(int M, int N, int K, int sm_count, size_t workspace_bytes, int split_target,
                     int flags);

int launch_gemm_w4a16(const void* x, const void* qweight, const void* scales,
                      const float* weight_scale_2, const void* bias, void* y, int M, int N, int K,
                      void* workspace, size_t workspace_bytes, const W4A16Plan& plan, bool pdl,
                      cudaStream_t stream);

#ifdef SM120_W4A16_TIMELINE
// Diagnostics build only: per-CTA global-timer stamps of the W4A16 kernel (entry, first stage in
// shared memory, last stage computed, split-K ticket taken, output stored; 0 = not reached).
struct W4A16Stamps {
  unsigned long long t[5];
  unsigned smid;
};
// Stamps go to device_buffer[CTA index] from the next launch on (nullptr: off).
cudaError_t w4a16_attach_stamps(W4A16Stamps* device_buffer);
#endif

int launch_gemm_w4a4(const void* xq, const void* x_scales, const float* input_scale,
                     const void* qweight, const void* w_scales, const float* weight_scale_2,
                     const void* bias, void* y, int M, int N, int K, bool hardware_mma,
                     cudaStream_t stream);

// ------------------------------------------------------------------ grouped MoE W4A16 (moe_w4a16.cu)
// Experts per call: the align kernel keeps one counter per expert in shared memory.
constexpr int kMoeMaxExperts = 1024;
// A warp of the grouped GEMM streams at least this many 64-K chunks of its tile when the plan
// chooses (fewer warps per tile, more tiles per CTA, below that).
constexpr int kMoeMinChunksPerWarp = 4;
struct MoePlan {
  int m_tiles;          // 8-token MMA tiles per work item (1, 2 or 4)
  int rows_per_item;    // 8 * m_tiles
  int max_items;        // work items the grid covers: ceil(T * topk / rows_per_item) + min(E, T * topk)
  int gate_up_k_warps;  // warps splitting one 16-row tile's K (8 / tiles per CTA)
  int down_k_warps;
};
// Host only. The M tile follows the rows an active expert gets under uniform routing, unless
// m_tiles is 1, 2 or 4 (0: the plan's); the warps per tile are the plan's choice where *_k_warps
// is 0, else that count (1, 2, 4 or 8). The overrides are for sweeps.
MoePlan plan_moe_w4a16(int T, int topk, int E, int H, int I, int gate_up_k_warps, int down_k_warps, int m_tiles);
struct MoeArgs {
  const void* hidden;        // bf16 [T, H]
  const int* topk_ids;       // int32 [T, topk]
  const float* topk_weights; // fp32 [T, topk]
  const void* w13;           // packed gate/up per expert (kernels/moe.py), [E][2 I_pad x H_pad / 2]
  const void* w13_scales;
  const float* w13_alpha;    // [E, 2]
  const void* w2;            // packed down per expert, [E][H_pad x I_pad / 2]
  const void* w2_scales;
  const float* w2_alpha;     // [E]
  int* sorted_slots;         // int32 [T * topk]
  void* work;                // int4 [max_items]
  int* work_count;           // int32 [1]
  void* act;                 // bf16 [T * topk, I]
  void* y;                   // bf16 [T * topk, H]
  void* out;                 // bf16 [T, H]
  int T, topk, E, H, I;
  float scale;               // routed scaling factor
  bool pdl;                  // gate_up, down and reduce each start before the previous kernel ends
};
int launch_moe_w4a16(const MoeArgs& args, const MoePlan& plan, cudaStream_t stream);

}  // namespace sm120
