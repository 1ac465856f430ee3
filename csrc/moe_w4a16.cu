// Grouped small-M NVFP4 W4A16 GEMMs for MoE experts: out[T, H] = scale * sum_k w[t,k] *
// down_e(silu(gate_e(x_t)) * up_e(x_t)), e = topk_ids[t, k], one call of four kernels:
//
// 1. moe_align_kernel (one CTA): counts each expert's rows, writes the rows sorted by expert
//    (sorted position -> slot t * topk + k) and a work list of (expert, first position, rows)
//    items of at most 8 * M_TILES rows each. Ids outside [0, E) (EP: experts of other ranks) get
//    no row and contribute nothing. Within an expert the rows' order follows shared-memory
//    atomics, but no result depends on it: every output row is computed from its own X row alone.
// 2. moe_w4a16_kernel<GATE_UP>: one CTA per (work item, tiles_per_cta 16-row weight tiles); its 8
//    warps split those tiles' K (k_warps warps per tile, each streaming its K slice of the tile
//    straight into registers, as gemm_w4a16_warpk.cu does) and the partial sums meet in shared
//    memory, summed in warp order. The chunk math is w4a16.cuh's, shared with the linear kernels.
//    gate_up: the packed weight interleaves gate and up rows per 64 (kernels/moe.py), so a lane's
//    MMA rows g and g + 8 are the gate and up rows of one output column: SiLU(gate) * up is formed
//    in fp32 from the accumulators and stored once, in bf16, at the row's sorted position.
//    down: the row's routing weight is applied in fp32 and the bf16 result stored at its slot.
// 3. moe_reduce_kernel: out[t] = scale * sum over k = 0..topk-1 in that order (fp32) -> bf16.
// With `pdl`, gate_up, down and reduce are launched with programmatic dependent launch: each starts
// while the previous kernel drains. gate_up waits before reading anything; down reads its work item
// (the align kernel's, complete once every gate_up CTA has passed its own wait, which precedes its
// trigger) and pulls its weight slice into L2 before waiting for the activations.
// Fixed summation orders everywhere: identical inputs give identical outputs.
#include "w4a16.cuh"

