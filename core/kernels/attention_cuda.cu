// CUDA causal attention (core/kernels/attention.h): FlashAttention-2's tiling (Dao, 2023) in three kernels.
//
// Note [Attention in tiles on CUDA]
// A block of kWarps warps takes kTile queries (forward, dq) or kTile keys (dk, dv); each warp owns 16 of them,
// the M of a 16x16x16 tensor-core product. Keys and values (or queries and dout) stream through shared memory a
// tile at a time; every product is a warp's (16 x K) by (K x N) with both operands in shared memory
// (warp_mma), and the softmax, its rescaling and the masks are plain float32 code over shared rows. Nothing of
// size (T, T) reaches global memory: the forward keeps each query's running max m and sum l (the online
// softmax) and writes out = O / l and lse = m + log l; the backward recomputes P = exp(s - lse) tile by tile.
// Causality skips whole tiles: the forward of query tile i reads key tiles 0..i, dk/dv of key tile j reads query
// tiles j..end, and a warp skips a tile none of its rows can see.
//
// Determinism: every sum has a fixed order. dk and dv are summed over the query tiles and, for grouped-query
// attention, over the group's query heads inside one block (its accumulators in shared memory); dq has its own
// kernel that walks the key tiles (FlashAttention-2 adds dq with atomics instead, whose order varies). The cost
// is that S and dP are computed twice in the backward.
//
// Operands: Op = float runs the products as float32 FMAs (exact float32, the CPU kernels' reference path);
// Op = __nv_bfloat16 or __half rounds q, k, v, P, dout and dS to 16 bits when they enter shared memory and
// multiplies them with WMMA (float32 accumulation), which is where autocast's bmm rounds them. P is rounded
// before l sums it, so the weights out = sum P v / l applies sum to 1 exactly as rounded.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/kernels/attention.h"
#include "core/kernels/cuda_launch.cuh"

namespace dpe::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = 64;  // queries or keys per block and per streamed tile
constexpr int kRows = 16;  // a warp's rows: the tensor-core product's M (and N, K)
static_assert(kTile == kWarps * kRows);

// ---- operands ----

