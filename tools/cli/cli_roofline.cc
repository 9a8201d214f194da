// kvmem roofline: is decode attention over a streaming video KV cache
// memory- or compute-bound, and what does kvmem's budgeted recall change?
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "engine/accel/device_profile.h"
#include "engine/codec/dtype.h"
#include "tools/bench/roofline.h"
#include "tools/cli/cli.h"
#include "tools/common/json_writer.h"

ABSL_FLAG(uint32_t, q_heads, 0,
          "roofline: query heads per layer (0: 4 x --kv_heads, grouped-query "
          "attention as in Llama-3-8B / Mistral-7B).");
ABSL_FLAG(std::string, dtype, "fp16", "roofline: KV dtype (fp16, bf16, fp32).");
ABSL_FLAG(uint64_t, context, 10000,
          "roofline: tokens a full-KV decode step attends to.");
ABSL_FLAG(std::string, profile, "",
          "roofline: device profile file (deploy/profiles/*.toml); "
          "--memory_gib, --bandwidth_gbs and --tflops override it.");
ABSL_FLAG(double, memory_gib, 0, "roofline: device memory for the KV cache.");
ABSL_FLAG(double, bandwidth_gbs, 0, "roofline: DRAM bandwidth, GB/s (1e9).");
ABSL_FLAG(double, tflops, 0, "roofline: peak fp16 compute, TFLOP/s.");

ABSL_DECLARE_FLAG(uint32_t, layers);
ABSL_DECLARE_FLAG(uint32_t, kv_heads);
ABSL_DECLARE_FLAG(uint32_t, head_dim);
ABSL_DECLARE_FLAG(uint32_t, tokens_per_frame);
ABSL_DECLARE_FLAG(uint32_t, hot_window_tokens);
ABSL_DECLARE_FLAG(double, fps);
ABSL_DECLARE_FLAG(double, recall_fraction);

namespace kvmem {
namespace {

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", b, units[u]);
}

std::string Seconds(double s) {
  if (s <= 0) return "n/a";
  if (s < 1e-3) return absl::StrFormat("%.1f us", s * 1e6);
  if (s < 1) return absl::StrFormat("%.2f ms", s * 1e3);
  if (s < 120) return absl::StrFormat("%.1f s", s);
  return absl::StrFormat("%.1f min", s / 60);
}

void CaseJson(const RooflineCase& c, JsonWriter* w) {
  w->Object();
  w->Key("tokens").UInt(c.tokens);
  w->Key("bytes_per_step").Num(c.bytes_per_step, 0);
  w->Key("flops_per_step").Num(c.flops_per_step, 0);
  w->Key("arithmetic_intensity").Num(c.intensity, 4);
  w->Key("memory_time_s").Num(c.memory_time_s, 9);
  w->Key("compute_time_s").Num(c.compute_time_s, 9);
  w->Key("verdict").Str(
      c.compute_time_s == 0 && c.memory_time_s == 0
          ? "unknown"
          : (c.memory_bound ? "memory-bound" : "compute-bound"));
  w->EndObject();
}

}  // namespace