namespace sm120 {
namespace {

constexpr int kMoeWarps = 8;
constexpr int kAlignThreads = 1024;
constexpr int kReduceThreads = 128;

struct MoeGemmParams {
  const __nv_bfloat16* x;      // gate_up: hidden [T, K]; down: activations [S, K] by sorted position
  const uint8_t* qweight;      // [E][expert_weight_bytes]
  const uint8_t* scales;       // [E][expert_scale_bytes]
  const float* alpha;          // decode global scales: gate_up [E, 2] (gate, up); down [E]
  const float* topk_weights;   // [S] (down)
  const int* sorted_slots;     // [S] sorted position -> slot
  const int4* work;            // {expert, first position, rows, 0}
  const int* work_count;
  __nv_bfloat16* y;            // gate_up: activations [S, N] by position; down: [S, N] by slot
  int N;                       // output columns: I (gate_up) or H (down)
  int K;
  int n_chunks;                // 64-K chunks of the packed weight
  int n_tiles;                 // 16-row tiles of one expert's packed weight
  int topk;
  int tiles_per_cta;
  int k_warps;                 // warps per tile (kMoeWarps / tiles_per_cta)
  int chunks_per_warp;
  int64_t expert_weight_bytes;
  int64_t expert_scale_bytes;
};

// Both halves of a (gate, up) accumulator pair of token `tok` (local to the item) -> activation.
__device__ __forceinline__ void store_gate_up(const MoeGemmParams& p, int pos0, int rows, int group, int rt, int g,
                                              int tok, float gate, float up, float alpha_gate, float alpha_up) {
  // MMA row g of tile rt is the group's row 64 * ((g >> 2) & 1) + 4 * rt + (g & 3) (layout.py), a
  // gate row whose up row sits 32 rows further (MMA row g + 8); gate rows [0, 32) and [64, 96) of
  // group G are columns 64 G + [0, 32) and 64 G + [32, 64).
  const int col = group * 64 + 32 * ((g >> 2) & 1) + 4 * rt + (g & 3);
  if (tok < rows && col < p.N) {
    const float a = gate * alpha_gate;
    const float silu = a / (1.0f + __expf(-a));
    p.y[(int64_t)(pos0 + tok) * p.N + col] = __float2bfloat16_rn(silu * (up * alpha_up));
  }
}

__device__ __forceinline__ void store_down(const MoeGemmParams& p, int pos0, int rows, int group, int rt, int r,
                                           int tok, float v, float alpha) {
  const int n = group * kGroupRows + tile_row_to_actual(rt, r);
  if (tok < rows && n < p.N) {
    const int slot = __ldg(p.sorted_slots + pos0 + tok);
    p.y[(int64_t)slot * p.N + n] = __float2bfloat16_rn(v * alpha * __ldg(p.topk_weights + slot));
  }
}

// A warp's K slice of one weight tile (chunks [c_begin, c_end): 512 B of weights and the tile's
// 64 B of scales each) pulled into L2, one 128-B line per lane and step.
__device__ __forceinline__ void prefetch_slice_l2(const uint8_t* w, const uint8_t* s, int c_begin, int c_end,
                                                  int lane) {
  for (int i = lane; i < (c_end - c_begin) * 5; i += 32) {
    const int c = c_begin + i / 5, part = i % 5;
    const uint8_t* line = part < 4 ? w + (int64_t)c * 512 + part * 128 : s + (int64_t)c * 512;
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(line));
  }
}

template <int M_TILES, bool GATE_UP>
__global__ void __launch_bounds__(32 * kMoeWarps, 2) moe_w4a16_kernel(const MoeGemmParams p) {
  // Chunks a warp loads before computing them: 4 x 16 B of weights in flight per thread (2 CTAs of
  // 8 warps per SM leave 128 registers a thread, and the build refuses spills).
  constexpr int kBatch = 4;
  __shared__ float part[kMoeWarps][M_TILES * 4][32];
  if (GATE_UP) pdl_wait();  // the work list is the align kernel's (down: see the header)
  if ((int)blockIdx.x >= __ldg(p.work_count)) return;  // whole CTA: before any barrier
  const int4 item = __ldg(p.work + blockIdx.x);
  const int expert = item.x, pos0 = item.y, rows = item.z;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile_in_cta = warp / p.k_warps, kw = warp % p.k_warps;
  const int tile = blockIdx.y * p.tiles_per_cta + tile_in_cta;
  const bool tile_ok = tile_in_cta < p.tiles_per_cta && tile < p.n_tiles;
  const int group = tile >> 3, rt = tile & 7;
  const int c_begin = tile_ok ? min(kw * p.chunks_per_warp, p.n_chunks) : 0;
  const int c_end = tile_ok ? min(c_begin + p.chunks_per_warp, p.n_chunks) : 0;

  const uint8_t* w_tile = p.qweight + expert * p.expert_weight_bytes + (int64_t)tile * p.n_chunks * 512;
  const uint8_t* s_tile = p.scales + expert * p.expert_scale_bytes + (int64_t)group * p.n_chunks * 512 + rt * 64;
  const uint8_t* w_src = w_tile + lane * 16;
  const uint8_t* s_src = s_tile + w4a16_scale_offset(g);
  // Element offsets of the lane's X rows (32-bit: the binding refuses X of 2^31 elements or more),
  // which keeps the 32-token instantiation within 128 registers.
  int x_off[M_TILES];
  bool x_ok[M_TILES];
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt) {
    const int row = mt * 8 + g;
    x_ok[mt] = row < rows;
    int x_row = 0;
    if (x_ok[mt]) x_row = GATE_UP ? __ldg(p.sorted_slots + pos0 + row) / p.topk : pos0 + row;
    x_off[mt] = x_row * p.K + 8 * t;
  }
  const uint32_t scale_sel = w4a16_scale_select(t);
  if (!GATE_UP) {  // the weight slice to L2 while gate_up drains, then its activations
    prefetch_slice_l2(w_tile, s_tile, c_begin, c_end, lane);
    pdl_wait();
  }

  float acc[M_TILES][4] = {};
  for (int c0 = c_begin; c0 < c_end; c0 += kBatch) {
    uint4 wq[kBatch];
    uint2 sc[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (c0 + u < c_end) {
        wq[u] = ldg_stream128(w_src + (int64_t)(c0 + u) * 512);
        sc[u] = ldg_stream64(s_src + (int64_t)(c0 + u) * 512);
      }
    // X per chunk, just before its MMAs (ptxas still hoists them as registers allow): the weights
    // are what must be in flight early.
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (c0 + u >= c_end) break;
      uint4 xl[M_TILES], xh[M_TILES];
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) {
        const int k = (c0 + u) * kChunkK + 8 * t;  // xl at k, xh at k + 32 (K % 16 == 0)
        // X was written by an earlier kernel and is read-only here: the L1-cached path, where the
        // CTAs of the other tiles of the same item on this SM find it.
        const __nv_bfloat16* src = p.x + x_off[mt] + (c0 + u) * kChunkK;
        xl[mt] = x_ok[mt] && k < p.K ? __ldg(reinterpret_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
        xh[mt] = x_ok[mt] && k + 32 < p.K ? __ldg(reinterpret_cast<const uint4*>(src + 32)) : make_uint4(0, 0, 0, 0);
      }
      w4a16_chunk_mma<M_TILES>(acc, wq[u], sc[u], scale_sel, xl, xh);
    }
  }
  pdl_launch_dependents();