template <typename Op>
__device__ __forceinline__ Op to_op(float x) {
  if constexpr (std::is_same_v<Op, float>) {
    return x;
  } else if constexpr (std::is_same_v<Op, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}
__device__ __forceinline__ float from_op(float x) { return x; }
__device__ __forceinline__ float from_op(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float from_op(__half x) { return __half2float(x); }

// C (16 x n, float32, ldc) = A B, or C += A B with `accumulate`. A (16 x k) row-major (lda); B (k x n) row-major
// (ldb), or with kBT given as its transpose, an (n x k) row-major matrix (ldb): a tile of keys as K^T. n and k
// are multiples of 16; 16-bit leading dims multiples of 8, float ones of 4, every pointer 32-byte aligned (WMMA's
// rules, which the layouts below keep). A whole warp calls it; it reads and writes only its arguments.
template <typename Op, bool kBT>
__device__ void warp_mma(const Op* A, int lda, const Op* B, int ldb, float* C, int ldc, int n, int k,
                         bool accumulate) {
  if constexpr (std::is_same_v<Op, float>) {
    const int lane = threadIdx.x % 32;
    for (int e = lane; e < kRows * n; e += 32) {
      const int r = e / n, c = e % n;
      float sum = accumulate ? C[r * ldc + c] : 0.f;
      for (int i = 0; i < k; ++i) sum = fmaf(A[r * lda + i], kBT ? B[c * ldb + i] : B[i * ldb + c], sum);
      C[r * ldc + c] = sum;
    }
  } else {
    namespace wmma = nvcuda::wmma;
    using BLayout = std::conditional_t<kBT, wmma::col_major, wmma::row_major>;
    wmma::fragment<wmma::matrix_a, kRows, kRows, kRows, Op, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, kRows, kRows, kRows, Op, BLayout> b;
    wmma::fragment<wmma::accumulator, kRows, kRows, kRows, float> c;
    for (int j = 0; j < n; j += kRows) {
      if (accumulate) {
        wmma::load_matrix_sync(c, C + j, ldc, wmma::mem_row_major);
      } else {
        wmma::fill_fragment(c, 0.f);
      }
      for (int i = 0; i < k; i += kRows) {
        wmma::load_matrix_sync(a, A + i, lda);
        wmma::load_matrix_sync(b, kBT ? B + j * ldb + i : B + i * ldb + j, ldb);
        wmma::mma_sync(c, a, b, c);
      }
      wmma::store_matrix_sync(C + j, c, ldc, wmma::mem_row_major);
    }
  }
}

// ---- shared memory ----

// d rounded up to the product's 16; the pad columns hold zeros, which add nothing to q k^T and give output
// columns that are never written.
__host__ __device__ int padded_d(int64_t d) { return static_cast<int>((d + kRows - 1) / kRows * kRows); }

// Row pitches (elements): 16-bit rows padded by 8 and float rows by 4 (WMMA's multiples), which also moves
// consecutive rows to different banks.
struct Pitches {
  int op, acc, score, prob;  // (.., dp) operands, (.., dp) float accumulators, (.., kTile) floats, (.., kTile) Op
  __host__ __device__ explicit Pitches(int dp) : op(dp + 8), acc(dp + 4), score(kTile + 4), prob(kTile + 8) {}
};

// Hands out 128-byte-aligned pieces of the dynamic shared memory in a fixed order, so that the host (for the
// size, with a null base) and the kernel (for the pointers) walk the same layout.
class SmemCarver {
 public:
  __host__ __device__ explicit SmemCarver(unsigned char* base) : base_(base) {}
  template <typename T>
  __host__ __device__ T* take(int64_t count) {
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += (static_cast<int64_t>(sizeof(T)) * count + 127) / 128 * 128;
    return p;
  }
  __host__ __device__ int64_t bytes() const { return offset_; }

 private:
  unsigned char* base_;
  int64_t offset_ = 0;
};

// Each kernel's shared memory; constructed with a null base on the host for bytes().
template <typename Op>
struct ForwardSmem {
  Op *q, *k, *v, *p;      // q, k, v tiles (kTile x op); P per warp (16 x prob)
  float *s, *o, *keep, *row_scale;  // per warp: scores or the P V product (16 x max(kTile, dp) + 4), O (16 x acc)
  __host__ __device__ ForwardSmem(unsigned char* base, int dp) {
    const Pitches ld(dp);
    SmemCarver c(base);
    q = c.take<Op>(kTile * ld.op);
    k = c.take<Op>(kTile * ld.op);
    v = c.take<Op>(kTile * ld.op);
    p = c.take<Op>(kTile * ld.prob);
    s = c.take<float>(kTile * scratch_pitch(dp));
    o = c.take<float>(kTile * ld.acc);
    keep = c.take<float>(kTile);
    row_scale = c.take<float>(kTile);
    bytes = c.bytes();
  }
  __host__ __device__ static int scratch_pitch(int dp) { return (dp > kTile ? dp : kTile) + 4; }
  int64_t bytes;
};

template <typename Op>
struct DkDvSmem {
  Op *k, *v, *q, *dout, *p, *ds;  // tiles (kTile x op); P^T and dS^T per warp (16 x prob)
  float *s, *dk, *dv, *lse, *dot, *keep;
  __host__ __device__ DkDvSmem(unsigned char* base, int dp) {
    const Pitches ld(dp);
    SmemCarver c(base);
    k = c.take<Op>(kTile * ld.op);
    v = c.take<Op>(kTile * ld.op);
    q = c.take<Op>(kTile * ld.op);
    dout = c.take<Op>(kTile * ld.op);
    p = c.take<Op>(kTile * ld.prob);
    ds = c.take<Op>(kTile * ld.prob);
    s = c.take<float>(kTile * ld.score);  // S^T, then dP^T
    dk = c.take<float>(kTile * ld.acc);
    dv = c.take<float>(kTile * ld.acc);
    lse = c.take<float>(kTile);
    dot = c.take<float>(kTile);
    keep = c.take<float>(kTile);
    bytes = c.bytes();
  }
  int64_t bytes;
};

template <typename Op>
struct DqSmem {
  Op *q, *dout, *k, *v, *ds;  // tiles (kTile x op); dS per warp (16 x prob)
  float *s, *dp, *dq, *lse, *dot, *keep;
  __host__ __device__ DqSmem(unsigned char* base, int dpad) {
    const Pitches ld(dpad);
    SmemCarver c(base);
    q = c.take<Op>(kTile * ld.op);
    dout = c.take<Op>(kTile * ld.op);
    k = c.take<Op>(kTile * ld.op);
    v = c.take<Op>(kTile * ld.op);
    ds = c.take<Op>(kTile * ld.prob);
    s = c.take<float>(kTile * ld.score);
    dp = c.take<float>(kTile * ld.score);
    dq = c.take<float>(kTile * ld.acc);
    lse = c.take<float>(kTile);
    dot = c.take<float>(kTile);
    keep = c.take<float>(kTile);
    bytes = c.bytes();
  }
  int64_t bytes;
};

template <typename Op>
int64_t max_smem_bytes(int dp) {
  const int64_t f = ForwardSmem<Op>(nullptr, dp).bytes, a = DkDvSmem<Op>(nullptr, dp).bytes,
                b = DqSmem<Op>(nullptr, dp).bytes;
  return std::max(f, std::max(a, b));
}

// ---- the kernels ----

struct Params {
  AttentionCudaShape s;
  int dp = 0;
  float scale = 1.f;
  AttentionHeads q, k, v, out, dout, dq, dk, dv;
  float* lse = nullptr;  // (B * H, T)
  float* dot = nullptr;  // (B * H, T)
};

__device__ __forceinline__ float* head(const AttentionHeads& t, int64_t b, int64_t h) {
  return t.data + b * t.batch_stride + h * t.head_stride;
}

// dst (kTile x dp, pitch ld) = rows row0.. of a head (row_stride apart, d features), rounded to Op; zeros in the
// rows past T and the columns past d. The whole block calls it.
template <typename Op>
__device__ void load_tile(Op* dst, int ld, const float* src, int64_t row_stride, int64_t row0, int64_t T, int d,
                          int dp) {
  for (int e = threadIdx.x; e < kTile * dp; e += kThreads) {
    const int r = e / dp, c = e % dp;
    const int64_t row = row0 + r;
    dst[r * ld + c] = to_op<Op>(row < T && c < d ? src[row * row_stride + c] : 0.f);
  }
}

// keep[c] = 1 for the keys k0 + c that exist and are not padding, else 0. The whole block calls it.
__device__ void load_keep(float* keep, const Params& p, int64_t b, int64_t k0) {
  for (int c = threadIdx.x; c < kTile; c += kThreads) {
    const int64_t key = k0 + c;
    keep[c] = key < p.s.T && (p.s.key_keep == nullptr || p.s.key_keep[b * p.s.T + key] != 0.f) ? 1.f : 0.f;
  }
}

// Writes rows row0.. (16 of them, those below T) of a float accumulator (pitch ld) times row_scale[r] (or 1)
// to a head. A whole warp calls it.
__device__ void store_rows(float* dst, int64_t row_stride, const float* acc, int ld, const float* row_scale,
                           int64_t row0, int64_t T, int d) {
  const int lane = threadIdx.x % 32;
  for (int e = lane; e < kRows * d; e += 32) {
    const int r = e / d, c = e % d;
    if (row0 + r < T) dst[(row0 + r) * row_stride + c] = acc[r * ld + c] * (row_scale ? row_scale[r] : 1.f);
  }
}

__device__ void zero_rows(float* acc, int ld, int dp) {
  for (int e = threadIdx.x % 32; e < kRows * dp; e += 32) acc[(e / dp) * ld + e % dp] = 0.f;
}

// Grid: (query tiles, B * H). See Note [Attention in tiles on CUDA].
template <typename Op>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  const ForwardSmem<Op> sm(smem_bytes, p.dp);
  const Pitches ld(p.dp);
  const int sld = ForwardSmem<Op>::scratch_pitch(p.dp);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t T = p.s.T, bh = blockIdx.y, b = bh / p.s.H, h = bh % p.s.H, hk = h / (p.s.H / p.s.Hkv);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTile, w0 = q0 + warp * kRows;  // block's, warp's first query
  const int d = static_cast<int>(p.s.d), dp = p.dp;

  load_tile(sm.q, ld.op, head(p.q, b, h), p.q.row_stride, q0, T, d, dp);
  float* S = sm.s + warp * kRows * sld;
  Op* P = sm.p + warp * kRows * ld.prob;
  float* O = sm.o + warp * kRows * ld.acc;
  zero_rows(O, ld.acc, dp);

  // Lanes 2r and 2r + 1 own row r of the warp's 16, the even and the odd columns.
  const int r = lane / 2, half = lane % 2;
  const int64_t row = w0 + r;
  float m = -INFINITY, l = 0.f;
  const int64_t tiles = (std::min(T, q0 + kTile) - 1) / kTile + 1;  // key tiles the block's queries can see
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t k0 = t * kTile;
    __syncthreads();  // the previous tile's k and v are no longer read
    load_tile(sm.k, ld.op, head(p.k, b, hk), p.k.row_stride, k0, T, d, dp);
    load_tile(sm.v, ld.op, head(p.v, b, hk), p.v.row_stride, k0, T, d, dp);
    load_keep(sm.keep, p, b, k0);
    __syncthreads();
    if (w0 >= T || k0 > w0 + kRows - 1) continue;  // no row of this warp sees a key of the tile

    warp_mma<Op, true>(sm.q + warp * kRows * ld.op, ld.op, sm.k, ld.op, S, sld, kTile, dp, false);  // q k^T
    __syncwarp();
    float tile_max = -INFINITY;
    for (int c = half; c < kTile; c += 2) {
      const bool visible = sm.keep[c] != 0.f && k0 + c <= row;
      const float s = visible ? S[r * sld + c] * p.scale : -INFINITY;
      S[r * sld + c] = s;
      tile_max = fmaxf(tile_max, s);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    // m_new = -inf: no key visible to this row yet; its P row is 0 and O, l stay 0.
    const float alpha = m_new == -INFINITY ? 1.f : expf(m - m_new);
    float sum = 0.f;
    for (int c = half; c < kTile; c += 2) {
      const Op pr = to_op<Op>(m_new == -INFINITY ? 0.f : expf(S[r * sld + c] - m_new));
      P[r * ld.prob + c] = pr;
      sum += from_op(pr);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    for (int c = half; c < dp; c += 2) O[r * ld.acc + c] *= alpha;
    __syncwarp();
    warp_mma<Op, false>(P, ld.prob, sm.v, ld.op, S, sld, dp, kTile, false);  // P v, into the scores' space
    __syncwarp();
    for (int c = half; c < dp; c += 2) O[r * ld.acc + c] += S[r * sld + c];
    __syncwarp();
  }
  if (w0 >= T) return;
  float* row_scale = sm.row_scale + warp * kRows;
  if (half == 0) {
    row_scale[r] = l > 0.f ? 1.f / l : 0.f;
    if (row < T) p.lse[bh * T + row] = l > 0.f ? m + logf(l) : -INFINITY;
  }
  __syncwarp();
  store_rows(head(p.out, b, h), p.out.row_stride, O, ld.acc, row_scale, w0, T, d);
}

// dot[bh * T + t] = dout[b, h, t, :] . out[b, h, t, :], a warp per row in a fixed order.
__global__ void attention_row_dot_kernel(Params p) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = p.s.B * p.s.H * p.s.T, warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; i < rows; i += warps) {
    const int64_t bh = i / p.s.T, t = i % p.s.T, b = bh / p.s.H, h = bh % p.s.H;
    const float* o = head(p.out, b, h) + t * p.out.row_stride;
    const float* g = head(p.dout, b, h) + t * p.dout.row_stride;
    float sum = 0.f;
    for (int64_t c = lane; c < p.s.d; c += 32) sum = fmaf(o[c], g[c], sum);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) p.dot[i] = sum;
  }
}

