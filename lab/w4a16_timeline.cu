// Where a W4A16 call's microseconds go, per CTA, on a real GPU: a standalone probe (no torch, no
// Python) built from csrc/ with SM120_W4A16_TIMELINE, which makes thread 0 of every CTA stamp the
// global timer at five milestones (csrc/kernels.h, W4A16Stamps).
//
// Build (sm_90a here or on the host; the library build never defines the macro):
//   nvcc -O3 -std=c++17 -DSM120_W4A16_TIMELINE -gencode arch=compute_90a,code=sm_90a -Icsrc \
//        csrc/*.cu lab/w4a16_timeline.cu -o w4a16_timeline
// Run: ./w4a16_timeline N,K,M[,split_target[,kernel]] ...   (one JSON line per case on stdout)
//      kernel: 0 = the plan's default, 1 = warp-K (M <= 16), 2 = split-K
//
// Per case: the plain-launch time per call in a CUDA-graph chain over rotating weight copies
// (> 2x L2, like benchmarks/bench_fp4_gemm.py), then 7 stamped launches, each on a weight copy
// the chain has not touched since it was last evicted, reported as medians over the launches of:
//   ramp       last CTA start - first CTA start
//   first      per CTA: start -> first pipeline stage in shared memory (DRAM latency + issue)
//   compute    per CTA: first stage -> last stage computed
//   handoff    per split CTA: last stage -> ticket taken (partial stores, barrier, atomic)
//   reduce     last CTA of a tile: ticket -> output stored (partial loads, sum, store)
//   span       last stamp - first CTA start (the kernel's own time, launch overhead excluded)
// For the warp-K kernel (gemm_w4a16_warpk.cu) thread 0 is warp 0's lane 0: first = its first load
// batch arrived and computed, compute = the rest of its K slice, handoff = the CTA barrier, the warp
// sums and (cluster plans) the DSMEM exchange, reduce = the output store.
// Values are random bytes: the numbers do not matter for time, only the bytes moved.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"

namespace {

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "w4a16_timeline: %s: %s\n", #x, cudaGetErrorString(e_));            \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void fill_random(void* dev, size_t bytes, unsigned seed, unsigned char lo, unsigned char hi) {
  std::vector<unsigned char> h(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    seed = seed * 1664525u + 1013904223u;
    h[i] = (unsigned char)(lo + (seed >> 24) % (hi - lo + 1));
  }
  CHECK(cudaMemcpy(dev, h.data(), bytes, cudaMemcpyHostToDevice));
}

struct Case {
  int n, k, m, target, kernel;
};