  const float alpha0 = 256.0f * __ldg(p.alpha + (GATE_UP ? 2 * expert : expert));
  const float alpha1 = GATE_UP ? 256.0f * __ldg(p.alpha + 2 * expert + 1) : 0.0f;
  if (p.k_warps == 1) {  // each warp owns its tile's whole K: store straight from the registers
    if (!tile_ok) return;
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = mt * 8 + 2 * t + e;
        if (GATE_UP) {
          store_gate_up(p, pos0, rows, group, rt, g, tok, acc[mt][e], acc[mt][e + 2], alpha0, alpha1);
        } else {
          store_down(p, pos0, rows, group, rt, g, tok, acc[mt][e], alpha0);
          store_down(p, pos0, rows, group, rt, g + 8, tok, acc[mt][e + 2], alpha0);
        }
      }
    return;
  }
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) part[warp][mt * 4 + e][lane] = acc[mt][e];
  __syncthreads();
  // Item q of tile j: accumulator element q of M tile q / 4 (gate_up: the pair (q, q + 2) of
  // elements q = 0, 1), summed over the tile's warps in warp order.
  constexpr int kPerTile = GATE_UP ? M_TILES * 2 : M_TILES * 4;
  for (int idx = warp; idx < p.tiles_per_cta * kPerTile; idx += kMoeWarps) {
    const int j = idx / kPerTile, q = idx % kPerTile;
    const int jt = blockIdx.y * p.tiles_per_cta + j;
    if (jt >= p.n_tiles) break;  // later j are past the end too
    const int jgroup = jt >> 3, jrt = jt & 7;
    const int mt = GATE_UP ? q >> 1 : q >> 2, e = GATE_UP ? q & 1 : q & 3;
    const int w0 = j * p.k_warps;
    float v = part[w0][mt * 4 + e][lane];
    for (int w = 1; w < p.k_warps; ++w) v += part[w0 + w][mt * 4 + e][lane];
    const int tok = mt * 8 + 2 * t + (e & 1);
    if (GATE_UP) {
      float u = part[w0][mt * 4 + e + 2][lane];
      for (int w = 1; w < p.k_warps; ++w) u += part[w0 + w][mt * 4 + e + 2][lane];
      store_gate_up(p, pos0, rows, jgroup, jrt, g, tok, v, u, alpha0, alpha1);
    } else {
      store_down(p, pos0, rows, jgroup, jrt, e < 2 ? g : g + 8, tok, v, alpha0);
    }
  }
}

// Inclusive scan of one int per thread over the CTA (kAlignThreads threads).
__device__ __forceinline__ int block_inclusive_scan(int v, int* warp_totals) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int o = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += o;
  }
  if (lane == 31) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = warp_totals[lane];
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += o;
    }
    warp_totals[lane] = w;
  }
  __syncthreads();
  const int before = warp == 0 ? 0 : warp_totals[warp - 1];
  __syncthreads();  // warp_totals is reused by the next scan
  return v + before;
}

