// The one binding file: a plain C ABI over the kernels (raw device pointers, sizes, the caller's
// stream as void*, int status codes, sm120_last_error() for the message). Loaded with ctypes by
// python/sglang/sm120/kernels/_lib.py; no torch headers, so each .cu compiles in seconds.
//
// Argument checks here are a second line of defence (the Python layer validates dtype, shape,
// device and contiguity first): a bad call returns an error code, never launches out of bounds.
#include <cstdarg>
#include <cstdio>
#include <mutex>

#include "kernels.h"

#ifndef SM120_BUILD_ARCHS
#define SM120_BUILD_ARCHS "unknown"
#endif

namespace sm120 {

namespace {
thread_local char g_error[512] = "";
std::mutex g_dev_mutex;
DeviceInfo g_dev[64];
bool g_dev_ok[64] = {};
}  // namespace

int set_error(int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_error, sizeof(g_error), fmt, ap);
  va_end(ap);
  return code;
}

int check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return set_error(kLaunchFailed, "%s: launch failed: %s", what, cudaGetErrorString(e));
  return kOk;
}

int device_info(int device, DeviceInfo* out) {
  if (device < 0 || device >= 64) return set_error(kInvalidArgument, "device index %d out of range", device);
  std::lock_guard<std::mutex> lock(g_dev_mutex);
  if (!g_dev_ok[device]) {
    DeviceInfo d{};
    cudaError_t e = cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, device);
    if (e != cudaSuccess)
      return set_error(kUnsupportedDevice, "cannot query device %d: %s", device, cudaGetErrorString(e));
    g_dev[device] = d;
    g_dev_ok[device] = true;
  }
  *out = g_dev[device];
  return kOk;
}