void run_case(const Case& c, int sms, size_t l2_bytes) {
  const int n_pad = (c.n + 127) / 128 * 128;
  const size_t w_bytes = (size_t)n_pad * c.k / 2, s_bytes = (size_t)n_pad * (c.k / 16);
  const int copies = std::max<int>(2, (int)((2 * l2_bytes) / (w_bytes + s_bytes)) + 1);
  std::vector<void*> w(copies), s(copies);
  for (int i = 0; i < copies; ++i) {
    CHECK(cudaMalloc(&w[i], w_bytes));
    CHECK(cudaMalloc(&s[i], s_bytes));
    fill_random(w[i], w_bytes, 1 + i, 0, 255);
    fill_random(s[i], s_bytes, 7 + i, 0x30, 0x40);  // e4m3 0.5 .. 2: finite products
  }
  void *x, *y, *ws;
  float* ws2;
  const size_t ws_bytes = 64u << 20;
  CHECK(cudaMalloc(&x, (size_t)c.m * c.k * 2));
  fill_random(x, (size_t)c.m * c.k * 2, 99, 0x30, 0x3f);  // bf16 high bytes vary, small values
  CHECK(cudaMalloc(&y, (size_t)c.m * c.n * 2));
  CHECK(cudaMalloc(&ws, ws_bytes));
  CHECK(cudaMemset(ws, 0, ws_bytes));
  CHECK(cudaMalloc(&ws2, sizeof(float)));
  const float one = 1.0f;
  CHECK(cudaMemcpy(ws2, &one, sizeof(float), cudaMemcpyHostToDevice));
  const int flags = c.kernel == 1 ? sm120::kW4A16WarpK : c.kernel == 2 ? sm120::kW4A16SplitK : 0;
  const sm120::W4A16Plan plan = sm120::plan_w4a16(c.m, c.n, c.k, sms, ws_bytes, c.target, flags);
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto launch = [&](int i) {
    const int rc = sm120::launch_gemm_w4a16(x, w[i], s[i], ws2, nullptr, y, c.m, c.n, c.k, ws, ws_bytes, plan,
                                            /*pdl=*/false, st);  // 4 warps: the plan has no warp flag
    if (rc != 0) {
      fprintf(stderr, "w4a16_timeline: launch failed (%d)\n", rc);
      exit(1);
    }
  };
  // Graph chain over every copy, replayed: the per-call time the benchmark reports.
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < copies; ++i) launch(i);
  CHECK(cudaStreamEndCapture(st, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<double> per_call;
  for (int r = 0; r < 8; ++r) {
    CHECK(cudaEventRecord(e0, st));
    CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaEventRecord(e1, st));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r > 0) per_call.push_back(1000.0 * ms / copies);
  }
  // Stamped launches: the chain first runs every copy but the next one, so that copy is cold.
  const int ctas = plan.n_ctas * plan.splits * plan.m_blocks;
  sm120::W4A16Stamps* stamps;
  CHECK(cudaMalloc(&stamps, sizeof(sm120::W4A16Stamps) * ctas));
  std::vector<sm120::W4A16Stamps> h(ctas);
  std::vector<double> ramp, first, compute, handoff, reduce, span;
  for (int r = 0; r < 7; ++r) {
    const int cold = r % copies;
    for (int i = 1; i < copies; ++i) launch((cold + i) % copies);
    CHECK(cudaStreamSynchronize(st));
    CHECK(cudaMemset(stamps, 0, sizeof(sm120::W4A16Stamps) * ctas));
    CHECK(sm120::w4a16_attach_stamps(stamps));
    launch(cold);
    CHECK(cudaStreamSynchronize(st));
    CHECK(sm120::w4a16_attach_stamps(nullptr));
    CHECK(cudaMemcpy(h.data(), stamps, sizeof(sm120::W4A16Stamps) * ctas, cudaMemcpyDeviceToHost));
    unsigned long long t0_min = ~0ull, t0_max = 0, t_end = 0;
    std::vector<double> f, cp, ho, rd;
    for (const auto& a : h) {
      t0_min = std::min(t0_min, a.t[0]);
      t0_max = std::max(t0_max, a.t[0]);
      for (int k = 0; k < 5; ++k) t_end = std::max(t_end, a.t[k]);
      if (a.t[1]) f.push_back((a.t[1] - a.t[0]) * 1e-3);
      if (a.t[1] && a.t[2]) cp.push_back((a.t[2] - a.t[1]) * 1e-3);
      if (a.t[3]) ho.push_back((a.t[3] - a.t[2]) * 1e-3);
      if (a.t[3] && a.t[4]) rd.push_back((a.t[4] - a.t[3]) * 1e-3);
    }
    ramp.push_back((t0_max - t0_min) * 1e-3);
    span.push_back((t_end - t0_min) * 1e-3);
    first.push_back(median(f));
    compute.push_back(median(cp));
    handoff.push_back(median(ho));
    reduce.push_back(median(rd));
  }
  printf("{\"N\": %d, \"K\": %d, \"M\": %d, \"kernel\": \"%s\", \"warps\": %d, \"split_target\": %d, \"splits\": %d, \"ctas\": %d, "
         "\"chunks_per_split\": %d, \"copies\": %d, \"graph_us_per_call\": %.3f, \"ramp_us\": %.3f, "
         "\"first_stage_us\": %.3f, \"compute_us\": %.3f, \"handoff_us\": %.3f, \"reduce_us\": %.3f, "
         "\"span_us\": %.3f}\n",
         c.n, c.k, c.m, plan.warpk ? "warpk" : "split", plan.warpk ? plan.warpk_warps : 4, plan.split_target,
         plan.splits, ctas, plan.chunks_per_split, copies, median(per_call),
         median(ramp), median(first), median(compute), median(handoff), median(reduce), median(span));
  fflush(stdout);
  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaFree(stamps));
  for (int i = 0; i < copies; ++i) {
    CHECK(cudaFree(w[i]));
    CHECK(cudaFree(s[i]));
  }
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  CHECK(cudaFree(ws));
  CHECK(cudaFree(ws2));
  CHECK(cudaStreamDestroy(st));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s N,K,M[,split_target] ...\n", argv[0]);
    return 2;
  }
  int sms = 0, l2 = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  for (int i = 1; i < argc; ++i) {
    Case c{0, 0, 0, 0, 0};
    if (sscanf(argv[i], "%d,%d,%d,%d,%d", &c.n, &c.k, &c.m, &c.target, &c.kernel) < 3 || c.n <= 0 || c.k % 64 ||
        c.m <= 0 || c.kernel < 0 || c.kernel > 2 || (c.kernel == 1 && c.m > sm120::kW4A16WarpKMaxM)) {
      fprintf(stderr, "w4a16_timeline: bad case %s (N,K,M[,split_target[,kernel 0|1|2]]; K a multiple of 64, "
              "warp-K at M <= %d)\n", argv[i], sm120::kW4A16WarpKMaxM);
      return 2;
    }
    run_case(c, sms, (size_t)l2);
  }
  return 0;
}