// Rows row0.. (kTile of them) of lse and dot into shared memory; -inf and 0 past T (no key visible, so P = 0).
__device__ void load_row_stats(float* lse, float* dot, const Params& p, int64_t bh, int64_t row0) {
  for (int c = threadIdx.x; c < kTile; c += kThreads) {
    const int64_t row = row0 + c;
    lse[c] = row < p.s.T ? p.lse[bh * p.s.T + row] : -INFINITY;
    dot[c] = row < p.s.T ? p.dot[bh * p.s.T + row] : 0.f;
  }
}

// P of a visible (query, key) from the scaled score's product s and the query's lse, rounded as the products
// take it; 0 where hidden (and where the query sees no key: lse = -inf).
template <typename Op>
__device__ __forceinline__ float probability(bool visible, float s, float scale, float lse) {
  return visible && lse != -INFINITY ? from_op(to_op<Op>(expf(s * scale - lse))) : 0.f;
}

// Grid: (key tiles, B * Hkv); each warp accumulates dk and dv for 16 keys over every query tile that can see
// them, for each query head of the group in turn.
template <typename Op>
__global__ void __launch_bounds__(kThreads) attention_dkdv_kernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  const DkDvSmem<Op> sm(smem_bytes, p.dp);
  const Pitches ld(p.dp);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t T = p.s.T, group = p.s.H / p.s.Hkv, b = blockIdx.y / p.s.Hkv, hk = blockIdx.y % p.s.Hkv;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile, w0 = k0 + warp * kRows;  // block's, warp's first key
  const int d = static_cast<int>(p.s.d), dp = p.dp;

  load_tile(sm.k, ld.op, head(p.k, b, hk), p.k.row_stride, k0, T, d, dp);
  load_tile(sm.v, ld.op, head(p.v, b, hk), p.v.row_stride, k0, T, d, dp);
  load_keep(sm.keep, p, b, k0);
  float* S = sm.s + warp * kRows * ld.score;
  Op* Pt = sm.p + warp * kRows * ld.prob;
  Op* dSt = sm.ds + warp * kRows * ld.prob;
  float* dK = sm.dk + warp * kRows * ld.acc;
  float* dV = sm.dv + warp * kRows * ld.acc;
  zero_rows(dK, ld.acc, dp);
  zero_rows(dV, ld.acc, dp);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const int64_t bh = b * p.s.H + h;
    for (int64_t i0 = k0; i0 < T; i0 += kTile) {  // query tiles from the block's first key on
      __syncthreads();  // the previous tile's q, dout and row stats are no longer read
      load_tile(sm.q, ld.op, head(p.q, b, h), p.q.row_stride, i0, T, d, dp);
      load_tile(sm.dout, ld.op, head(p.dout, b, h), p.dout.row_stride, i0, T, d, dp);
      load_row_stats(sm.lse, sm.dot, p, bh, i0);
      __syncthreads();
      if (w0 >= T) continue;

      warp_mma<Op, true>(sm.k + warp * kRows * ld.op, ld.op, sm.q, ld.op, S, ld.score, kTile, dp, false);  // k q^T
      __syncwarp();
      for (int e = lane; e < kRows * kTile; e += 32) {  // P^T: row = key, column = query
        const int kr = e / kTile, qc = e % kTile;
        const bool visible = sm.keep[warp * kRows + kr] != 0.f && w0 + kr <= i0 + qc;
        Pt[kr * ld.prob + qc] = to_op<Op>(probability<Op>(visible, S[kr * ld.score + qc], p.scale, sm.lse[qc]));
      }
      __syncwarp();
      warp_mma<Op, false>(Pt, ld.prob, sm.dout, ld.op, dV, ld.acc, dp, kTile, true);  // dv += P^T dout
      warp_mma<Op, true>(sm.v + warp * kRows * ld.op, ld.op, sm.dout, ld.op, S, ld.score, kTile, dp,
                         false);  // dP^T = v dout^T
      __syncwarp();
      for (int e = lane; e < kRows * kTile; e += 32) {  // dS^T = P^T (dP^T - dot) * scale
        const int kr = e / kTile, qc = e % kTile;
        const float pr = from_op(Pt[kr * ld.prob + qc]);
        dSt[kr * ld.prob + qc] = to_op<Op>(pr * (S[kr * ld.score + qc] - sm.dot[qc]) * p.scale);
      }
      __syncwarp();
      warp_mma<Op, false>(dSt, ld.prob, sm.q, ld.op, dK, ld.acc, dp, kTile, true);  // dk += dS^T q
      __syncwarp();
    }
  }
  if (w0 >= T) return;
  store_rows(head(p.dk, b, hk), p.dk.row_stride, dK, ld.acc, nullptr, w0, T, d);
  store_rows(head(p.dv, b, hk), p.dv.row_stride, dV, ld.acc, nullptr, w0, T, d);
}

