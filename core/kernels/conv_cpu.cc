// CPU 2-d convolution (core/kernels/conv.h).
//
// float32: oneDNN's convolution primitives (forward_training, backward_data, backward_weights) in the
// layouts oneDNN chooses, the callers' plain NCHW / OIHW (goihw for groups > 1) memory reordered in and out
// at each call (Note [oneDNN's layouts]); oneDNN JIT-compiles for the CPU it finds. A primitive is built
// once per (kind, dtype, shape) and cached (Note [oneDNN primitive cache]).
// bfloat16 operands (conv.h): the same primitives with bfloat16 inputs and float32 outputs (oneDNN 2.6's
// jit_bf16 / AMX kernels where the CPU has them).
// float64: oneDNN has no f64 convolution, so im2col (a copy loop) + gemm_cpu (OpenBLAS dgemm); used by the
// gradient checks, where speed does not matter but exactness does.
//
// Note [oneDNN primitive cache]
// Building a oneDNN primitive JIT-compiles code (milliseconds), so primitives are kept, keyed by every field of
// Conv2dShape plus the pass and the calling thread's omp_get_max_threads(), in a PrimitiveCache
// (core/kernels/primitive_cache.h: the most recently used kPrimitiveCacheCapacity, so shapes that keep changing do
// not grow it without end); a training loop hits the same few shapes every step. Primitives are immutable and
// their scratchpad is user-provided (scratchpad_mode::user, taken per call from the calling thread's scratch
// cache, core/kernels/scratch.h), so one primitive may execute on several threads at once (one per CPU device
// worker). Each call makes its own dnnl::stream. oneDNN parallelises with OpenMP using the calling thread's
// omp_get_max_threads() (each device worker sets its share, see docs/DESIGN.md, "Threads, streams, errors"), and a
// primitive keeps the work split of the thread count it was built for: without the count in the key, a
// backward-weights primitive built on a one-core device worker ran on one of the two cores of a later caller that
// had both (the CNN's `single-all` row after `single`: 112% of `single` where alone it gives ~165%), as the matmul
// cache already knew.
//
// Contract: outputs are overwritten, as conv.h says. Results do not depend on the number of threads for
// float64 (GEMMs in a fixed order); oneDNN's float32 kernels are deterministic for a fixed thread count.
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/kernels/conv.h"
#include "core/kernels/copy.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/matmul.h"
#include "core/kernels/onednn.h"
#include "core/kernels/primitive_cache.h"
#include "core/kernels/scratch.h"