namespace {

// The library carries its own (static) CUDA runtime, whose current device is independent of
// torch's: select the tensors' device before every launch.
int use_device(int device, DeviceInfo* info) {
  int rc = device_info(device, info);
  if (rc != kOk) return rc;
  if (info->major != 9 && info->major != 12)
    return set_error(kUnsupportedDevice,
                     "device %d is sm_%d%d; this build has code for sm_90a and sm_120a only", device,
                     info->major, info->minor);
  int cur = -1;
  cudaGetDevice(&cur);
  if (cur != device) {
    const cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
      return set_error(kUnsupportedDevice, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
  }
  return kOk;
}

bool is_aligned(const void* p, int bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

int check_w4a16_flags(int flags, int M, const char* what) {
  if (flags & ~kW4A16KnownFlags) return set_error(kInvalidArgument, "%s: unknown flags 0x%x", what, flags);
  if ((flags & kW4A16WarpK) && (flags & kW4A16SplitK))
    return set_error(kInvalidArgument, "%s: the warp-K and split-K flags exclude each other", what);
  if ((flags & kW4A16WarpK) && M > kW4A16WarpKMaxM)
    return set_error(kInvalidArgument, "%s: the warp-K kernel serves M <= %d, got M=%d", what, kW4A16WarpKMaxM, M);
  return kOk;
}

}  // namespace
}  // namespace sm120

using namespace sm120;

extern "C" {

const char* sm120_last_error() { return g_error; }

// 2: sm120_w4a16_workspace_layout, fixed ticket region; 3: sm120_gemm_w4a16 takes `pdl`;
// 4: `flags` (kW4A16Pdl | kW4A16ClusterReduce) for the W4A16 GEMM and its plan, plan out[5];
// 5: flag kW4A16EightWarps; 6: plan out[6] = split target (the default is no longer 2 per SM);
// 7: flags kW4A16WarpK / kW4A16SplitK, plan out[7] = warp-K kernel;
// 8: flag kW4A16AutoWarps, plan out[8] = split-K warps per CTA; 9: sm120_moe_w4a16(_plan);
// 10: sm120_moe_w4a16 takes `m_tiles` and `pdl`, its plan `m_tiles`
int sm120_abi_version() { return 10; }

const char* sm120_build_archs() { return SM120_BUILD_ARCHS; }

// Split plan of the W4A16 GEMM;
// out = {m_tiles, m_blocks, n_ctas, splits, chunks_per_split, cluster-reduced (0/1), split target,
// warp-K warps per CTA (0: the split-K kernel), split-K warps per CTA (4 or 8; 0: warp-K)}; for
// warp-K, n_ctas counts 16-row tiles and splits the CTAs of one tile's cluster.
// Host-only (no device needed): *workspace_needed receives the bytes the plan uses.
int sm120_w4a16_plan(int M, int N, int K, int sm_count, size_t workspace_bytes, int split_target,
                     int flags, int* out, size_t* workspace_needed) {
  if (M <= 0 || N <= 0 || K <= 0 || sm_count <= 0 || out == nullptr)
    return set_error(kInvalidArgument, "w4a16_plan: bad arguments M=%d N=%d K=%d sm_count=%d", M,
                     N, K, sm_count);
  if (const int rc = check_w4a16_flags(flags, M, "w4a16_plan")) return rc;
  const W4A16Plan p = plan_w4a16(M, N, K, sm_count, workspace_bytes, split_target, flags);
  out[0] = p.m_tiles;
  out[1] = p.m_blocks;
  out[2] = p.n_ctas;
  out[3] = p.splits;
  out[4] = p.chunks_per_split;
  out[5] = p.cluster ? 1 : 0;
  out[6] = p.split_target;
  out[7] = p.warpk ? p.warpk_warps : 0;
  out[8] = p.warpk ? 0 : p.eight_warps ? 8 : 4;
  if (workspace_needed) *workspace_needed = p.workspace_bytes;
  return kOk;
}

// Workspace layout of that plan; out = {ticket region bytes (tickets start at 0, one int per
// tile z*n_ctas + x), partial_offset, bytes per (tile, split) partial slot, workspace bytes used}.
// Host-only, for tests that model the workspace across successive calls.
int sm120_w4a16_workspace_layout(int M, int N, int K, int sm_count, size_t workspace_bytes,
                                 int split_target, int flags, size_t* out) {
  if (M <= 0 || N <= 0 || K <= 0 || sm_count <= 0 || out == nullptr)
    return set_error(kInvalidArgument, "w4a16_workspace_layout: bad arguments M=%d N=%d K=%d sm_count=%d",
                     M, N, K, sm_count);
  if (const int rc = check_w4a16_flags(flags, M, "w4a16_workspace_layout")) return rc;
  const W4A16Plan p = plan_w4a16(M, N, K, sm_count, workspace_bytes, split_target, flags);
  out[0] = kW4A16TicketRegionBytes;
  out[1] = p.partial_offset;
  out[2] = p.partial_tile_bytes;
  out[3] = p.workspace_bytes;
  return kOk;
}

// x bf16 [M,K] -> packed uint8 [M,K/2], scales uint8 [round_up(M,128), round_up(K/16,4)]
// (128x4 swizzled). global_scale: device fp32, the ENCODE scale. p_order: nibble order of the
// W4A4 GEMM (1) or plain low-nibble-first order (0).
int sm120_quantize_nvfp4(int device, const void* x, const void* global_scale, void* packed,
                         void* scales, int M, int K, int p_order, void* stream) {
  if (!x || !global_scale || !packed || !scales)
    return set_error(kInvalidArgument, "quantize_nvfp4: null pointer");
  if (M <= 0 || K <= 0 || K % 16)
    return set_error(kInvalidArgument, "quantize_nvfp4: need M > 0 and K %% 16 == 0, got M=%d K=%d", M, K);
  if (!is_aligned(x, 16) || !is_aligned(packed, 8) || !is_aligned(scales, 4))
    return set_error(kInvalidArgument, "quantize_nvfp4: misaligned pointer (x 16 B, packed 8 B, scales 4 B)");
  DeviceInfo info;
  int rc = use_device(device, &info);
  if (rc != kOk) return rc;
  return launch_quantize_nvfp4(x, static_cast<const float*>(global_scale), packed, scales, M, K,
                               p_order != 0, static_cast<cudaStream_t>(stream));
}

// y bf16 [M,N] = x bf16 [M,K] . dequant(W)^T * weight_scale_2 (+ bias bf16 [N]).
// qweight: packed tiles (layout.py), scales: 128x4 swizzled [round_up(N,128), round_up(K/16,4)].
// workspace: zero-initialised device memory reused across calls on ONE stream (split-K tickets are
// left at zero by every launch). split_target <= 0 picks default_split_target_w4a16's. flags: kW4A16Pdl (1)
// launches it as a programmatic dependent launch (its weight prefetch may overlap the previous
// kernel's tail); kW4A16ClusterReduce (2) reduces up to 8 splits inside a thread-block cluster;
// kW4A16EightWarps (4) runs 8 warps per CTA (one 16-row tile each) instead of 4 (two each),
// kW4A16AutoWarps (32) 8 or 4 by w4a16_eight_warps;
// kW4A16WarpK (8, M <= 16) / kW4A16SplitK (16) pick the warp-K or the split-K kernel (default:
// default_w4a16_warpk).
int sm120_gemm_w4a16(int device, const void* x, const void* qweight, const void* scales,
                     const void* weight_scale_2, const void* bias, void* y, int M, int N, int K,
                     void* workspace, size_t workspace_bytes, int split_target, int flags,
                     void* stream) {
  if (!x || !qweight || !scales || !weight_scale_2 || !y)
    return set_error(kInvalidArgument, "gemm_w4a16: null pointer");
  if (M <= 0 || N <= 0 || K <= 0 || K % 16 || N % 16)
    return set_error(kInvalidArgument, "gemm_w4a16: need M > 0, N %% 16 == 0, K %% 16 == 0; got M=%d N=%d K=%d", M, N, K);
  if (!is_aligned(x, 16) || !is_aligned(qweight, 16) || !is_aligned(scales, 16) ||
      !is_aligned(workspace, 16))
    return set_error(kInvalidArgument, "gemm_w4a16: x, qweight, scales and workspace must be 16-byte aligned");
  DeviceInfo info;
  int rc = use_device(device, &info);
  if (rc != kOk) return rc;
  if ((rc = check_w4a16_flags(flags, M, "gemm_w4a16")) != kOk) return rc;
  const W4A16Plan plan = plan_w4a16(M, N, K, info.sm_count, workspace ? workspace_bytes : 0, split_target, flags);
  return launch_gemm_w4a16(x, qweight, scales, static_cast<const float*>(weight_scale_2), bias, y,
                           M, N, K, workspace, workspace_bytes, plan, (flags & kW4A16Pdl) != 0,
                           static_cast<cudaStream_t>(stream));
}

// y bf16 [M,N] = (xq . Wq^T) * input_scale * weight_scale_2 (+ bias). xq: P-order packed
// activations [M,K/2] and their swizzled scales from sm120_quantize_nvfp4(p_order=1).
// mode: 0 = hardware MMA on SM120 else emulation, 1 = hardware (SM120 only), 2 = emulation.
int sm120_gemm_w4a4(int device, const void* xq, const void* x_scales, const void* input_scale,
                    const void* qweight, const void* w_scales, const void* weight_scale_2,
                    const void* bias, void* y, int M, int N, int K, int mode, void* stream) {
  if (!xq || !x_scales || !input_scale || !qweight || !w_scales || !weight_scale_2 || !y)
    return set_error(kInvalidArgument, "gemm_w4a4: null pointer");
  if (M <= 0 || N <= 0 || K <= 0 || K % 32 || N % 16)
    return set_error(kInvalidArgument, "gemm_w4a4: need M > 0, N %% 16 == 0, K %% 32 == 0; got M=%d N=%d K=%d", M, N, K);
  if (!is_aligned(xq, 16) || !is_aligned(x_scales, 16) || !is_aligned(qweight, 16) ||
      !is_aligned(w_scales, 16) || !is_aligned(y, 16))
    return set_error(kInvalidArgument, "gemm_w4a4: xq, x_scales, qweight, w_scales and y must be 16-byte aligned");
  if (mode < 0 || mode > 2) return set_error(kInvalidArgument, "gemm_w4a4: mode must be 0, 1 or 2");
  DeviceInfo info;
  int rc = use_device(device, &info);
  if (rc != kOk) return rc;
  const bool sm120 = info.major == 12;
  if (mode == 1 && !sm120)
    return set_error(kUnsupportedDevice, "gemm_w4a4: the block-scaled FP4 MMA needs an SM120 device (this is sm_%d%d)",
                     info.major, info.minor);
  const bool hw = mode == 1 || (mode == 0 && sm120);
  return launch_gemm_w4a4(xq, x_scales, static_cast<const float*>(input_scale), qweight, w_scales,
                          static_cast<const float*>(weight_scale_2), bias, y, M, N, K, hw,
                          static_cast<cudaStream_t>(stream));
}

static bool moe_k_warps_ok(int k_warps) {
  return k_warps == 0 || k_warps == 1 || k_warps == 2 || k_warps == 4 || k_warps == 8;
}

static bool moe_m_tiles_ok(int m_tiles) { return m_tiles == 0 || m_tiles == 1 || m_tiles == 2 || m_tiles == 4; }

// Plan of sm120_moe_w4a16 (host only): out = {m_tiles, rows per work item, work items (the size of
// the `work` buffer in int4), gate_up warps per tile, down warps per tile}. *_k_warps: 0 = the
// plan's choice, else 1, 2, 4 or 8 warps per 16-row tile; m_tiles: 0 = the plan's, else 1, 2 or 4
// 8-token MMA tiles per work item (both for sweeps).
int sm120_moe_w4a16_plan(int T, int topk, int E, int H, int I, int gate_up_k_warps, int down_k_warps, int m_tiles,
                         int* out) {
  if (T <= 0 || topk <= 0 || E <= 0 || E > kMoeMaxExperts || H <= 0 || I <= 0 || out == nullptr)
    return set_error(kInvalidArgument, "moe_w4a16_plan: need T, topk, H, I > 0 and 0 < E <= %d; got T=%d topk=%d E=%d H=%d I=%d",
                     kMoeMaxExperts, T, topk, E, H, I);
  if (!moe_k_warps_ok(gate_up_k_warps) || !moe_k_warps_ok(down_k_warps))
    return set_error(kInvalidArgument, "moe_w4a16_plan: warps per tile must be 0 (auto), 1, 2, 4 or 8; got gate_up %d, down %d",
                     gate_up_k_warps, down_k_warps);
  if (!moe_m_tiles_ok(m_tiles))
    return set_error(kInvalidArgument, "moe_w4a16_plan: m_tiles must be 0 (auto), 1, 2 or 4; got %d", m_tiles);
  const MoePlan p = plan_moe_w4a16(T, topk, E, H, I, gate_up_k_warps, down_k_warps, m_tiles);
  out[0] = p.m_tiles;
  out[1] = p.rows_per_item;
  out[2] = p.max_items;
  out[3] = p.gate_up_k_warps;
  out[4] = p.down_k_warps;
  return kOk;
}

// out bf16 [T, H] = scale * sum_k topk_weights[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)),
// e = topk_ids[t, k]; ids outside [0, E) contribute nothing. Weights packed by kernels/moe.py
// (pack_experts); sorted_slots int32 [T * topk], work int4 [plan's work items], work_count int32,
// act bf16 [T * topk, I] and y bf16 [T * topk, H] are scratch the caller owns (no zeroing needed).
// m_tiles as in the plan; pdl: programmatic dependent launch between the call's own kernels (moe_w4a16.cu).
int sm120_moe_w4a16(int device, const void* hidden, const void* topk_ids, const void* topk_weights,
                    const void* w13, const void* w13_scales, const void* w13_alpha, const void* w2,
                    const void* w2_scales, const void* w2_alpha, void* sorted_slots, void* work,
                    void* work_count, void* act, void* y, void* out, int T, int topk, int E, int H,
                    int I, float scale, int gate_up_k_warps, int down_k_warps, int m_tiles, int pdl, void* stream) {
  if (!hidden || !topk_ids || !topk_weights || !w13 || !w13_scales || !w13_alpha || !w2 || !w2_scales ||
      !w2_alpha || !sorted_slots || !work || !work_count || !act || !y || !out)
    return set_error(kInvalidArgument, "moe_w4a16: null pointer");
  if (T <= 0 || topk <= 0 || E <= 0 || E > kMoeMaxExperts || H <= 0 || I <= 0 || H % 16 || I % 16)
    return set_error(kInvalidArgument,
                     "moe_w4a16: need T, topk > 0, 0 < E <= %d, H and I multiples of 16; got T=%d topk=%d E=%d H=%d I=%d",
                     kMoeMaxExperts, T, topk, E, H, I);
  const int64_t S = (int64_t)T * topk;
  if ((int64_t)T * H >= (int64_t)1 << 31 || S * I >= (int64_t)1 << 31 || S >= (int64_t)1 << 31)
    return set_error(kInvalidArgument, "moe_w4a16: T * H and T * topk * I must stay below 2^31 elements; got T=%d topk=%d H=%d I=%d",
                     T, topk, H, I);
  if (!is_aligned(hidden, 16) || !is_aligned(w13, 16) || !is_aligned(w13_scales, 16) || !is_aligned(w2, 16) ||
      !is_aligned(w2_scales, 16) || !is_aligned(work, 16) || !is_aligned(act, 16) || !is_aligned(y, 16) ||
      !is_aligned(out, 16))
    return set_error(kInvalidArgument, "moe_w4a16: hidden, weights, scales, work, act, y and out must be 16-byte aligned");
  if (!moe_k_warps_ok(gate_up_k_warps) || !moe_k_warps_ok(down_k_warps))
    return set_error(kInvalidArgument, "moe_w4a16: warps per tile must be 0 (auto), 1, 2, 4 or 8; got gate_up %d, down %d",
                     gate_up_k_warps, down_k_warps);
  if (!moe_m_tiles_ok(m_tiles))
    return set_error(kInvalidArgument, "moe_w4a16: m_tiles must be 0 (auto), 1, 2 or 4; got %d", m_tiles);
  DeviceInfo info;
  int rc = use_device(device, &info);
  if (rc != kOk) return rc;
  MoeArgs a{};
  a.hidden = hidden;
  a.topk_ids = static_cast<const int*>(topk_ids);
  a.topk_weights = static_cast<const float*>(topk_weights);
  a.w13 = w13;
  a.w13_scales = w13_scales;
  a.w13_alpha = static_cast<const float*>(w13_alpha);
  a.w2 = w2;
  a.w2_scales = w2_scales;
  a.w2_alpha = static_cast<const float*>(w2_alpha);
  a.sorted_slots = static_cast<int*>(sorted_slots);
  a.work = work;
  a.work_count = static_cast<int*>(work_count);
  a.act = act;
  a.y = y;
  a.out = out;
  a.T = T;
  a.topk = topk;
  a.E = E;
  a.H = H;
  a.I = I;
  a.scale = scale;
  a.pdl = pdl != 0;
  return launch_moe_w4a16(a, plan_moe_w4a16(T, topk, E, H, I, gate_up_k_warps, down_k_warps, m_tiles),
                          static_cast<cudaStream_t>(stream));
}

}  // extern "C"