__global__ void __launch_bounds__(kAlignThreads) moe_align_kernel(const int* ids, int S, int E, int rows_per_item,
                                                                  int* sorted_slots, int4* work, int* work_count) {
  __shared__ int counts[kMoeMaxExperts];
  __shared__ int cursor[kMoeMaxExperts];
  __shared__ int warp_totals[32];
  const int tid = threadIdx.x;
  for (int e = tid; e < E; e += kAlignThreads) counts[e] = 0;
  __syncthreads();
  for (int s = tid; s < S; s += kAlignThreads) {
    const int e = ids[s];
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  const int c = tid < E ? counts[tid] : 0;
  const int nb = ceil_div(c, rows_per_item);
  const int c_incl = block_inclusive_scan(c, warp_totals);
  const int nb_incl = block_inclusive_scan(nb, warp_totals);
  if (tid < E) {
    const int off = c_incl - c, b0 = nb_incl - nb;
    cursor[tid] = off;
    for (int b = 0; b < nb; ++b)
      work[b0 + b] = make_int4(tid, off + b * rows_per_item, min(rows_per_item, c - b * rows_per_item), 0);
  }
  if (tid == kAlignThreads - 1) *work_count = nb_incl;
  __syncthreads();
  for (int s = tid; s < S; s += kAlignThreads) {
    const int e = ids[s];
    if (e >= 0 && e < E) sorted_slots[atomicAdd(&cursor[e], 1)] = s;
  }
}

__device__ __forceinline__ void bf16x8_accumulate(float (&acc)[8], const uint4& v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += f.x;
    acc[2 * i + 1] += f.y;
  }
}

// out[t, 8c .. 8c + 7] = scale * sum over k in order of y[t * topk + k, ...] (valid ids only).
__global__ void __launch_bounds__(kReduceThreads) moe_reduce_kernel(const __nv_bfloat16* y, const int* ids, int topk,
                                                                   int E, int H, float scale, __nv_bfloat16* out) {
  pdl_wait();  // y is the down kernel's
  const int t = blockIdx.x;
  const int c8 = (blockIdx.y * kReduceThreads + threadIdx.x) * 8;
  if (c8 >= H) return;
  float acc[8] = {};
  for (int k = 0; k < topk; ++k) {
    const int slot = t * topk + k;
    const int e = __ldg(ids + slot);
    if (e >= 0 && e < E) bf16x8_accumulate(acc, __ldg(reinterpret_cast<const uint4*>(y + (int64_t)slot * H + c8)));
  }
  uint4 o;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i] * scale, acc[2 * i + 1] * scale);
  *reinterpret_cast<uint4*>(out + (int64_t)t * H + c8) = o;
}

// Warps splitting one tile's K. Two pulls: parallelism wants many (each warp streams its K slice
// of the tile, so more warps per tile keep more weight bytes in flight per CTA), X reuse wants few.
// A warp reads rows x 128 B of X per 64-K chunk beside the chunk's 576 B of weights and scales,
// and only warps of the same K slice (the CTA's other tiles) share those X reads through L1; so
// with `rows` rows a tile, X traffic from L2 stays at or below the weights' when a CTA holds at
// least rows / 4 tiles. Hence: the fewer of (8 / those tiles) and (the most warps that leave each
// warp kMoeMinChunksPerWarp chunks: GLM-5's down at TP 8 has 4 chunks, so one warp a tile).
int moe_k_warps(int n_chunks, int64_t avg_rows) {
  const int tiles_for_reuse = avg_rows <= 4 ? 1 : avg_rows <= 8 ? 2 : avg_rows <= 16 ? 4 : 8;
  int k_warps = kMoeWarps / tiles_for_reuse;
  while (k_warps > 1 && n_chunks < k_warps * kMoeMinChunksPerWarp) k_warps >>= 1;
  return k_warps;
}

// The fields of one of the two grouped GEMMs: X [*, K] bf16, per expert a packed [weight_rows, K]
// weight (kernels/moe.py's layout), output columns N.
void set_gemm(MoeGemmParams& p, const void* x, const void* qweight, const void* scales, const float* alpha,
              void* y, int weight_rows, int K, int N, int k_warps) {
  p.x = static_cast<const __nv_bfloat16*>(x);
  p.qweight = static_cast<const uint8_t*>(qweight);
  p.scales = static_cast<const uint8_t*>(scales);
  p.alpha = alpha;
  p.y = static_cast<__nv_bfloat16*>(y);
  p.N = N;
  p.K = K;
  p.n_chunks = round_up(K, kChunkK) / kChunkK;
  p.n_tiles = weight_rows / kTileRows;
  p.k_warps = k_warps;
  p.tiles_per_cta = kMoeWarps / k_warps;
  p.chunks_per_warp = ceil_div(p.n_chunks, k_warps);
  p.expert_weight_bytes = (int64_t)weight_rows * p.n_chunks * kChunkK / 2;
  p.expert_scale_bytes = (int64_t)weight_rows * p.n_chunks * kChunkK / 16;
}