namespace dpe::kernels {
namespace {

using detail::onednn_cpu_engine;

// ---------------------------------------------------------------------------------------------------------
// float32: oneDNN.

// BackwardWeightsBias: backward weights that also sums dy into the bias gradient (float32, or bfloat16 on
// float32 activations).
enum class Pass : int { Forward, ForwardNoBias, BackwardData, BackwardWeights, BackwardWeightsBias };

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, int64_t, int>;

// The calling thread's omp_get_max_threads() is part of the key (Note [oneDNN primitive cache]).
Key key_of(Pass pass, const Conv2dShape& s) {
  return {((static_cast<int>(pass) * 16 + static_cast<int>(s.dtype)) * 2 + (s.f32_activations ? 1 : 0)) * 2 +
              (s.channels_last ? 1 : 0),
          s.n,
          s.c_in,
          s.h,
          s.w,
          s.c_out,
          s.kh,
          s.kw,
          s.stride_h,
          s.stride_w,
          s.pad_h,
          s.pad_w,
          s.dil_h,
          s.dil_w,
          s.groups,
          omp_get_max_threads()};
}

using dims = dnnl::memory::dims;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

struct Descs {
  dnnl::memory::desc src, weights, bias, dst;
  dims strides, dilates, pad_l, pad_r;
};

// Descriptors of one pass: conv.h's plain layouts (NCHW / OIHW / GOIHW), or with `any` the same shapes and
// types in the layouts oneDNN may choose (Note [oneDNN's layouts]). oneDNN's dilation counts the gaps
// (PyTorch's dilation - 1); padding is symmetric, and oneDNN's output-size formula floors like PyTorch's.
// Types: float32 throughout, or (bfloat16 operands, conv.h) the pass's inputs in bfloat16 and its output and
// the bias in float32: forward x, w -> y; backward data dy, w -> dx; backward weights x, dy -> dw. `hint`
// (the forward descriptor the backward passes are created against) has every tensor in the operand type.
// With f32_activations the plain x and dy are float32 (conv.h): the relayout converts them.
Descs descs_of(const Conv2dShape& s, Pass pass, bool any, bool hint = false) {
  const dt operands = s.dtype == DType::BFloat16 ? dt::bf16 : dt::f32;
  const dt activations = !any && !hint && s.f32_activations ? dt::f32 : operands;
  const bool forward = pass == Pass::Forward || pass == Pass::ForwardNoBias;
  const dt src = hint ? operands : pass != Pass::BackwardData ? activations : dt::f32;
  const bool weights_pass = pass == Pass::BackwardWeights || pass == Pass::BackwardWeightsBias;
  const dt weights = hint || !weights_pass ? operands : dt::f32;
  const dt dst = hint ? operands : !forward ? activations : dt::f32;
  auto layout = [any](tag plain) { return any ? tag::any : plain; };
  // Channels last: the primitive is asked for NHWC activations, not the layout it prefers (nChw16c for
  // float32 and for the first convolution's bfloat16 forward), so that nothing is relaid out; measured on one
  // core (batch 128): the NHWC kernels (brgconv, jit) within 10-40% of the blocked ones' time, against
  // relayouts that cost as much as the convolution (docs/BENCHMARKS.md, "Channels last").
  const auto activation_layout = [&] { return s.channels_last ? tag::nhwc : layout(tag::nchw); };
  Descs d;
  d.src = dnnl::memory::desc({s.n, s.c_in, s.h, s.w}, src, activation_layout());
  if (s.groups == 1) {
    d.weights = dnnl::memory::desc({s.c_out, s.c_in, s.kh, s.kw}, weights, layout(tag::oihw));
  } else {
    d.weights = dnnl::memory::desc({s.groups, s.c_out / s.groups, s.c_in / s.groups, s.kh, s.kw}, weights,
                                   layout(tag::goihw));
  }
  d.bias = dnnl::memory::desc({s.c_out}, dt::f32, tag::x);
  d.dst = dnnl::memory::desc({s.n, s.c_out, s.h_out(), s.w_out()}, dst, activation_layout());
  d.strides = {s.stride_h, s.stride_w};
  d.dilates = {s.dil_h - 1, s.dil_w - 1};
  d.pad_l = {s.pad_h, s.pad_w};
  d.pad_r = {s.pad_h, s.pad_w};
  return d;
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// hint: the descriptor backward passes are created against (descs_of's `hint` types).
dnnl::convolution_forward::primitive_desc forward_pd(const Conv2dShape& s, bool with_bias, bool hint = false) {
  Descs d = descs_of(s, with_bias ? Pass::Forward : Pass::ForwardNoBias, /*any=*/true, hint);
  auto desc = with_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                          dnnl::algorithm::convolution_direct, d.src, d.weights,
                                                          d.bias, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
                        : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                          dnnl::algorithm::convolution_direct, d.src, d.weights,
                                                          d.dst, d.strides, d.dilates, d.pad_l, d.pad_r);
  return dnnl::convolution_forward::primitive_desc(desc, user_scratchpad(), onednn_cpu_engine());
}

// Note [oneDNN's layouts]
// oneDNN's direct convolutions (jit:avx512_core, brgconv and jit on AMX for bfloat16) run on blocked layouts
// (nChw16c, OIhw16i16o, ...); on plain NCHW it falls back to im2col + GEMM (x64:gemm:jit). So every
// primitive is created with format `any`, and each call reorders its plain inputs into the layouts oneDNN
// chose and its output back (cached reorder primitives, buffers from dpe). Measured on one core of the
// 2026-11-25 Xeon (AMX) VM, batch 128, 32 -> 64 channels, 14 x 14, reorders included: float32 forward
// 11.3 -> 5.5 ms, backward data 13.1 -> 5.3, backward weights 10.0 -> 5.3; bfloat16 7.5 -> 1.5, 8.4 -> 1.8,
// 6.7 -> 2.2. The activations are reordered at every call (a backward's two passes share dy's reorder:
// conv2d_backward_cpu); keeping them blocked between layers would save those copies too.
struct Relayout {
  int arg = 0;                  // DNNL_ARG_SRC, ...
  bool output = false;          // reordered from the chosen layout into the caller's after the primitive
  dnnl::memory::desc plain;     // conv.h's layout, the caller's
  dnnl::memory::desc chosen;    // the layout of the primitive's argument
  std::optional<dnnl::reorder> reorder;  // plain -> chosen (input) or chosen -> plain (output); none: equal
};

struct CachedPrimitive {
  dnnl::primitive primitive;
  size_t scratchpad_bytes = 0;
  std::vector<Relayout> relayouts;  // the pass's arguments but the bias (always plain)
};

// `arg`'s relayout between conv.h's plain layout and the one the primitive chose.
Relayout relayout_of(int arg, bool output, const dnnl::memory::desc& plain, const dnnl::memory::desc& chosen) {
  Relayout r{arg, output, plain, chosen, std::nullopt};
  if (chosen != plain) {
    const dnnl::engine& engine = onednn_cpu_engine();
    r.reorder = output ? dnnl::reorder(dnnl::reorder::primitive_desc(engine, chosen, engine, plain))
                       : dnnl::reorder(dnnl::reorder::primitive_desc(engine, plain, engine, chosen));
  }
  return r;
}

CachedPrimitive build(Pass pass, const Conv2dShape& s) {
  const Descs any = descs_of(s, pass, /*any=*/true), plain = descs_of(s, pass, /*any=*/false);
  switch (pass) {
    case Pass::Forward:
    case Pass::ForwardNoBias: {
      auto pd = forward_pd(s, pass == Pass::Forward);
      return {dnnl::convolution_forward(pd),
              pd.scratchpad_desc().get_size(),
              {relayout_of(DNNL_ARG_SRC, false, plain.src, pd.src_desc()),
               relayout_of(DNNL_ARG_WEIGHTS, false, plain.weights, pd.weights_desc()),
               relayout_of(DNNL_ARG_DST, true, plain.dst, pd.dst_desc())}};
    }
    case Pass::BackwardData: {
      auto desc = dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, any.src, any.weights,
                                                        any.dst, any.strides, any.dilates, any.pad_l, any.pad_r);
      dnnl::convolution_backward_data::primitive_desc pd(desc, user_scratchpad(), onednn_cpu_engine(),
                                                         forward_pd(s, false, true));
      return {dnnl::convolution_backward_data(pd),
              pd.scratchpad_desc().get_size(),
              {relayout_of(DNNL_ARG_DIFF_DST, false, plain.dst, pd.diff_dst_desc()),
               relayout_of(DNNL_ARG_WEIGHTS, false, plain.weights, pd.weights_desc()),
               relayout_of(DNNL_ARG_DIFF_SRC, true, plain.src, pd.diff_src_desc())}};
    }
    case Pass::BackwardWeights:
    case Pass::BackwardWeightsBias: {
      const bool bias = pass == Pass::BackwardWeightsBias;
      auto desc = bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any.src,
                                                                  any.weights, any.bias, any.dst, any.strides,
                                                                  any.dilates, any.pad_l, any.pad_r)
                       : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any.src,
                                                                  any.weights, any.dst, any.strides, any.dilates,
                                                                  any.pad_l, any.pad_r);
      dnnl::convolution_backward_weights::primitive_desc pd(desc, user_scratchpad(), onednn_cpu_engine(),
                                                            forward_pd(s, bias, true));
      return {dnnl::convolution_backward_weights(pd),
              pd.scratchpad_desc().get_size(),
              {relayout_of(DNNL_ARG_SRC, false, plain.src, pd.src_desc()),
               relayout_of(DNNL_ARG_DIFF_DST, false, plain.dst, pd.diff_dst_desc()),
               relayout_of(DNNL_ARG_DIFF_WEIGHTS, true, plain.weights, pd.diff_weights_desc())}};
    }
  }
  DPE_INTERNAL_ASSERT(false, "unknown conv pass ", static_cast<int>(pass));
}