// Grid: (query tiles, B * H); each warp accumulates dq for its 16 queries over the key tiles they can see.
template <typename Op>
__global__ void __launch_bounds__(kThreads) attention_dq_kernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  const DqSmem<Op> sm(smem_bytes, p.dp);
  const Pitches ld(p.dp);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t T = p.s.T, bh = blockIdx.y, b = bh / p.s.H, h = bh % p.s.H, hk = h / (p.s.H / p.s.Hkv);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTile, w0 = q0 + warp * kRows;
  const int d = static_cast<int>(p.s.d), dp = p.dp;

  load_tile(sm.q, ld.op, head(p.q, b, h), p.q.row_stride, q0, T, d, dp);
  load_tile(sm.dout, ld.op, head(p.dout, b, h), p.dout.row_stride, q0, T, d, dp);
  load_row_stats(sm.lse, sm.dot, p, bh, q0);
  float* S = sm.s + warp * kRows * ld.score;
  float* dP = sm.dp + warp * kRows * ld.score;
  Op* dS = sm.ds + warp * kRows * ld.prob;
  float* dQ = sm.dq + warp * kRows * ld.acc;
  zero_rows(dQ, ld.acc, dp);
  const int64_t tiles = (std::min(T, q0 + kTile) - 1) / kTile + 1;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t k0 = t * kTile;
    __syncthreads();  // the previous tile's k and v are no longer read
    load_tile(sm.k, ld.op, head(p.k, b, hk), p.k.row_stride, k0, T, d, dp);
    load_tile(sm.v, ld.op, head(p.v, b, hk), p.v.row_stride, k0, T, d, dp);
    load_keep(sm.keep, p, b, k0);
    __syncthreads();
    if (w0 >= T || k0 > w0 + kRows - 1) continue;

    warp_mma<Op, true>(sm.q + warp * kRows * ld.op, ld.op, sm.k, ld.op, S, ld.score, kTile, dp, false);  // q k^T
    warp_mma<Op, true>(sm.dout + warp * kRows * ld.op, ld.op, sm.v, ld.op, dP, ld.score, kTile, dp,
                       false);  // dout v^T
    __syncwarp();
    for (int e = lane; e < kRows * kTile; e += 32) {  // dS = P (dP - dot) * scale, as the dk/dv kernel's
      const int r = e / kTile, c = e % kTile;
      const bool visible = sm.keep[c] != 0.f && k0 + c <= w0 + r;
      const float pr = probability<Op>(visible, S[r * ld.score + c], p.scale, sm.lse[warp * kRows + r]);
      dS[r * ld.prob + c] = to_op<Op>(pr * (dP[r * ld.score + c] - sm.dot[warp * kRows + r]) * p.scale);
    }
    __syncwarp();
    warp_mma<Op, false>(dS, ld.prob, sm.k, ld.op, dQ, ld.acc, dp, kTile, true);  // dq += dS k
    __syncwarp();
  }
  if (w0 >= T) return;
  store_rows(head(p.dq, b, h), p.dq.row_stride, dQ, ld.acc, nullptr, w0, T, d);
}