template <bool GATE_UP>
cudaError_t launch_gemm(const MoeGemmParams& p, int m_tiles, int max_items, bool pdl, cudaStream_t stream) {
  const dim3 grid(max_items, ceil_div(p.n_tiles, p.tiles_per_cta)), block(32 * kMoeWarps);
  switch (m_tiles) {
    case 1: return launch_kernel(moe_w4a16_kernel<1, GATE_UP>, grid, block, stream, pdl, 1, p);
    case 2: return launch_kernel(moe_w4a16_kernel<2, GATE_UP>, grid, block, stream, pdl, 1, p);
    default: return launch_kernel(moe_w4a16_kernel<4, GATE_UP>, grid, block, stream, pdl, 1, p);
  }
}

}  // namespace

MoePlan plan_moe_w4a16(int T, int topk, int E, int H, int I, int gate_up_k_warps, int down_k_warps, int m_tiles) {
  MoePlan plan{};
  const int64_t S = (int64_t)T * topk;
  // Rows an active expert gets on average (uniform routing over min(E, S) experts): the M tile.
  const int64_t active = S < E ? S : E;
  const int64_t avg = active > 0 ? ceil_div((int)S, (int)active) : 1;
  plan.m_tiles = m_tiles > 0 ? m_tiles : avg <= 8 ? 1 : avg <= 16 ? 2 : 4;
  plan.rows_per_item = 8 * plan.m_tiles;
  plan.max_items = (int)(ceil_div((int)S, plan.rows_per_item) + active);
  const int64_t rows = avg < plan.rows_per_item ? avg : plan.rows_per_item;
  plan.gate_up_k_warps = gate_up_k_warps > 0 ? gate_up_k_warps : moe_k_warps(round_up(H, kChunkK) / kChunkK, rows);
  plan.down_k_warps = down_k_warps > 0 ? down_k_warps : moe_k_warps(round_up(I, kChunkK) / kChunkK, rows);
  return plan;
}

int launch_moe_w4a16(const MoeArgs& a, const MoePlan& plan, cudaStream_t stream) {
  const int S = a.T * a.topk;
  cudaError_t err = launch_kernel(moe_align_kernel, dim3(1), dim3(kAlignThreads), stream, false, 1, a.topk_ids, S,
                                  a.E, plan.rows_per_item, a.sorted_slots, static_cast<int4*>(a.work),
                                  a.work_count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return set_error(kLaunchFailed, "moe_w4a16 (align): launch failed: %s", cudaGetErrorString(err));
  }
  const int i_pad = round_up(a.I, 64), h_pad = round_up(a.H, kGroupRows);
  MoeGemmParams p{};
  p.sorted_slots = a.sorted_slots;
  p.work = static_cast<const int4*>(a.work);
  p.work_count = a.work_count;
  p.topk = a.topk;
  p.topk_weights = a.topk_weights;
  // gate_up: [2 I_pad rows (gate/up interleaved per 64), K = H] -> activations [S, I]
  set_gemm(p, a.hidden, a.w13, a.w13_scales, a.w13_alpha, a.act, 2 * i_pad, a.H, a.I, plan.gate_up_k_warps);
  err = launch_gemm<true>(p, plan.m_tiles, plan.max_items, a.pdl, stream);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return set_error(kLaunchFailed, "moe_w4a16 (gate_up): launch failed (m_tiles=%d, pdl=%d): %s", plan.m_tiles, a.pdl ? 1 : 0,
                     cudaGetErrorString(err));
  }
  // down: [H_pad rows, K = I] -> y [S, H] by slot, times the routing weight
  set_gemm(p, a.act, a.w2, a.w2_scales, a.w2_alpha, a.y, h_pad, a.I, a.H, plan.down_k_warps);
  err = launch_gemm<false>(p, plan.m_tiles, plan.max_items, a.pdl, stream);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return set_error(kLaunchFailed, "moe_w4a16 (down): launch failed (m_tiles=%d, pdl=%d): %s", plan.m_tiles, a.pdl ? 1 : 0,
                     cudaGetErrorString(err));
  }
  const dim3 rgrid(a.T, ceil_div(a.H / 8, kReduceThreads));
  err = launch_kernel(moe_reduce_kernel, rgrid, dim3(kReduceThreads), stream, a.pdl, 1,
                      static_cast<const __nv_bfloat16*>(a.y), a.topk_ids, a.topk, a.E, a.H, a.scale,
                      static_cast<__nv_bfloat16*>(a.out));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return set_error(kLaunchFailed, "moe_w4a16 (reduce): launch failed: %s", cudaGetErrorString(err));
  }
  return check_launch("moe_w4a16");
}

}  // namespace sm120