// "for N 8, C_in 16, ...": the shape, for error messages.
std::string context_of(const Conv2dShape& s) {
  return dpe::detail::str_cat("for N ", s.n, ", C_in ", s.c_in, ", H ", s.h, ", W ", s.w, ", C_out ", s.c_out,
                              ", kernel (", s.kh, ", ", s.kw, "), groups ", s.groups);
}

// Note [oneDNN primitive cache]: the most recent kPrimitiveCacheCapacity (core/kernels/primitive_cache.h).
detail::PrimitiveCache<Key, CachedPrimitive>& primitive_cache() {
  static auto* cache = new detail::PrimitiveCache<Key, CachedPrimitive>;  // never destroyed
  return *cache;
}

std::shared_ptr<const CachedPrimitive> primitive_for(const char* what, Pass pass, const Conv2dShape& s) {
  return primitive_cache().get(key_of(pass, s), [&] {
    detail::check_space_for_onednn_build(what, context_of(s));
    return build(pass, s);
  });
}

// One argument of a call: its oneDNN id and the caller's pointer (conv.h's plain layout).
struct Arg {
  int id;
  const void* ptr;
};

// A buffer dpe allocates for oneDNN (a scratchpad, a reordered argument): from the thread's scratch cache
// (core/kernels/scratch.h), its allocation checked and named (Note [Exceptions and oneDNN]).
using Buffer = detail::ScratchBuffer;