// ---- launches ----

// Calls f(Op{}) for the operand dtype.
template <typename F>
void dispatch_operand(DType operand, F&& f) {
  switch (operand) {
    case DType::Float32: f(float{}); return;
    case DType::BFloat16: f(__nv_bfloat16{}); return;
    case DType::Float16: f(__half{}); return;
    default: break;
  }
  DPE_CHECK(false, "causal attention (CUDA): operand dtype ", operand, " is not float32, bfloat16 or float16");
}

// The current device's opt-in shared memory per block. Asked of every device once: the op asks before each
// call whether the kernels apply.
int max_shared_memory_per_block() {
  static const std::vector<int> limits = [] {
    int count = 0;
    DPE_CUDA_CHECK(cudaGetDeviceCount(&count));
    std::vector<int> bytes(static_cast<size_t>(count));
    for (int device = 0; device < count; ++device) {
      DPE_CUDA_CHECK(cudaDeviceGetAttribute(&bytes[static_cast<size_t>(device)],
                                            cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    }
    return bytes;
  }();
  int device = 0;
  DPE_CUDA_CHECK(cudaGetDevice(&device));
  return limits.at(static_cast<size_t>(device));
}

Params params_of(const AttentionCudaShape& s) {
  DPE_CHECK(s.B > 0 && s.H > 0 && s.Hkv > 0 && s.H % s.Hkv == 0 && s.T > 0 && s.d > 0 && s.d <= kAttentionCudaMaxD,
            "causal attention (CUDA): expected B, H, Hkv, T > 0 with H % Hkv == 0 and 0 < d <= ",
            kAttentionCudaMaxD, ", got B ", s.B, ", H ", s.H, ", Hkv ", s.Hkv, ", T ", s.T, ", d ", s.d);
  DPE_CHECK(s.B * s.H <= 65535 && (s.T + kTile - 1) / kTile <= 65535, "causal attention (CUDA): B * H = ", s.B * s.H,
            " and T / ", kTile, " = ", (s.T + kTile - 1) / kTile, " must each be at most 65535 (a grid dimension)");
  Params p;
  p.s = s;
  p.dp = padded_d(s.d);
  p.scale = static_cast<float>(s.scale);
  return p;
}

// Launches kernel<<<grid, kThreads, bytes>>> with the dynamic shared memory it needs allowed.
template <typename Kernel>
void launch(Kernel kernel, dim3 grid, int64_t bytes, cudaStream_t stream, const Params& p) {
  DPE_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  kernel<<<grid, kThreads, static_cast<size_t>(bytes), stream>>>(p);
  DPE_CUDA_CHECK_LAUNCH();
}

unsigned tiles_of(int64_t T) { return static_cast<unsigned>((T + kTile - 1) / kTile); }

}  // namespace

bool causal_attention_cuda_fits(DType operand, int64_t d) {
  if (d <= 0 || d > kAttentionCudaMaxD) return false;
  int64_t bytes = 0;
  dispatch_operand(operand, [&](auto op) { bytes = max_smem_bytes<decltype(op)>(padded_d(d)); });
  return bytes <= max_shared_memory_per_block();
}

void causal_attention_forward_cuda(cudaStream_t stream, const AttentionCudaShape& s, AttentionHeads q,
                                   AttentionHeads k, AttentionHeads v, AttentionHeads out, float* lse) {
  Params p = params_of(s);
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
  dispatch_operand(s.operand, [&](auto op) {
    using Op = decltype(op);
    launch(attention_forward_kernel<Op>, dim3(tiles_of(s.T), static_cast<unsigned>(s.B * s.H)),
           ForwardSmem<Op>(nullptr, p.dp).bytes, stream, p);
  });
}

void causal_attention_backward_cuda(cudaStream_t stream, const AttentionCudaShape& s, AttentionHeads q,
                                    AttentionHeads k, AttentionHeads v, AttentionHeads out, const float* lse,
                                    AttentionHeads dout, AttentionHeads dq, AttentionHeads dk, AttentionHeads dv,
                                    float* workspace) {
  Params p = params_of(s);
  p.q = q, p.k = k, p.v = v, p.out = out, p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv;
  p.lse = const_cast<float*>(lse);  // read only by the backward's kernels
  p.dot = workspace;
  const int64_t rows = s.B * s.H * s.T;
  attention_row_dot_kernel<<<detail::grid_for(rows * 32), detail::kBlock, 0, stream>>>(p);
  DPE_CUDA_CHECK_LAUNCH();
  dispatch_operand(s.operand, [&](auto op) {
    using Op = decltype(op);
    launch(attention_dkdv_kernel<Op>, dim3(tiles_of(s.T), static_cast<unsigned>(s.B * s.Hkv)),
           DkDvSmem<Op>(nullptr, p.dp).bytes, stream, p);
    launch(attention_dq_kernel<Op>, dim3(tiles_of(s.T), static_cast<unsigned>(s.B * s.H)),
           DqSmem<Op>(nullptr, p.dp).bytes, stream, p);
  });
}

}  // namespace dpe::kernels