int RunRoofline(const std::vector<std::string>&) {
  RooflineInput in;
  in.layers = FlagOr(FLAGS_layers, "layers", in.layers);
  in.kv_heads = FlagOr(FLAGS_kv_heads, "kv_heads", in.kv_heads);
  in.head_dim = FlagOr(FLAGS_head_dim, "head_dim", in.head_dim);
  in.tokens_per_frame =
      FlagOr(FLAGS_tokens_per_frame, "tokens_per_frame", in.tokens_per_frame);
  in.window = FlagOr(FLAGS_hot_window_tokens, "hot_window_tokens", in.window);
  in.fps = absl::GetFlag(FLAGS_fps);
  in.recall_fraction = absl::GetFlag(FLAGS_recall_fraction);
  in.context = absl::GetFlag(FLAGS_context);
  in.q_heads = absl::GetFlag(FLAGS_q_heads) == 0 ? 4 * in.kv_heads
                                                 : absl::GetFlag(FLAGS_q_heads);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "fp16" || dtype == "bf16") {
    in.dtype_bytes = 2;
  } else if (dtype == "fp32") {
    in.dtype_bytes = 4;
  } else {
    std::fprintf(stderr,
                 "kvmem roofline: --dtype is \"%s\"; use fp16, bf16 or fp32\n",
                 dtype.c_str());
    return 2;
  }
  if (in.layers == 0 || in.kv_heads == 0 || in.head_dim == 0 ||
      in.tokens_per_frame == 0 || !(in.fps > 0) || in.context == 0) {
    std::fprintf(stderr,
                 "kvmem roofline: --layers, --kv_heads, --head_dim, "
                 "--tokens_per_frame, --fps and --context must be > 0\n");
    return 2;
  }
  std::string device = "unspecified device";
  double memory_gib = 0, bandwidth_gbs = 0, tflops = 0;
  if (!absl::GetFlag(FLAGS_profile).empty()) {
    auto p = LoadDeviceProfile(absl::GetFlag(FLAGS_profile));
    if (!p.ok()) {
      std::fprintf(stderr, "kvmem roofline: %s\n",
                   std::string(p.status().message()).c_str());
      return p.status().code() == absl::StatusCode::kNotFound ? 1 : 2;
    }
    device = p->name.empty() ? absl::GetFlag(FLAGS_profile) : p->name;
    memory_gib = p->Get("memory_gib", 0);
    bandwidth_gbs = p->Get("dram_bandwidth_gbs", 0);
    tflops = p->Get("peak_fp16_tflops", 0);
  }
  if (absl::GetFlag(FLAGS_memory_gib) > 0)
    memory_gib = absl::GetFlag(FLAGS_memory_gib);
  if (absl::GetFlag(FLAGS_bandwidth_gbs) > 0)
    bandwidth_gbs = absl::GetFlag(FLAGS_bandwidth_gbs);
  if (absl::GetFlag(FLAGS_tflops) > 0) tflops = absl::GetFlag(FLAGS_tflops);
  in.memory_bytes = memory_gib * 1024.0 * 1024 * 1024;
  in.bandwidth_bytes_per_s = bandwidth_gbs * 1e9;
  in.peak_flops = tflops * 1e12;
  const RooflineResult r = ComputeRoofline(in);

  if (absl::GetFlag(FLAGS_json)) {
    JsonWriter w;
    w.Object(/*multiline=*/true);
    w.Key("layers").UInt(in.layers);
    w.Key("kv_heads").UInt(in.kv_heads);
    w.Key("q_heads").UInt(in.q_heads);
    w.Key("head_dim").UInt(in.head_dim);
    w.Key("dtype").Str(dtype);
    w.Key("fps").Num(in.fps);
    w.Key("tokens_per_frame").UInt(in.tokens_per_frame);
    w.Key("context").UInt(in.context);
    w.Key("device").Str(device);
    w.Key("memory_bytes").Num(in.memory_bytes, 0);
    w.Key("bandwidth_bytes_per_s").Num(in.bandwidth_bytes_per_s, 0);
    w.Key("peak_flops").Num(in.peak_flops, 0);
    w.Key("kv_bytes_per_token").UInt(r.kv_bytes_per_token);
    w.Key("kv_growth_bytes_per_s").Num(r.kv_growth_bytes_per_s, 0);
    w.Key("seconds_until_full").Num(r.seconds_until_full, 3);
    w.Key("ridge_flops_per_byte").Num(r.ridge, 4);
    w.Key("full");
    CaseJson(r.full, &w);
    w.Key("kvmem");
    CaseJson(r.kvmem, &w);
    w.Key("kvmem_window_tokens").UInt(in.window);
    w.Key("kvmem_recall_tokens").UInt(r.recall_tokens);
    w.Key("kvmem_recall_bytes_per_query").Num(r.recall_bytes_per_frame, 0);
    w.EndObject();
    std::printf("%s", w.Take().c_str());
    return 0;
  }
  std::printf(
      "model        %u layers x %u KV heads (%u query heads) x %u "
      "head_dim, %s\n",
      in.layers, in.kv_heads, in.q_heads, in.head_dim, dtype.c_str());
  std::printf("KV / token   %llu bytes (%s)\n",
              static_cast<unsigned long long>(r.kv_bytes_per_token),
              Bytes(r.kv_bytes_per_token).c_str());
  std::printf("KV growth    %g fps x %u tokens: %.0f bytes/s (%s/s)\n", in.fps,
              in.tokens_per_frame, r.kv_growth_bytes_per_s,
              Bytes(r.kv_growth_bytes_per_s).c_str());
  std::printf("device       %s: %s memory, %.1f GB/s, %.2f TFLOP/s fp16",
              device.c_str(),
              memory_gib > 0 ? Bytes(in.memory_bytes).c_str() : "?",
              bandwidth_gbs, tflops);
  if (r.ridge > 0) std::printf("; ridge %.1f FLOP/byte", r.ridge);
  std::printf("\n");
  if (r.seconds_until_full > 0) {
    std::printf("memory full  after %s of video with full KV\n",
                Seconds(r.seconds_until_full).c_str());
  }
  std::printf("\n%-22s %22s %22s\n", "per decode step",
              absl::StrFormat("full KV (%llu tok)",
                              static_cast<unsigned long long>(r.full.tokens))
                  .c_str(),
              absl::StrFormat("kvmem (W %u + R %u)", in.window, r.recall_tokens)
                  .c_str());
  auto row = [](const char* what, const std::string& a, const std::string& b) {
    std::printf("%-22s %22s %22s\n", what, a.c_str(), b.c_str());
  };
  row("bytes read", absl::StrFormat("%.0f", r.full.bytes_per_step),
      absl::StrFormat("%.0f", r.kvmem.bytes_per_step));
  row("FLOPs", absl::StrFormat("%.3g", r.full.flops_per_step),
      absl::StrFormat("%.3g", r.kvmem.flops_per_step));
  row("intensity (FLOP/B)", absl::StrFormat("%.2f", r.full.intensity),
      absl::StrFormat("%.2f", r.kvmem.intensity));
  row("memory time", Seconds(r.full.memory_time_s),
      Seconds(r.kvmem.memory_time_s));
  row("compute time", Seconds(r.full.compute_time_s),
      Seconds(r.kvmem.compute_time_s));
  auto verdict = [&](const RooflineCase& c) -> std::string {
    if (r.ridge == 0) return "needs a device";
    return c.memory_bound ? "memory-bound" : "compute-bound";
  };
  row("verdict", verdict(r.full), verdict(r.kvmem));
  std::printf(
      "\nkvmem reads %.1f %% of full KV's bytes per step; each recall "
      "moves up to %s of KV\n",
      100.0 * r.kvmem.bytes_per_step / r.full.bytes_per_step,
      Bytes(r.recall_bytes_per_frame).c_str());
  return 0;
}

}  // namespace kvmem