Buffer allocate(const char* what, const char* purpose, size_t bytes, const Conv2dShape& s) {
  Buffer buffer = detail::scratch(bytes);
  DPE_CHECK_WITH(ErrorKind::OutOfMemory, buffer != nullptr, what, ": out of memory allocating the ", bytes, "-byte ",
                 purpose, " for N ", s.n, ", C_in ", s.c_in, ", H ", s.h, ", W ", s.w, ", C_out ", s.c_out);
  return buffer;
}

// Inputs already reordered into a chosen layout, for the next pass of the same call (conv2d_backward_cpu:
// backward data and backward weights read the same dy).
struct ReorderedInputs {
  struct Entry {
    const void* plain;
    dnnl::memory::desc chosen;
    dnnl::memory memory;
  };
  std::vector<Entry> entries;
  std::vector<Buffer> buffers;
};

// Runs the cached primitive of `pass` on the caller's plain buffers: the bias as it is, the other arguments
// through their relayouts (Note [oneDNN's layouts]). `reordered`: inputs reordered by an earlier pass are
// taken from it, and this pass's are added.
void run_onednn(const char* what, Pass pass, const Conv2dShape& s, std::initializer_list<Arg> args,
                ReorderedInputs* reordered = nullptr) {
  // Note [Exceptions and oneDNN] (onednn_cpu.cc): nothing thrown in here leaves as anything but a dpe::Error.
  try {
    auto prim = primitive_for(what, pass, s);
    dnnl::stream stream(onednn_cpu_engine());
    ReorderedInputs own;
    ReorderedInputs& inputs = reordered != nullptr ? *reordered : own;
    std::vector<Buffer> buffers;  // the outputs' and the scratchpad
    std::unordered_map<int, dnnl::memory> memories;
    std::vector<std::pair<const Relayout*, dnnl::memory>> outputs;  // reordered into the caller's after
    for (const Arg& a : args) {
      auto user = [&](const dnnl::memory::desc& desc) {
        return dnnl::memory(desc, onednn_cpu_engine(), const_cast<void*>(a.ptr));
      };
      if (a.id == DNNL_ARG_BIAS || a.id == DNNL_ARG_DIFF_BIAS) {
        memories.emplace(a.id, user(dnnl::memory::desc({s.c_out}, dt::f32, tag::x)));
        continue;
      }
      auto r = std::find_if(prim->relayouts.begin(), prim->relayouts.end(),
                            [&](const Relayout& x) { return x.arg == a.id; });
      DPE_INTERNAL_ASSERT(r != prim->relayouts.end(), what, ": argument ", a.id, " is not one of the pass's");
      if (!r->reorder) {
        memories.emplace(a.id, user(r->chosen));
        continue;
      }
      if (!r->output) {
        auto done = std::find_if(inputs.entries.begin(), inputs.entries.end(),
                                 [&](const auto& e) { return e.plain == a.ptr && e.chosen == r->chosen; });
        if (done != inputs.entries.end()) {
          memories.emplace(a.id, done->memory);
          continue;
        }
      }
      std::vector<Buffer>& owner = r->output ? buffers : inputs.buffers;
      owner.push_back(allocate(what, "reordered argument", r->chosen.get_size(), s));
      dnnl::memory chosen(r->chosen, onednn_cpu_engine(), owner.back().get());
      if (r->output) {
        outputs.emplace_back(&*r, user(r->plain));
      } else {
        dnnl::memory from = user(r->plain);
        r->reorder->execute(stream, from, chosen);
        inputs.entries.push_back({a.ptr, r->chosen, chosen});
      }
      memories.emplace(a.id, chosen);
    }
    if (prim->scratchpad_bytes > 0) {
      buffers.push_back(allocate(what, "oneDNN scratchpad", prim->scratchpad_bytes, s));
      // The scratchpad descriptor is a plain byte buffer of that size.
      memories.emplace(DNNL_ARG_SCRATCHPAD,
                       dnnl::memory(dnnl::memory::desc({static_cast<int64_t>(prim->scratchpad_bytes)}, dt::u8, tag::x),
                                    onednn_cpu_engine(), buffers.back().get()));
    }
    prim->primitive.execute(stream, memories);
    for (auto& [r, to] : outputs) {
      dnnl::memory from = memories.at(r->arg);
      r->reorder->execute(stream, from, to);
    }
    stream.wait();
  } catch (...) {
    // The shape was validated, so a failure is out of memory or an unsupported case in this oneDNN build.
    detail::rethrow_onednn_failure(what, context_of(s));
  }
}

