// oneDNN's matmul primitive for gemm_cpu: float32 (the "onednn-matmul" candidate of Note [float32 GEMM
// choice] in sgemm_cpu.cc) and bfloat16 operands with float32 accumulation and output (autocast's products,
// core/amp/autocast.h).
//
// One primitive per (operand dtype, shape, strides, scalars, thread share), cached like conv_cpu.cc's (Note
// [oneDNN primitive cache] there; the most recent kPrimitiveCacheCapacity, core/kernels/primitive_cache.h):
// alpha is the output scale, beta != 0 a sum post-op (beta == 0 writes C without reading it, NaN included, as
// BLAS does). Transposed operands are strided memory descriptors, never copies.
// Threads: the primitive runs on omp_get_max_threads() of the calling thread (its device's share), which is
// part of the key. Primitives are immutable and their scratchpad is allocated per call
// (scratchpad_mode::user), so one may run on several workers at once.
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

#include "core/cpu_isa.h"
#include "core/error.h"
#include "core/kernels/matmul.h"
#include "core/kernels/onednn.h"
#include "core/kernels/primitive_cache.h"
#include "core/kernels/scratch.h"

namespace dpe::kernels {
namespace {

using detail::onednn_cpu_engine;

using MatmulKey =
    std::tuple<int, int64_t, int64_t, int64_t, int, int, int64_t, int64_t, int64_t, double, double, int>;

struct CachedMatmul {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c;
  size_t scratchpad_bytes = 0;
};

dnnl::memory::data_type operand_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return dnnl::memory::data_type::f32;
    case DType::BFloat16: return dnnl::memory::data_type::bf16;
    default: DPE_INTERNAL_ASSERT(false, "onednn_matmul: operand dtype ", dtype);
  }
  return dnnl::memory::data_type::undef;  // not reached
}

// "in oneDNN's float32 matmul primitive (m 256, n 512, k 784)", for error messages.
std::string context_of(const GemmArgs& g) {
  return dpe::detail::str_cat("in oneDNN's ", g.dtype, " matmul primitive (m ", g.m, ", n ", g.n, ", k ", g.k, ")");
}

CachedMatmul build_matmul(const GemmArgs& g) {
  using dims = dnnl::memory::dims;
  const auto operands = operand_type(g.dtype);
  CachedMatmul built;
  // op(A) (m, k) over A stored (m, k) or, transposed, (k, m): element (i, q) at i * lda + q or q * lda + i.
  built.a = dnnl::memory::desc({g.m, g.k}, operands, g.trans_a == Transpose::No ? dims{g.lda, 1} : dims{1, g.lda});
  built.b = dnnl::memory::desc({g.k, g.n}, operands, g.trans_b == Transpose::No ? dims{g.ldb, 1} : dims{1, g.ldb});
  built.c = dnnl::memory::desc({g.m, g.n}, dnnl::memory::data_type::f32, dims{g.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (g.alpha != 1.0) attr.set_output_scales(0, {static_cast<float>(g.alpha)});
  if (g.beta != 0.0) {
    dnnl::post_ops ops;
    ops.append_sum(static_cast<float>(g.beta));
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(built.a, built.b, built.c), attr, onednn_cpu_engine());
  built.scratchpad_bytes = pd.scratchpad_desc().get_size();
  built.primitive = dnnl::matmul(pd);
  return built;
}

detail::PrimitiveCache<MatmulKey, CachedMatmul>& matmul_cache() {
  static auto* cache = new detail::PrimitiveCache<MatmulKey, CachedMatmul>;  // never destroyed
  return *cache;
}

std::shared_ptr<const CachedMatmul> matmul_for(const GemmArgs& g) {
  const MatmulKey key{static_cast<int>(g.dtype),
                      g.m,
                      g.n,
                      g.k,
                      static_cast<int>(g.trans_a),
                      static_cast<int>(g.trans_b),
                      g.lda,
                      g.ldb,
                      g.ldc,
                      g.alpha,
                      g.beta,
                      omp_get_max_threads()};
  return matmul_cache().get(key, [&] {
    detail::check_space_for_onednn_build("gemm_cpu", context_of(g));
    return build_matmul(g);
  });
}

}  // namespace

bool cpu_has_bf16_instructions() {
  // dpe's cap first (Note [The CPU instruction-set cap]), then oneDNN's own view, which also honours a
  // ONEDNN_MAX_CPU_ISA set without the cap. Bit masks: an ISA's value contains every ISA it extends.
  static const bool has = [] {
    if (cpu_isa() < CpuIsa::Avx512Bf16) return false;
    detail::apply_cpu_isa_cap_to_onednn();
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return has;
}

namespace detail {

size_t onednn_matmul_primitives_cached() { return matmul_cache().size(); }

void onednn_matmul(const GemmArgs& g, const void* a, const void* b, float* c) {
  try {
    std::shared_ptr<const CachedMatmul> prim = matmul_for(g);
    ScratchBuffer scratchpad;
    const dnnl::engine& engine = onednn_cpu_engine();
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, dnnl::memory(prim->a, engine, const_cast<void*>(a))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(prim->b, engine, const_cast<void*>(b))},
        {DNNL_ARG_DST, dnnl::memory(prim->c, engine, c)}};
    if (prim->scratchpad_bytes > 0) {
      scratchpad = scratch(prim->scratchpad_bytes);
      DPE_CHECK_WITH(ErrorKind::OutOfMemory, scratchpad != nullptr, "gemm_cpu: out of memory allocating the ",
                     prim->scratchpad_bytes, "-byte oneDNN matmul scratchpad for m ", g.m, ", n ", g.n, ", k ", g.k);
      args.emplace(DNNL_ARG_SCRATCHPAD,
                   dnnl::memory(dnnl::memory::desc({static_cast<int64_t>(prim->scratchpad_bytes)},
                                                   dnnl::memory::data_type::u8, dnnl::memory::format_tag::x),
                                engine, scratchpad.get()));
    }
    dnnl::stream stream(engine);
    prim->primitive.execute(stream, args);
    stream.wait();
  } catch (...) {
    rethrow_onednn_failure("gemm_cpu", context_of(g));
  }
}

}  // namespace detail
}  // namespace dpe::kernels
