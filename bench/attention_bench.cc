// Causal attention forward and backward at a language model's shapes on one device: the fused kernels
// (fused_causal_attention, core/ops/attention.h) beside the composition they replace (key/value heads repeated
// for grouped-query attention, then bmm, the causal mask, softmax and bmm: what the layer runs where the fused
// kernels do not apply), in float32 and under autocast. Prints the best time of a forward plus backward and its
// rate, counting FLOPs as FlashAttention's papers do: a causal forward is 2 B H T^2 d multiply-adds' FLOPs
// (half of the two T x T x d products), the backward 2.5 times that.
//
// Usage: bazel run //bench:attention_bench -- [--device=cuda:0] [--batch=8] [--heads=12] [--kv-heads=12]
//        [--seq-len=1024] [--head-dim=64] [--seconds=1]
// Defaults: the 124M Llama's attention (12 heads of 64, 1,024 tokens) at batch 8, on cpu:0.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench/best_time.h"
#include "core/amp/autocast.h"
#include "core/autograd/backward.h"
#include "core/device.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/attention.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace {

using namespace dpe;

struct Options {
  Device device = Device::cpu(0);
  int64_t batch = 8, heads = 12, kv_heads = 12, seq_len = 1024, head_dim = 64;
  double seconds = 1.0;
};

int64_t positive(std::string_view arg, size_t prefix) {
  const std::string value(arg.substr(prefix));
  char* end = nullptr;
  const long long n = std::strtoll(value.c_str(), &end, 10);
  DPE_CHECK(!value.empty() && *end == '\0' && n > 0, arg.substr(0, prefix - 1), "=", value,
            ": expected a positive integer");
  return n;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--device=")) {
      o.device = Device::parse(arg.substr(9));
    } else if (arg.starts_with("--batch=")) {
      o.batch = positive(arg, 8);
    } else if (arg.starts_with("--heads=")) {
      o.heads = positive(arg, 8);
    } else if (arg.starts_with("--kv-heads=")) {
      o.kv_heads = positive(arg, 11);
    } else if (arg.starts_with("--seq-len=")) {
      o.seq_len = positive(arg, 10);
    } else if (arg.starts_with("--head-dim=")) {
      o.head_dim = positive(arg, 11);
    } else if (arg.starts_with("--seconds=")) {
      o.seconds = static_cast<double>(positive(arg, 10));
    } else {
      DPE_CHECK(false, "unknown argument '", arg,
                "' (expected --device=D, --batch=N, --heads=N, --kv-heads=N, --seq-len=N, --head-dim=N, --seconds=N)");
    }
  }
  DPE_CHECK(o.heads % o.kv_heads == 0, "--heads=", o.heads, " is not a multiple of --kv-heads=", o.kv_heads);
  return o;
}

// The best time in ms of one forward and backward of `attention` on fresh leaves viewing q, k, v, finished on
// the device.
double fwd_bwd_ms(const Options& o, std::optional<DType> autocast,
                  Tensor (*attention)(const Tensor&, const Tensor&, const Tensor&), const Tensor& q, const Tensor& k,
                  const Tensor& v, const Tensor& dout) {
  return dpe::bench::best_ms(o.seconds, [&] {
    const Tensor qa = q.detach().set_requires_grad(true), ka = k.detach().set_requires_grad(true),
                 va = v.detach().set_requires_grad(true);
    Tensor out;
    {
      amp::AutocastGuard guard(o.device.kind, autocast, autocast.has_value());
      out = attention(qa, ka, va);
    }
    autograd::grad({out}, {dout}, {qa, ka, va});
    synchronize(o.device);
  });
}

Tensor fused(const Tensor& q, const Tensor& k, const Tensor& v) { return fused_causal_attention(q, k, v); }

Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), d = q.size(3), Hkv = k.size(1);
  auto repeat = [&](const Tensor& t) {
    return Hkv == H ? t : t.unsqueeze(2).expand({B, Hkv, H / Hkv, T, d}).reshape({B, H, T, d});
  };
  const Tensor mask = causal_attention_mask(T, T, TensorOptions(q.dtype()).with_device(q.device()));
  return scaled_dot_product_attention(q, repeat(k), repeat(v), mask);
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const TensorOptions options = TensorOptions(DType::Float32).with_device(o.device);
  const int64_t B = o.batch, H = o.heads, Hkv = o.kv_heads, T = o.seq_len, d = o.head_dim;
  // The layer's operands: (B, T, heads, d) projections seen as (B, heads, T, d).
  const Tensor q = randn({B, T, H, d}, options).permute({0, 2, 1, 3});
  const Tensor k = randn({B, T, Hkv, d}, options).permute({0, 2, 1, 3});
  const Tensor v = randn({B, T, Hkv, d}, options).permute({0, 2, 1, 3});
  const Tensor dout = randn({B, H, T, d}, options);
  const double gflop = 3.5 * 2.0 * static_cast<double>(B * H * T) * static_cast<double>(T * d) / 1e9;
  std::printf("# causal attention on %s: B %lld, heads %lld (key/value heads %lld), T %lld, d %lld; %.1f GFLOP per "
              "forward + backward (causal, FlashAttention's count)\n",
              o.device.str().c_str(), static_cast<long long>(B), static_cast<long long>(H),
              static_cast<long long>(Hkv), static_cast<long long>(T), static_cast<long long>(d), gflop);
  std::printf("%-10s %-12s %12s %10s\n", "precision", "path", "fwd+bwd ms", "TFLOP/s");
  std::vector<std::optional<DType>> precisions = {std::nullopt};
  if (o.device.is_cuda()) {
    precisions.push_back(DType::BFloat16);
  } else if (amp::cpu_supports_bf16()) {
    precisions.push_back(DType::BFloat16);
  }
  for (const std::optional<DType>& autocast : precisions) {
    const std::string precision = autocast ? std::string(dtype_name(*autocast)) : "float32";
    bool applies = false;
    {
      amp::AutocastGuard guard(o.device.kind, autocast, autocast.has_value());
      applies = fused_causal_attention_applies(q, k, v);
    }
    for (bool use_fused : {true, false}) {
      if (use_fused && !applies) {
        std::printf("%-10s %-12s %12s %10s  (fused_causal_attention_applies is false here)\n", precision.c_str(),
                    "fused", "-", "-");
        continue;
      }
      const double ms = fwd_bwd_ms(o, autocast, use_fused ? fused : composed, q, k, v, dout);
      std::printf("%-10s %-12s %12.3f %10.2f\n", precision.c_str(), use_fused ? "fused" : "composition", ms,
                  gflop / ms);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
}