// ---------------------------------------------------------------------------------------------------------
// float64: im2col + GEMM.
//
// Per sample and group, the input patch matrix `cols` is (K, L) with K = C_in/g * kH * kW rows (one per
// (channel, ki, kj) of the kernel, in the weight's memory order) and L = H_out * W_out columns; then
//   forward:          y[n, g]  (C_out/g, L) = w[g] (C_out/g, K) @ cols (K, L)
//   backward data:    dcols    (K, L)       = w[g]^T @ dy[n, g],  then col2im adds dcols into dx
//   backward weights: dw[g]    (C_out/g, K) += dy[n, g] @ cols^T  (over n, in order)

// x: (C_in/g, H, W) of one sample and group  cols: (K, L)
template <typename T>
void im2col(const Conv2dShape& s, const T* x, T* cols) {
  const int64_t cg = s.c_in / s.groups, ho = s.h_out(), wo = s.w_out();
  detail::parallel_tasks(cg * s.kh * s.kw, ho * wo, [&](int64_t row) {
    const int64_t c = row / (s.kh * s.kw), ki = row / s.kw % s.kh, kj = row % s.kw;
    T* out = cols + row * ho * wo;
    const T* plane = x + c * s.h * s.w;
    for (int64_t oi = 0; oi < ho; ++oi) {
      const int64_t i = oi * s.stride_h - s.pad_h + ki * s.dil_h;
      for (int64_t oj = 0; oj < wo; ++oj) {
        const int64_t j = oj * s.stride_w - s.pad_w + kj * s.dil_w;
        out[oi * wo + oj] = (i >= 0 && i < s.h && j >= 0 && j < s.w) ? plane[i * s.w + j] : T(0);
      }
    }
  });
}

// cols: (K, L)  dx: (C_in/g, H, W) of one sample and group, accumulated (+=). Each channel's plane is
// written by one task, its K/C_in rows added in a fixed order.
template <typename T>
void col2im(const Conv2dShape& s, const T* cols, T* dx) {
  const int64_t cg = s.c_in / s.groups, ho = s.h_out(), wo = s.w_out();
  detail::parallel_tasks(cg, s.kh * s.kw * ho * wo, [&](int64_t c) {
    T* plane = dx + c * s.h * s.w;
    for (int64_t ki = 0; ki < s.kh; ++ki) {
      for (int64_t kj = 0; kj < s.kw; ++kj) {
        const T* in = cols + ((c * s.kh + ki) * s.kw + kj) * ho * wo;
        for (int64_t oi = 0; oi < ho; ++oi) {
          const int64_t i = oi * s.stride_h - s.pad_h + ki * s.dil_h;
          if (i < 0 || i >= s.h) continue;
          for (int64_t oj = 0; oj < wo; ++oj) {
            const int64_t j = oj * s.stride_w - s.pad_w + kj * s.dil_w;
            if (j >= 0 && j < s.w) plane[i * s.w + j] += in[oi * wo + oj];
          }
        }
      }
    }
  });
}

struct GroupDims {
  int64_t cg_in, cg_out, k, l;  // C_in/g, C_out/g, K, L
};

GroupDims group_dims(const Conv2dShape& s) {
  const int64_t cg_in = s.c_in / s.groups;
  return {cg_in, s.c_out / s.groups, cg_in * s.kh * s.kw, s.h_out() * s.w_out()};
}

// c (m, n) = alpha * op(a) @ op(b) + beta * c, contiguous row-major operands.
template <typename T>
void gemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, const T* a, const T* b, double beta, T* c) {
  GemmArgs g;
  g.dtype = DType::Float64;
  static_assert(std::is_same_v<T, double>, "the im2col path is float64 only");
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.lda = ta == Transpose::No ? k : m;
  g.b = b;
  g.ldb = tb == Transpose::No ? n : k;
  g.beta = beta;
  g.c = c;
  g.ldc = n;
  gemm_cpu(g);
}

// x: (N, C_in, H, W)  w: (C_out, C_in/g, kH, kW)  b: (C_out) or null  y: (N, C_out, H_out, W_out)
void forward_im2col(const Conv2dShape& s, const double* x, const double* w, const double* b, double* y) {
  const GroupDims d = group_dims(s);
  std::vector<double> cols(static_cast<size_t>(d.k * d.l));
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t g = 0; g < s.groups; ++g) {
      im2col(s, x + (n * s.c_in + g * d.cg_in) * s.h * s.w, cols.data());
      double* yg = y + (n * s.c_out + g * d.cg_out) * d.l;
      gemm(Transpose::No, Transpose::No, d.cg_out, d.l, d.k, w + g * d.cg_out * d.k, cols.data(), 0.0, yg);
    }
    if (b != nullptr) {
      for (int64_t c = 0; c < s.c_out; ++c) {
        double* row = y + (n * s.c_out + c) * d.l;
        for (int64_t i = 0; i < d.l; ++i) row[i] += b[c];
      }
    }
  }
}

// dy: (N, C_out, H_out, W_out)  w: (C_out, C_in/g, kH, kW)  dx: (N, C_in, H, W)
void backward_data_im2col(const Conv2dShape& s, const double* dy, const double* w, double* dx) {
  const GroupDims d = group_dims(s);
  std::fill(dx, dx + s.n * s.c_in * s.h * s.w, 0.0);
  std::vector<double> cols(static_cast<size_t>(d.k * d.l));
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t g = 0; g < s.groups; ++g) {
      const double* dyg = dy + (n * s.c_out + g * d.cg_out) * d.l;
      // w[g]: (cg_out, K) read transposed -> (K, cg_out); dy[n, g]: (cg_out, L).
      gemm(Transpose::Yes, Transpose::No, d.k, d.l, d.cg_out, w + g * d.cg_out * d.k, dyg, 0.0, cols.data());
      col2im(s, cols.data(), dx + (n * s.c_in + g * d.cg_in) * s.h * s.w);
    }
  }
}

// x: (N, C_in, H, W)  dy: (N, C_out, H_out, W_out)  dw: (C_out, C_in/g, kH, kW)
void backward_weight_im2col(const Conv2dShape& s, const double* x, const double* dy, double* dw) {
  const GroupDims d = group_dims(s);
  std::fill(dw, dw + s.c_out * d.k, 0.0);
  std::vector<double> cols(static_cast<size_t>(d.k * d.l));
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t g = 0; g < s.groups; ++g) {
      im2col(s, x + (n * s.c_in + g * d.cg_in) * s.h * s.w, cols.data());
      const double* dyg = dy + (n * s.c_out + g * d.cg_out) * d.l;
      // dy[n, g] (cg_out, L) @ cols^T (L, K), accumulated over the batch.
      gemm(Transpose::No, Transpose::Yes, d.cg_out, d.k, d.l, dyg, cols.data(), 1.0, dw + g * d.cg_out * d.k);
    }
  }
}

// conv.h's checks, and no float16 operands: oneDNN 2.6 has no float16 convolutions on CPU (CPU autocast is
// bfloat16 only).
void check_cpu_conv(const char* what, const Conv2dShape& s) {
  check_conv2d_shape(what, s);
  DPE_CHECK(s.dtype != DType::Float16, what, ": dtype float16 runs on CUDA only (CPU: float32, float64, bfloat16)");
  DPE_CHECK(!s.channels_last || s.dtype != DType::Float64, what,
            ": float64 convolutions (im2col) take NCHW only, got channels_last");
}

// Note [Short bfloat16 reductions on the float32 kernel]
// A bfloat16 product accumulates products of bfloat16 values in float32; each such product is exact in
// float32, so the float32 kernel on the operands rounded to bfloat16 computes the same thing (up to the order
// of the float32 sums, which differs between any two kernels). oneDNN's bfloat16 kernels only pay when a
// dot product is long: AMX multiplies tiles 32 bfloat16 values deep, avx512_bf16 pairs of them. The CNN's
// first convolution (1 input channel, 3x3: 9 products per output) ran its forward on brgconv:avx512_core_bf16
// at 1.60 ms against 1.00 for the float32 brgconv (one core, batch 128, NHWC; 2.9 ms against ~2.4 a step in
// the DDP step). So a bfloat16 forward on float32 activations (CPU autocast) with fewer than kShortReduction
// products per output runs the float32 kernel on x and w rounded to bfloat16.
constexpr int64_t kShortReduction = 32;

bool short_reduction(const Conv2dShape& s) {
  return s.dtype == DType::BFloat16 && s.f32_activations && (s.c_in / s.groups) * s.kh * s.kw < kShortReduction;
}

// n float32 values rounded to bfloat16 and back (round to nearest even, as the relayout into a bfloat16 kernel
// rounds them).
void round_to_bfloat16(int64_t n, const float* in, float* out) {
  detail::parallel_range(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = bfloat16_to_float(float_to_bfloat16(in[i]));
  });
}

}  // namespace

void conv2d_forward_cpu(const Conv2dShape& s, const void* x, const void* w, const void* b, void* y) {
  check_cpu_conv("conv2d_forward_cpu", s);
  if (s.n == 0) return;
  if (short_reduction(s)) {
    Conv2dShape f32 = s;
    f32.dtype = DType::Float32;
    f32.f32_activations = false;
    const int64_t x_count = s.n * s.c_in * s.h * s.w, w_count = s.c_out * (s.c_in / s.groups) * s.kh * s.kw;
    Buffer xr = allocate("conv2d_forward_cpu", "rounded input", static_cast<size_t>(x_count) * sizeof(float), s);
    Buffer wf = allocate("conv2d_forward_cpu", "widened weight", static_cast<size_t>(w_count) * sizeof(float), s);
    round_to_bfloat16(x_count, static_cast<const float*>(x), static_cast<float*>(xr.get()));
    const Layout w_layout = contiguous_layout(1, &w_count);
    copy_cpu(w, DType::BFloat16, w_layout, wf.get(), DType::Float32, w_layout);
    conv2d_forward_cpu(f32, xr.get(), wf.get(), b, y);
    return;
  }
  if (s.dtype == DType::Float64) {
    forward_im2col(s, static_cast<const double*>(x), static_cast<const double*>(w), static_cast<const double*>(b),
                   static_cast<double*>(y));
    return;
  }
  if (b != nullptr) {
    run_onednn("conv2d_forward_cpu", Pass::Forward, s,
               {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, y}});
  } else {
    run_onednn("conv2d_forward_cpu", Pass::ForwardNoBias, s,
               {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y}});
  }
}

void conv2d_backward_data_cpu(const Conv2dShape& s, const void* dy, const void* w, void* dx) {
  check_cpu_conv("conv2d_backward_data_cpu", s);
  conv2d_backward_cpu(s, nullptr, w, dy, dx, nullptr, nullptr);
}

void conv2d_backward_weight_cpu(const Conv2dShape& s, const void* x, const void* dy, void* dw) {
  check_cpu_conv("conv2d_backward_weight_cpu", s);
  conv2d_backward_cpu(s, x, nullptr, dy, nullptr, dw, nullptr);
}

// Note [The bias gradient in backward weights]
// A convolution's bias gradient is dy summed over N, H_out and W_out: a pass over dy of its own (sum()) unless
// the backward-weights primitive, which reads dy anyway, makes it (oneDNN's diff_bias, float32). For float32
// convolutions, and for bfloat16 ones given float32 activations (CPU autocast): that primitive sums the
// bfloat16 dy it reads, in float32, as PyTorch's autocast sums its bfloat16 convolution's dy (it then rounds
// the sum to bfloat16 too; dpe keeps it float32). oneDNN sums in its own order, so the last bits differ from
// sum()'s; the result does not depend on the thread count at one thread per device (docs/BENCHMARKS.md).
void conv2d_backward_cpu(const Conv2dShape& s, const void* x, const void* w, const void* dy, void* dx, void* dw,
                         void* db) {
  check_cpu_conv("conv2d_backward_cpu", s);
  DPE_CHECK(db == nullptr || (dw != nullptr && (s.dtype == DType::Float32 || s.f32_activations)),
            "conv2d_backward_cpu: the bias gradient comes with the weight gradient of a float32 convolution, or a "
            "bfloat16 one on float32 activations, only; got dtype ", s.dtype,
            dw == nullptr ? " and no weight gradient" : "");
  if (s.n == 0) {
    // No samples: dx is empty and dw zero (oneDNN is not asked about an empty batch).
    const size_t count = static_cast<size_t>(s.c_out * (s.c_in / s.groups) * s.kh * s.kw);
    if (dw != nullptr) std::memset(dw, 0, count * element_size(conv2d_output_dtype(s.dtype)));
    if (db != nullptr) std::memset(db, 0, static_cast<size_t>(s.c_out) * sizeof(float));
    return;
  }
  if (s.dtype == DType::Float64) {
    const auto* dy64 = static_cast<const double*>(dy);
    if (dx != nullptr) backward_data_im2col(s, dy64, static_cast<const double*>(w), static_cast<double*>(dx));
    if (dw != nullptr) backward_weight_im2col(s, static_cast<const double*>(x), dy64, static_cast<double*>(dw));
    return;
  }
  ReorderedInputs reordered;
  if (dx != nullptr) {
    run_onednn("conv2d_backward_data_cpu", Pass::BackwardData, s,
               {{DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DIFF_SRC, dx}}, &reordered);
  }
  if (dw != nullptr && db != nullptr) {
    // The bias gradient from the pass that reads dy anyway (Note [The bias gradient in backward weights]).
    run_onednn("conv2d_backward_weight_cpu", Pass::BackwardWeightsBias, s,
               {{DNNL_ARG_SRC, x}, {DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_DIFF_WEIGHTS, dw}, {DNNL_ARG_DIFF_BIAS, db}},
               &reordered);
  } else if (dw != nullptr) {
    run_onednn("conv2d_backward_weight_cpu", Pass::BackwardWeights, s,
               {{DNNL_ARG_SRC, x}, {DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_DIFF_WEIGHTS, dw}}, &reordered);
  }
}

namespace detail {
size_t onednn_conv_primitives_cached() { return primitive_cache().size(); }
}  // namespace detail

}  // namespace dpe::kernels
