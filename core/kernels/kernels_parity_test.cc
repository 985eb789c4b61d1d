// CUDA kernels against the CPU kernels: same random inputs, results compared element by element with the
// tolerance each comparison explains. Every test skips (reported as skipped) without a GPU.
//
// Inputs are generated on the host (std::mt19937_64, fixed seeds), copied to cuda:0 with core/cuda/cuda_copy.h,
// the CUDA kernel runs on cuda::stream(0), and the result is copied back (the copy waits for the stream).
// Sizes cover 0, 1, 7, 1023 and 1<<20 + 3; layouts cover broadcasting (stride 0) and transposes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/cpu_isa.h"
#include "core/device.h"
#include "core/kernels/batch_norm.h"
#include "core/kernels/batch_norm_pieces.h"
#include "core/kernels/copy.h"
#include "core/kernels/elementwise.h"
#include "core/kernels/matmul.h"
#include "core/kernels/nll.h"
#include "core/kernels/optimizer.h"
#include "core/kernels/random.h"
#include "core/kernels/reduce.h"
#include "core/kernels/softmax.h"
#include "tests/testing/kernel_test_util.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_copy.h"
#include "core/cuda/cuda_device.h"
#endif

namespace dpe::kernels {
namespace {

#if !DPE_WITH_CUDA

TEST(KernelsParity, NeedsCuda) { GTEST_SKIP() << "this dpe build has no CUDA support"; }

#else

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason()

constexpr int kDevice = 0;  // cuda:0
const int64_t kSizes[] = {0, 1, 7, 1023, (int64_t(1) << 20) + 3};

cudaStream_t stream() { return cuda::stream(kDevice); }

// ---------------------------------------------------------------------------------------------------------
// Host <-> device helpers.

// Device memory of cuda:0 from its caching allocator, returned on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t nbytes)
      : nbytes_(nbytes), ptr_(allocator_for(Device::cuda(kDevice)).allocate(nbytes)) {}
  ~DeviceBuffer() { allocator_for(Device::cuda(kDevice)).deallocate(ptr_, nbytes_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  size_t nbytes_;
  void* ptr_;
};

template <typename T>
size_t bytes_of(const std::vector<T>& v) {
  return v.size() * sizeof(T);
}

template <typename T>
std::unique_ptr<DeviceBuffer> upload(const std::vector<T>& host) {
  auto buffer = std::make_unique<DeviceBuffer>(bytes_of(host));
  cuda::copy_host_to_device(kDevice, buffer->get(), host.data(), bytes_of(host));
  return buffer;
}

// Waits for the kernels enqueued on cuda:0's stream (the copy is ordered after them).
template <typename T>
std::vector<T> download(const DeviceBuffer& buffer, size_t n) {
  std::vector<T> host(n);
  cuda::copy_device_to_host(host.data(), kDevice, buffer.get(), bytes_of(host));
  return host;
}

// ---------------------------------------------------------------------------------------------------------
// Inputs and comparisons.

template <typename T>
constexpr double kEps = std::numeric_limits<T>::epsilon();

// The engine of this test's random inputs (tests/testing/kernel_test_util.h's random_vector).
using Rng = std::mt19937_64;

std::string str(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  return os.str();
}

// Expects |cpu[i] - cuda[i]| <= tol(i) for every i; equal values (infinities included) and NaN against NaN
// always pass. Reports the first few mismatches with their index.
template <typename T, typename Tol>
void expect_close(const std::vector<T>& cpu, const std::vector<T>& gpu, const Tol& tol, const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  int64_t failures = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double c = static_cast<double>(cpu[i]), g = static_cast<double>(gpu[i]);
    if (c == g || (std::isnan(c) && std::isnan(g))) continue;
    const double allowed = tol(i);
    if (std::abs(c - g) <= allowed) continue;
    if (++failures <= 5) {
      ADD_FAILURE() << what << " [" << i << "]: cpu " << str(c) << " cuda " << str(g) << " |diff| "
                    << str(std::abs(c - g)) << " > tolerance " << str(allowed);
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << cpu.size() << " elements differ";
}

// Bit-exact up to NaN payloads: for results that are correctly rounded single operations on both sides.
template <typename T>
void expect_equal(const std::vector<T>& cpu, const std::vector<T>& gpu, const std::string& what) {
  expect_close(cpu, gpu, [](size_t) { return 0.0; }, what);
}

std::string shape_str(int64_t outer, int64_t size, int64_t inner) {
  return "(" + std::to_string(outer) + ", " + std::to_string(size) + ", " + std::to_string(inner) + ")";
}

template <typename T>
class Parity : public ::testing::Test {};
TYPED_TEST_SUITE(Parity, FloatTypes);

// ---------------------------------------------------------------------------------------------------------
// Copy and fill: exact. Both sides convert with the same functions (core/kernels/convert.h, Note [dtype
// conversion]: one correct rounding, saturating float -> int, NaN -> 0), so every byte must match.

// n doubles: specials first (NaN, infinities, signed zero, rounding ties and the float16 overflow edge,
// integers beyond 2^53), then a mix of small, fractional and huge values.
std::vector<double> conversion_inputs(int64_t n, uint64_t seed) {
  const double specials[] = {std::nan(""), INFINITY, -INFINITY, -0.0, 0.5, -0.5, 2.5, -3.5, 255.5, 256.0,
                             65504.0, 65520.0, -65536.0, 1e10, -1e10, 3.0e38, 1e300, 9007199254740993.0,
                             2147483647.5, -2147483649.0, 1.0000000596046448, 0.1};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> small(-300, 300);
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (i < static_cast<int64_t>(std::size(specials))) {
      v[i] = specials[i];
    } else {
      double x = small(rng);
      int k = kind(rng);
      v[i] = k == 0 ? std::round(x) : k == 1 ? x * 1e6 : k == 2 ? x * 1e-6 : x;
    }
  }
  return v;
}

// The bytes of `values` converted to dtype (by copy_cpu, from float64).
std::vector<unsigned char> as_dtype(const std::vector<double>& values, DType dtype) {
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<unsigned char> bytes(values.size() * element_size(dtype));
  copy_cpu(values.data(), DType::Float64, contiguous({n}), bytes.data(), dtype, contiguous({n}));
  return bytes;
}

// CPU and CUDA copies of src (storage bytes, src_layout) into a zeroed dst of dst_layout; compares bytes.
void check_copy(const std::vector<unsigned char>& src, DType src_dtype, const Layout& src_layout, DType dst_dtype,
                const Layout& dst_layout, const std::string& what) {
  const size_t dst_bytes = static_cast<size_t>(extent(dst_layout)) * element_size(dst_dtype);
  std::vector<unsigned char> cpu(dst_bytes, 0), zeros(dst_bytes, 0);
  copy_cpu(src.data(), src_dtype, src_layout, cpu.data(), dst_dtype, dst_layout);
  auto d_src = upload(src);
  auto d_dst = upload(zeros);
  copy_cuda(stream(), d_src->get(), src_dtype, src_layout, d_dst->get(), dst_dtype, dst_layout);
  std::vector<unsigned char> gpu = download<unsigned char>(*d_dst, dst_bytes);
  if (cpu == gpu) return;
  size_t first = 0;
  while (cpu[first] == gpu[first]) ++first;
  ADD_FAILURE() << what << ": first differing byte " << first << " (element " << first / element_size(dst_dtype)
                << "): cpu " << int(cpu[first]) << " cuda " << int(gpu[first]);
}

TEST(ParityCopy, EveryDtypePairContiguous) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    const std::vector<double> values = conversion_inputs(n, 1000 + n);
    for (DType src : kAllDTypes) {
      const std::vector<unsigned char> src_bytes = as_dtype(values, src);
      for (DType dst : kAllDTypes) {
        check_copy(src_bytes, src, contiguous({n}), dst, contiguous({n}),
                   "copy " + std::string(dtype_name(src)) + " -> " + std::string(dtype_name(dst)) + " n=" +
                       std::to_string(n));
      }
    }
  }
}

TEST(ParityCopy, StridedBroadcastAndTransposed) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* name;
    Layout src, dst;
  };
  const Case cases[] = {
      // a (53, 37) matrix read transposed as (37, 53)
      {"transposed src", make_layout({37, 53}, {1, 37}), contiguous({37, 53})},
      // a (7, 9) slice broadcast over a leading dimension of 5
      {"broadcast src", make_layout({5, 7, 9}, {0, 9, 1}), contiguous({5, 7, 9})},
      // a row vector broadcast over 1023 rows
      {"broadcast row", make_layout({1023, 7}, {0, 1}), contiguous({1023, 7})},
      // contiguous src written into a transposed dst
      {"transposed dst", contiguous({37, 53}), make_layout({37, 53}, {1, 37})},
      // a 3-D permutation (2, 0, 1) of a (3, 5, 11) array, odd sizes everywhere
      {"permuted src", make_layout({11, 3, 5}, {1, 55, 11}), contiguous({11, 3, 5})},
      // both non-contiguous: a column slice of a wider matrix into a transposed dst
      {"both strided", make_layout({9, 7}, {13, 1}), make_layout({9, 7}, {1, 9})},
      {"0-d scalar", make_layout({}, {}), make_layout({}, {})},
      {"empty dim", make_layout({4, 0, 3}, {0, 3, 1}), contiguous({4, 0, 3})},
      {"large transposed", make_layout({1031, 1021}, {1, 1031}), contiguous({1031, 1021})},
      // attention's heads: (B, T, H, hd) = (7, 33, 4, 32) read as (B, H, T, hd), and back into a permuted dst
      {"heads src", make_layout({7, 4, 33, 32}, {4224, 32, 128, 1}), contiguous({7, 4, 33, 32})},
      {"heads dst", contiguous({7, 4, 33, 32}), make_layout({7, 4, 33, 32}, {4224, 32, 128, 1})},
  };
  const std::pair<DType, DType> pairs[] = {{DType::Float32, DType::Float32}, {DType::Float64, DType::Float64},
                                           {DType::Float64, DType::Float16}, {DType::Float32, DType::Int64},
                                           {DType::BFloat16, DType::Float64}, {DType::UInt8, DType::Float32}};
  for (const Case& c : cases) {
    const std::vector<double> values = conversion_inputs(extent(c.src), 7);
    for (auto [src, dst] : pairs) {
      check_copy(as_dtype(values, src), src, c.src, dst, c.dst,
                 std::string(c.name) + " " + std::string(dtype_name(src)) + " -> " + std::string(dtype_name(dst)));
    }
  }
}

TEST(ParityCopy, FillEveryDtype) {
  SKIP_WITHOUT_GPU();
  const double values[] = {0.0, 3.75, -2.5, 1e6, 70000.5, 300.7, std::nan(""), -INFINITY};
  for (int64_t n : kSizes) {
    for (DType dtype : kAllDTypes) {
      for (double value : values) {
        const size_t nbytes = static_cast<size_t>(n) * element_size(dtype);
        std::vector<unsigned char> cpu(nbytes);
        fill_cpu(cpu.data(), dtype, n, value);
        DeviceBuffer d(nbytes);
        fill_cuda(stream(), d.get(), dtype, n, value);
        EXPECT_TRUE(download<unsigned char>(d, nbytes) == cpu)
            << "fill " << dtype_name(dtype) << " n=" << n << " value=" << value;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Elementwise.

const UnaryOp kUnaryOps[] = {UnaryOp::Neg,        UnaryOp::Exp,  UnaryOp::Log,  UnaryOp::Sqrt, UnaryOp::Rsqrt,
                             UnaryOp::Abs,        UnaryOp::Square, UnaryOp::Reciprocal, UnaryOp::Relu,
                             UnaryOp::Gelu,       UnaryOp::Silu, UnaryOp::Tanh, UnaryOp::Sigmoid};

// Ops whose result is one correctly rounded IEEE operation (or two, for rsqrt = 1 / sqrt) on both sides.
bool is_exact(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg:
    case UnaryOp::Sqrt:
    case UnaryOp::Rsqrt:
    case UnaryOp::Abs:
    case UnaryOp::Square:
    case UnaryOp::Reciprocal:
    case UnaryOp::Relu: return true;
    default: return false;
  }
}

TYPED_TEST(Parity, Unary) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (UnaryOp op : kUnaryOps) {
    const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt;
    for (int64_t n : kSizes) {
      const std::vector<T> x = random_vector<T, Rng>(n, positive ? 0.01 : -8.0, positive ? 20.0 : 8.0, n + 1);
      std::vector<T> cpu(x.size());
      unary_cpu(op, dtype_of<T>(), n, x.data(), cpu.data());
      auto d_x = upload(x);
      DeviceBuffer d_y(bytes_of(x));
      unary_cuda(stream(), op, dtype_of<T>(), n, d_x->get(), d_y.get());
      const std::string what = "unary op " + std::to_string(static_cast<int>(op)) + " n=" + std::to_string(n);
      if (is_exact(op)) {
        expect_equal(cpu, download<T>(d_y, x.size()), what);
      } else {
        // exp/log/erf/tanh are within 1-2 ulps of the correctly rounded result in both CUDA's and glibc's math
        // libraries, so composites differ by a few ulps of their terms: 8 eps relative. The |x| part covers
        // cancellation (gelu's 1 + erf at negative x, log near 1), where the error is relative to the input.
        expect_close(cpu, download<T>(d_y, x.size()),
                     [&](size_t i) { return 8 * kEps<T> * (std::abs(double(cpu[i])) + std::abs(double(x[i]))); }, what);
      }
    }
  }
}

TYPED_TEST(Parity, ActivationBackward) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const ActivationOp ops[] = {ActivationOp::Relu, ActivationOp::Gelu, ActivationOp::Silu, ActivationOp::Tanh,
                              ActivationOp::Sigmoid};
  for (ActivationOp op : ops) {
    for (int64_t n : kSizes) {
      const std::vector<T> x = random_vector<T, Rng>(n, -8, 8, n + 2), dy = random_vector<T, Rng>(n, -2, 2, n + 3);
      std::vector<T> cpu(x.size());
      activation_backward_cpu(op, dtype_of<T>(), n, x.data(), dy.data(), cpu.data());
      auto d_x = upload(x);
      auto d_dy = upload(dy);
      DeviceBuffer d_dx(bytes_of(x));
      activation_backward_cuda(stream(), op, dtype_of<T>(), n, d_x->get(), d_dy->get(), d_dx.get());
      // relu' is exact. The others: a few ulps from exp/erf/tanh, plus cancellation in 1 - t^2, s (1 - s) and
      // cdf + x pdf that is absolute, at the scale of |dy| (1 + |x|): 16 eps of that.
      expect_close(cpu, download<T>(d_dx, x.size()),
                   [&](size_t i) {
                     if (op == ActivationOp::Relu) return 0.0;
                     return 16 * kEps<T> *
                            (std::abs(double(cpu[i])) + std::abs(double(dy[i])) * (1 + std::abs(double(x[i]))));
                   },
                   "activation backward op " + std::to_string(static_cast<int>(op)) + " n=" + std::to_string(n));
    }
  }
}

TYPED_TEST(Parity, BinaryWithBroadcastingAndTransposes) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  struct Case {
    std::string name;
    Layout out, a, b;
  };
  std::vector<Case> cases;
  for (int64_t n : kSizes) {
    cases.push_back({"same shape n=" + std::to_string(n), contiguous({n}), contiguous({n}), contiguous({n})});
  }
  cases.push_back({"broadcast both", contiguous({3, 1023, 7}), make_layout({3, 1023, 7}, {7, 0, 1}),
                   make_layout({3, 1023, 7}, {0, 1, 0})});
  cases.push_back({"scalar b", contiguous({1023, 7}), contiguous({1023, 7}), make_layout({1023, 7}, {0, 0})});
  const int64_t big = (int64_t(1) << 20) + 3;
  cases.push_back({"scalar a", contiguous({big}), make_layout({big}, {0}), contiguous({big})});
  cases.push_back({"transposed a", contiguous({1023, 7}), make_layout({1023, 7}, {1, 1023}), contiguous({1023, 7})});
  cases.push_back({"transposed both, row broadcast", contiguous({65, 33}), make_layout({65, 33}, {1, 65}),
                   make_layout({65, 33}, {0, 1})});
  cases.push_back({"0-d", make_layout({}, {}), make_layout({}, {}), make_layout({}, {})});
  // rotary embeddings: permuted heads (B, H, T, hd) = (7, 4, 33, 32) times a (T, hd) table broadcast over (B, H)
  cases.push_back({"heads times table", contiguous({7, 4, 33, 32}), make_layout({7, 4, 33, 32}, {4224, 32, 128, 1}),
                   make_layout({7, 4, 33, 32}, {0, 0, 32, 1})});
  const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum,
                          BinaryOp::Minimum};
  for (const Case& c : cases) {
    std::vector<T> a = random_vector<T, Rng>(extent(c.a), -4, 4, 11);
    std::vector<T> b = random_vector<T, Rng>(extent(c.b), 0.25, 4, 12);  // away from 0 for Div
    for (size_t i = 0; i < b.size(); i += 2) b[i] = -b[i];
    const size_t n = static_cast<size_t>(c.out.numel());
    auto d_a = upload(a);
    auto d_b = upload(b);
    DeviceBuffer d_out(n * sizeof(T));
    for (BinaryOp op : ops) {
      std::vector<T> cpu(n);
      binary_cpu(op, dtype_of<T>(), c.out, a.data(), c.a, b.data(), c.b, cpu.data());
      binary_cuda(stream(), op, dtype_of<T>(), c.out, d_a->get(), c.a, d_b->get(), c.b, d_out.get());
      // One correctly rounded IEEE operation per element on both sides (CUDA's / is IEEE by default): exact.
      expect_equal(cpu, download<T>(d_out, n), c.name + " op " + std::to_string(static_cast<int>(op)));
    }
  }
}

TYPED_TEST(Parity, AffineAndAxpy) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const double alpha = 0.37, beta = -1.25;
  for (int64_t n : kSizes) {
    const std::vector<T> x = random_vector<T, Rng>(n, -10, 10, n + 4), y0 = random_vector<T, Rng>(n, -10, 10, n + 5);
    auto d_x = upload(x);
    // CUDA computes alpha * x + beta with one rounding (fma); the CPU does too where the host compiler
    // contracts it, else with two: at most one rounding of alpha * x apart, plus one of the result.
    const auto tol = [&](const std::vector<T>& ref) {
      return [&, ref](size_t i) { return kEps<T> * (std::abs(alpha * double(x[i])) + std::abs(double(ref[i]))); };
    };

    std::vector<T> cpu(x.size());
    affine_cpu(dtype_of<T>(), n, x.data(), alpha, beta, cpu.data());
    DeviceBuffer d_y(bytes_of(x));
    affine_cuda(stream(), dtype_of<T>(), n, d_x->get(), alpha, beta, d_y.get());
    expect_close(cpu, download<T>(d_y, x.size()), tol(cpu), "affine n=" + std::to_string(n));

    std::vector<T> cpu_y = y0;
    axpy_cpu(dtype_of<T>(), n, alpha, x.data(), cpu_y.data());
    auto d_y0 = upload(y0);
    axpy_cuda(stream(), dtype_of<T>(), n, alpha, d_x->get(), d_y0->get());
    expect_close(cpu_y, download<T>(*d_y0, x.size()), tol(cpu_y), "axpy n=" + std::to_string(n));
  }
}

// The fused SGD step: the same per-element math (core/kernels/math.h, one fma per line) on both sides, three
// steps so that the momentum buffer is written, then read.
TYPED_TEST(Parity, SgdStep) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const SgdStep variants[] = {{.lr = 0.1},
                              {.lr = 0.1, .momentum = 0.9, .dampening = 0.3},
                              {.lr = 0.05, .momentum = 0.9, .nesterov = true},
                              {.lr = 0.1, .momentum = 0.5, .weight_decay = 0.01}};
  for (int64_t n : kSizes) {
    for (const SgdStep& variant : variants) {
      std::vector<T> p = random_vector<T, Rng>(n, -1, 1, n + 6), buf(n);
      auto d_p = upload(p);
      DeviceBuffer d_buf(bytes_of(p));
      const bool momentum = variant.momentum != 0;
      for (int step = 0; step < 3; ++step) {
        const std::vector<T> g = random_vector<T, Rng>(n, -1, 1, n + 7 + step);
        auto d_g = upload(g);
        SgdStep s = variant;
        s.first_step = step == 0;
        sgd_step_cpu(dtype_of<T>(), n, p.data(), g.data(), momentum ? buf.data() : nullptr, s);
        sgd_step_cuda(stream(), dtype_of<T>(), n, d_p->get(), d_g->get(), momentum ? d_buf.get() : nullptr, s);
      }
      const auto ulps = [&](const std::vector<T>& ref) {
        return [&, ref](size_t i) { return 2 * kEps<T> * std::abs(double(ref[i])); };
      };
      const std::string what = "sgd n=" + std::to_string(n) + " momentum " + std::to_string(variant.momentum);
      expect_close(p, download<T>(*d_p, p.size()), ulps(p), what);
      if (momentum) expect_close(buf, download<T>(d_buf, buf.size()), ulps(buf), what + " buffer");
    }
  }
}

// The multi-tensor step (one launch for up to kFusedTensorsPerLaunch parameters): more parameters than one
// launch takes, of sizes on both sides of a block's chunk and empty ones, against the CPU's one-tensor step.
TYPED_TEST(Parity, SgdStepOverManyTensors) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const int64_t sizes[] = {0, 1, 7, 2047, 2048, 2049, 10000};
  const int count = kFusedTensorsPerLaunch + 5;
  std::vector<std::vector<T>> p(count), buf(count);
  std::vector<std::unique_ptr<DeviceBuffer>> d_p, d_buf;
  for (int k = 0; k < count; ++k) {
    const int64_t n = sizes[k % std::size(sizes)];
    p[k] = random_vector<T, Rng>(n, -1, 1, k + 11);
    buf[k].resize(n);
    d_p.push_back(upload(p[k]));
    d_buf.push_back(std::make_unique<DeviceBuffer>(bytes_of(p[k])));
  }
  const SgdStep variant{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
  for (int step = 0; step < 3; ++step) {
    std::vector<std::unique_ptr<DeviceBuffer>> d_g;  // alive until the stream has run the step (download waits)
    std::vector<SgdTensor> tensors;
    SgdStep s = variant;
    s.first_step = step == 0;
    for (int k = 0; k < count; ++k) {
      const std::vector<T> g = random_vector<T, Rng>(p[k].size(), -1, 1, 100 * step + k);
      sgd_step_cpu(dtype_of<T>(), static_cast<int64_t>(g.size()), p[k].data(), g.data(), buf[k].data(), s);
      d_g.push_back(upload(g));
      tensors.push_back({.n = static_cast<int64_t>(g.size()), .param = d_p[k]->get(), .grad = d_g[k]->get(),
                         .momentum_buffer = d_buf[k]->get()});
    }
    sgd_step_cuda(stream(), dtype_of<T>(), tensors, s);
    for (int k = 0; k < count; ++k) {
      const std::string what = "sgd over many tensors: tensor " + std::to_string(k) + " (n=" +
                               std::to_string(p[k].size()) + ") step " + std::to_string(step);
      const auto ulps = [](const std::vector<T>& ref) {
        return [&ref](size_t i) { return 2 * kEps<T> * std::abs(double(ref[i])); };
      };
      expect_close(p[k], download<T>(*d_p[k], p[k].size()), ulps(p[k]), what);
      expect_close(buf[k], download<T>(*d_buf[k], buf[k].size()), ulps(buf[k]), what + " buffer");
    }
  }
}

// Adam and AdamW over many tensors (one launch for up to 48) against the CPU's step: the same per-element
// expression (core/kernels/math.h), explicit fmas and correctly rounded square roots and quotients on both.
TYPED_TEST(Parity, AdamStepOverManyTensors) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const int64_t sizes[] = {0, 1, 7, 2047, 2048, 2049, 10000};
  const int count = kFusedTensorsPerLaunch + 5;
  for (bool decoupled : {false, true}) {
    std::vector<std::vector<T>> p(count), m(count), v(count);
    std::vector<std::unique_ptr<DeviceBuffer>> d_p, d_m, d_v;
    for (int k = 0; k < count; ++k) {
      const int64_t n = sizes[k % std::size(sizes)];
      p[k] = random_vector<T, Rng>(n, -1, 1, k + 71);
      m[k].assign(n, T(0));
      v[k].assign(n, T(0));
      d_p.push_back(upload(p[k]));
      d_m.push_back(upload(m[k]));
      d_v.push_back(upload(v[k]));
    }
    for (int step = 1; step <= 3; ++step) {
      const AdamStep s{.lr = 0.01, .weight_decay = 0.05, .decoupled = decoupled, .step = double(step)};
      std::vector<std::unique_ptr<DeviceBuffer>> d_g;  // alive until the downloads below have waited
      std::vector<AdamTensor> cpu, gpu;
      std::vector<std::vector<T>> g(count);
      for (int k = 0; k < count; ++k) {
        g[k] = random_vector<T, Rng>(p[k].size(), -1, 1, 100 * step + k + 7);
        d_g.push_back(upload(g[k]));
        const int64_t n = static_cast<int64_t>(p[k].size());
        cpu.push_back({n, p[k].data(), g[k].data(), m[k].data(), v[k].data()});
        gpu.push_back({n, d_p[k]->get(), d_g[k]->get(), d_m[k]->get(), d_v[k]->get()});
      }
      adam_step_cpu(dtype_of<T>(), cpu, s);
      adam_step_cuda(stream(), dtype_of<T>(), gpu, s);
      for (int k = 0; k < count; ++k) {
        const std::string what = std::string(decoupled ? "adamw" : "adam") + " over many tensors: tensor " +
                                 std::to_string(k) + " (n=" + std::to_string(p[k].size()) + ") step " +
                                 std::to_string(step);
        const auto ulps = [](const std::vector<T>& ref) {
          return [&ref](size_t i) { return 4 * kEps<T> * std::abs(double(ref[i])); };
        };
        expect_close(p[k], download<T>(*d_p[k], p[k].size()), ulps(p[k]), what);
        expect_close(m[k], download<T>(*d_m[k], m[k].size()), ulps(m[k]), what + " exp_avg");
        expect_close(v[k], download<T>(*d_v[k], v[k].size()), ulps(v[k]), what + " exp_avg_sq");
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Reductions.

// {1, 16384, 128}: tiny-llama's RMSNorm weight gradient (B*T rows of dim 128) and {2, 5003, 33}: pieces of
// unequal length, both split in two passes (Note [Split reductions] in reduce_cuda.cu), as is the 2^20 axis.
const AxisShape kReduceShapes[] = {{1, 0, 1},  {3, 0, 5},   {1, 1, 1},    {1, 7, 1},     {1, 1023, 1},
                                   {1, (1 << 20) + 3, 1}, {3, 1023, 7}, {5, 7, 1}, {2, 1, 9}, {1, 7, 1023},
                                   {4, 33, 65}, {0, 5, 3},  {2, 4099, 3}, {1031, 17, 1}, {1, 16384, 128},
                                   {2, 5003, 33}};

TYPED_TEST(Parity, Reduce) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const AxisReduction ops[] = {AxisReduction::Sum, AxisReduction::Mean, AxisReduction::Max, AxisReduction::Min};
  for (const AxisShape& s : kReduceShapes) {
    std::vector<T> x = random_vector<T, Rng>(s.outer * s.size * s.inner, -1, 1, s.size + 13);
    const size_t outputs = static_cast<size_t>(s.outer * s.inner);
    // Per output: sqrt(sum of x^2) along the axis, the scale of the summation error.
    std::vector<double> norm(outputs, 0.0);
    for (int64_t o = 0; o < s.outer; ++o) {
      for (int64_t j = 0; j < s.size; ++j) {
        for (int64_t i = 0; i < s.inner; ++i) {
          const double v = x[(o * s.size + j) * s.inner + i];
          norm[o * s.inner + i] += v * v;
        }
      }
    }
    for (double& v : norm) v = std::sqrt(v);
    auto d_x = upload(x);
    DeviceBuffer d_y(outputs * sizeof(T));
    for (AxisReduction op : ops) {
      if (s.size == 0 && op != AxisReduction::Sum) continue;  // rejected by both (the caller's contract)
      std::vector<T> cpu(outputs);
      reduce_cpu(op, dtype_of<T>(), s.outer, s.size, s.inner, x.data(), cpu.data());
      reduce_cuda(stream(), op, dtype_of<T>(), s.outer, s.size, s.inner, d_x->get(), d_y.get());
      const std::string what = "reduce op " + std::to_string(static_cast<int>(op)) + " " +
                               shape_str(s.outer, s.size, s.inner);
      if (op == AxisReduction::Max || op == AxisReduction::Min) {
        expect_equal(cpu, download<T>(d_y, outputs), what);  // no rounding at all
        continue;
      }
      // CPU (pairwise) and CUDA (strided partials + tree) add in different orders. Their rounding errors on
      // random-sign data behave like a random walk over the partial sums, whose size is about sqrt(sum x^2),
      // so the difference is a small multiple of eps * sqrt(size) * sqrt(sum x^2) (Higham & Mary 2019,
      // probabilistic error analysis): 4 of it, divided by size for the mean (plus its own rounding).
      const double div = op == AxisReduction::Mean ? double(s.size) : 1.0;
      expect_close(cpu, download<T>(d_y, outputs),
                   [&](size_t i) {
                     return 4 * kEps<T> * std::sqrt(double(s.size)) * norm[i] / div +
                            kEps<T> * std::abs(double(cpu[i]));
                   },
                   what);
    }
  }
}

TYPED_TEST(Parity, ReduceAndArgmaxPropagateNaN) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const AxisShape s{3, 1023, 7};
  std::vector<T> x = random_vector<T, Rng>(s.outer * s.size * s.inner, -1, 1, 5);
  x[(0 * s.size + 500) * s.inner + 3] = NAN;  // output (0, 3)
  x[(2 * s.size + 0) * s.inner + 6] = NAN;    // output (2, 6), at the first index
  x[(2 * s.size + 9) * s.inner + 6] = NAN;    // a second NaN: argmax returns the first
  const size_t outputs = static_cast<size_t>(s.outer * s.inner);
  auto d_x = upload(x);
  DeviceBuffer d_y(outputs * sizeof(T));
  for (AxisReduction op : {AxisReduction::Sum, AxisReduction::Max, AxisReduction::Min}) {
    std::vector<T> cpu(outputs);
    reduce_cpu(op, dtype_of<T>(), s.outer, s.size, s.inner, x.data(), cpu.data());
    reduce_cuda(stream(), op, dtype_of<T>(), s.outer, s.size, s.inner, d_x->get(), d_y.get());
    std::vector<T> gpu = download<T>(d_y, outputs);
    for (size_t i : {size_t(3), size_t(2 * 7 + 6)}) {
      EXPECT_TRUE(std::isnan(double(cpu[i])) && std::isnan(double(gpu[i])))
          << "op " << static_cast<int>(op) << " output " << i << ": cpu " << cpu[i] << " cuda " << gpu[i];
    }
  }
  std::vector<int64_t> cpu(outputs);
  argmax_cpu(dtype_of<T>(), s.outer, s.size, s.inner, x.data(), cpu.data());
  DeviceBuffer d_idx(outputs * sizeof(int64_t));
  argmax_cuda(stream(), dtype_of<T>(), s.outer, s.size, s.inner, d_x->get(), static_cast<int64_t*>(d_idx.get()));
  EXPECT_EQ(cpu, download<int64_t>(d_idx, outputs));
  EXPECT_EQ(cpu[3], 500);
  EXPECT_EQ(cpu[2 * 7 + 6], 0);
}

// Two-pass reductions add in a fixed order too: the same input gives the same bits on every call.
TYPED_TEST(Parity, SplitReductionIsDeterministic) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const AxisShape& s : {AxisShape{1, 16384, 128}, AxisShape{2, 5003, 33}, AxisShape{1, (1 << 20) + 3, 1}}) {
    std::vector<T> x = random_vector<T, Rng>(s.outer * s.size * s.inner, -1, 1, 77);
    const size_t outputs = static_cast<size_t>(s.outer * s.inner);
    auto d_x = upload(x);
    DeviceBuffer d_first(outputs * sizeof(T)), d_again(outputs * sizeof(T));
    for (AxisReduction op : {AxisReduction::Sum, AxisReduction::Mean}) {
      reduce_cuda(stream(), op, dtype_of<T>(), s.outer, s.size, s.inner, d_x->get(), d_first.get());
      reduce_cuda(stream(), op, dtype_of<T>(), s.outer, s.size, s.inner, d_x->get(), d_again.get());
      expect_equal(download<T>(d_first, outputs), download<T>(d_again, outputs),
                   "reduce op " + std::to_string(static_cast<int>(op)) + " " + shape_str(s.outer, s.size, s.inner));
    }
  }
}

TYPED_TEST(Parity, ArgmaxFirstIndexOfTies) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const AxisShape& s : kReduceShapes) {
    if (s.size == 0) continue;  // rejected by both
    // Values on a coarse grid (9 levels), so maxima tie often and the first index must win.
    std::vector<T> x = random_vector<T, Rng>(s.outer * s.size * s.inner, -1, 1, s.size + 17);
    for (T& v : x) v = std::round(v * 4) / 4;
    const size_t outputs = static_cast<size_t>(s.outer * s.inner);
    std::vector<int64_t> cpu(outputs);
    argmax_cpu(dtype_of<T>(), s.outer, s.size, s.inner, x.data(), cpu.data());
    auto d_x = upload(x);
    DeviceBuffer d_idx(outputs * sizeof(int64_t));
    argmax_cuda(stream(), dtype_of<T>(), s.outer, s.size, s.inner, d_x->get(), static_cast<int64_t*>(d_idx.get()));
    EXPECT_EQ(cpu, download<int64_t>(d_idx, outputs)) << "argmax " << shape_str(s.outer, s.size, s.inner);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Softmax.

const AxisShape kSoftmaxShapes[] = {{1, 1, 1},    {3, 7, 1},   {5, 1023, 1}, {1, (1 << 20) + 3, 1}, {3, 1023, 7},
                                    {2, 7, 1023}, {4, 1, 5},   {0, 3, 2},    {1031, 17, 1}};

// The index of the (outer, inner) row that element k of an (outer, size, inner) array belongs to.
size_t row_of(size_t k, const AxisShape& s) {
  return k / static_cast<size_t>(s.size * s.inner) * s.inner + k % s.inner;
}

TYPED_TEST(Parity, Softmax) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const AxisShape& s : kSoftmaxShapes) {
    const std::vector<T> x = random_vector<T, Rng>(s.outer * s.size * s.inner, -10, 10, s.size + 19);
    auto d_x = upload(x);
    DeviceBuffer d_y(bytes_of(x));
    for (SoftmaxKind kind : {SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax}) {
      std::vector<T> cpu(x.size());
      softmax_cpu(kind, dtype_of<T>(), s.outer, s.size, s.inner, x.data(), cpu.data());
      softmax_cuda(stream(), kind, dtype_of<T>(), s.outer, s.size, s.inner, d_x->get(), d_y.get());
      // Both sum exp in double and round once; exp itself differs by <= 2 ulps between CUDA and glibc, and
      // the double sums' different orders add ~eps(double) sqrt(size) relative (which matters for float64
      // only): (8 + 2 sqrt(size)) eps relative, taken at the scale max(1, |y|) for log-softmax.
      const double rel = (8 + 2 * std::sqrt(double(s.size))) * kEps<T>;
      expect_close(cpu, download<T>(d_y, x.size()),
                   [&](size_t i) {
                     const double y = std::abs(double(cpu[i]));
                     return rel * (kind == SoftmaxKind::Softmax ? y : std::max(1.0, y));
                   },
                   std::string(kind == SoftmaxKind::Softmax ? "softmax " : "log_softmax ") +
                       shape_str(s.outer, s.size, s.inner));
    }
  }
}

TYPED_TEST(Parity, SoftmaxBackward) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const AxisShape& s : kSoftmaxShapes) {
    const std::vector<T> x = random_vector<T, Rng>(s.outer * s.size * s.inner, -5, 5, s.size + 23);
    const std::vector<T> dy = random_vector<T, Rng>(x.size(), -1, 1, s.size + 29);
    auto d_dy = upload(dy);
    DeviceBuffer d_dx(bytes_of(x));
    for (SoftmaxKind kind : {SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax}) {
      std::vector<T> y(x.size());
      softmax_cpu(kind, dtype_of<T>(), s.outer, s.size, s.inner, x.data(), y.data());  // the same y for both
      // Per row: sum |dy y| (softmax) or sum |dy| (log-softmax), the scale of the row sum and its error.
      std::vector<double> scale(static_cast<size_t>(s.outer * s.inner), 0.0);
      for (size_t k = 0; k < x.size(); ++k) {
        scale[row_of(k, s)] += std::abs(double(dy[k])) * (kind == SoftmaxKind::Softmax ? std::abs(double(y[k])) : 1.0);
      }
      std::vector<T> cpu(x.size());
      softmax_backward_cpu(kind, dtype_of<T>(), s.outer, s.size, s.inner, y.data(), dy.data(), cpu.data());
      auto d_y = upload(y);
      softmax_backward_cuda(stream(), kind, dtype_of<T>(), s.outer, s.size, s.inner, d_y->get(), d_dy->get(),
                            d_dx.get());
      // The row sum is accumulated in double on both sides and rounded to T once (1 ulp of the sum apart, plus
      // eps(double) sqrt(size) of the sum's scale for float64); then two or three roundings per element and,
      // for log-softmax, exp (2 ulps). 4 eps of each term's magnitude, 2 sqrt(size) eps of the row sum's.
      const double rows = 2 * std::sqrt(double(s.size));
      expect_close(cpu, download<T>(d_dx, x.size()),
                   [&](size_t k) {
                     const double sc = scale[row_of(k, s)], dyk = std::abs(double(dy[k]));
                     if (kind == SoftmaxKind::Softmax) {
                       return kEps<T> * std::abs(double(y[k])) * (4 * (dyk + sc) + rows * sc);
                     }
                     return kEps<T> * (4 * dyk + (4 + rows) * std::exp(double(y[k])) * sc);
                   },
                   std::string(kind == SoftmaxKind::Softmax ? "softmax backward " : "log_softmax backward ") +
                       shape_str(s.outer, s.size, s.inner));
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Random fills.

// nll_loss's reduction='mean' in one launch each way (nll_mean_*_cuda) against the CPU's composition: the
// per-position losses (nll_forward_cpu), their sum and count rounded to T, one division; the backward is the
// same division and negation on both, so bitwise equal. Shapes: the CNN's (256, 10), positions beyond the
// block's 256 threads with an inner axis, ignored targets, and every target ignored (NaN).
TYPED_TEST(Parity, NllMean) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  struct Case {
    int64_t outer, classes, inner;
    bool all_ignored;
  };
  for (const Case& c : {Case{256, 10, 1, false}, Case{9, 7, 61, false}, Case{5, 3, 2, true}}) {
    const std::string what = "nll mean (" + std::to_string(c.outer) + ", " + std::to_string(c.classes) + ", " +
                             std::to_string(c.inner) + ")";
    const size_t positions = static_cast<size_t>(c.outer * c.inner);
    const std::vector<T> lp = random_vector<T, Rng>(positions * static_cast<size_t>(c.classes), -5, 0, 67);
    std::vector<int64_t> target(positions);
    for (size_t k = 0; k < positions; ++k) {
      target[k] = c.all_ignored || k % 5 == 3 ? -100 : static_cast<int64_t>(k * 7 % static_cast<size_t>(c.classes));
    }
    std::vector<T> loss(positions), valid(positions);
    nll_forward_cpu(dtype_of<T>(), c.outer, c.classes, c.inner, lp.data(), target.data(), -100, loss.data(),
                    valid.data());
    double loss_sum = 0, count = 0, scale = 0;
    for (size_t k = 0; k < positions; ++k) {
      loss_sum += loss[k];
      count += valid[k];
      scale += std::abs(double(loss[k]));
    }
    const std::vector<T> want{static_cast<T>(loss_sum) / static_cast<T>(count)}, want_count{static_cast<T>(count)};

    auto d_lp = upload(lp), d_target = upload(target);
    DeviceBuffer d_out(sizeof(T)), d_count(sizeof(T));
    nll_mean_forward_cuda(stream(), dtype_of<T>(), c.outer, c.classes, c.inner, d_lp->get(),
                          static_cast<const int64_t*>(d_target->get()), -100, d_out.get(), d_count.get());
    expect_equal(want_count, download<T>(d_count, 1), "count of " + what);
    // The sums' orders differ: log2(positions) + 1 roundings of the sum's scale, then the division's.
    const double depth = std::log2(std::max<double>(2, double(positions))) + 1;
    expect_close(want, download<T>(d_out, 1),
                 [&](size_t) { return depth * kEps<T> * scale / std::max(count, 1.0) + kEps<T> * std::abs(want[0]); },
                 what);

    const std::vector<T> g{T(0.75)};
    std::vector<T> grad_loss(positions, g[0] / static_cast<T>(count)), dx(lp.size());
    nll_backward_cpu(dtype_of<T>(), c.outer, c.classes, c.inner, target.data(), -100, grad_loss.data(), dx.data());
    auto d_g = upload(g);
    DeviceBuffer d_dx(bytes_of(lp));
    nll_mean_backward_cuda(stream(), dtype_of<T>(), c.outer, c.classes, c.inner,
                           static_cast<const int64_t*>(d_target->get()), -100, d_g->get(), d_count.get(), d_dx.get());
    expect_equal(dx, download<T>(d_dx, dx.size()), "backward of " + what);
  }
}

// The statistics pass's extras (BatchNormStatsExtras: invstd, the running statistics' update) on the GPU: the
// same expression as the host's write_stats_extras on the GPU's own mean and var, all correctly rounded
// operations, so bitwise equal (the mean and var themselves are BatchNormPasses' business).
TYPED_TEST(Parity, BatchNormStatsExtras) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const BatchNormShape& base : {BatchNormShape{{}, 4, 5, 33}, BatchNormShape{{}, 256, 64, 196}}) {
    BatchNormShape s = base;
    s.dtype = dtype_of<T>();
    const std::string what = "N " + std::to_string(s.n) + " C " + std::to_string(s.c) + " S " + std::to_string(s.s);
    const size_t total = static_cast<size_t>(s.n * s.c * s.s), channels = static_cast<size_t>(s.c);
    const std::vector<T> x = random_vector<T, Rng>(total, -3, 5, 53);
    std::vector<T> running_mean = random_vector<T, Rng>(channels, -1, 1, 59);
    std::vector<T> running_var = random_vector<T, Rng>(channels, 0.5, 2, 61);
    auto d_x = upload(x), d_rm = upload(running_mean), d_rv = upload(running_var);
    DeviceBuffer d_mean(bytes_of(running_mean)), d_var(bytes_of(running_mean)), d_invstd(bytes_of(running_mean));
    std::vector<int64_t> counter{41};
    auto d_counter = upload(counter);
    const BatchNormStatsExtras extras{.invstd = d_invstd.get(), .eps = 1e-5, .running_mean = d_rm->get(),
                                      .running_var = d_rv->get(), .momentum = 0.1,
                                      .num_batches_tracked = static_cast<int64_t*>(d_counter->get())};
    batch_norm_stats_cuda(stream(), s, d_x->get(), d_mean.get(), d_var.get(), extras);
    EXPECT_EQ(download<int64_t>(*d_counter, 1), std::vector<int64_t>{42}) << "num_batches_tracked " << what;
    const std::vector<T> mean = download<T>(d_mean, channels), var = download<T>(d_var, channels);
    std::vector<T> invstd(channels);
    const BatchNormStatsExtras on_host{.invstd = invstd.data(), .eps = 1e-5, .running_mean = running_mean.data(),
                                       .running_var = running_var.data(), .momentum = 0.1};
    for (size_t c = 0; c < channels; ++c) {
      detail::write_stats_extras(on_host, static_cast<int64_t>(c), s.n * s.s, mean[c], var[c]);
    }
    expect_equal(invstd, download<T>(d_invstd, channels), "stats invstd " + what);
    expect_equal(running_mean, download<T>(*d_rm, channels), "stats running_mean " + what);
    expect_equal(running_var, download<T>(*d_rv, channels), "stats running_var " + what);
  }
}

// Batch normalisation's passes (batch_norm.h), each fed the same inputs on both sides (the CPU's statistics
// for the elementwise passes). The CUDA reductions cut a channel into pieces (Note [Batch-norm reductions on
// CUDA]): one piece up to M = 4096 values, 257 for the (1, 1, 2^20 + 3) shape, 8 for the CNN's (256, 64, 196).
// Sums accumulate in double on both in different orders, then round once: one or two ulps of the result's
// scale. The elementwise passes compute the same float expression, up to FMA
// contraction: a few ulps of the magnitudes that meet in it.
TYPED_TEST(Parity, BatchNormPasses) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const BatchNormShape& base : {BatchNormShape{{}, 7, 3, 1}, BatchNormShape{{}, 4, 5, 33},
                                     BatchNormShape{{}, 2, 64, 196}, BatchNormShape{{}, 1, 1, (int64_t(1) << 20) + 3},
                                     BatchNormShape{{}, 3, 0, 4}, BatchNormShape{{}, 256, 64, 196}}) {
    BatchNormShape s = base;
    s.dtype = dtype_of<T>();
    const std::string what = "N " + std::to_string(s.n) + " C " + std::to_string(s.c) + " S " + std::to_string(s.s);
    const size_t total = static_cast<size_t>(s.n * s.c * s.s), channels = static_cast<size_t>(s.c);
    const std::vector<T> x = random_vector<T, Rng>(total, 2, 6, s.s + 31), dy = random_vector<T, Rng>(total, -1, 1, 37);
    const std::vector<T> w = random_vector<T, Rng>(channels, 0.5, 2, 41), b = random_vector<T, Rng>(channels, -1, 1, 43);
    std::vector<T> mean(channels), var(channels), invstd(channels), y(total), g(channels), gx(channels), dx(total);
    batch_norm_stats_cpu(s, x.data(), mean.data(), var.data());
    for (size_t c = 0; c < channels; ++c) invstd[c] = T(1) / std::sqrt(var[c] + T(1e-5));
    batch_norm_elemt_cpu(s, x.data(), mean.data(), invstd.data(), w.data(), b.data(), y.data());
    batch_norm_backward_reduce_cpu(s, dy.data(), x.data(), mean.data(), g.data(), gx.data());
    batch_norm_backward_elemt_cpu(s, true, dy.data(), x.data(), mean.data(), invstd.data(), w.data(), g.data(),
                                  gx.data(), dx.data());

    auto d_x = upload(x), d_dy = upload(dy), d_w = upload(w), d_b = upload(b), d_mean = upload(mean),
         d_invstd = upload(invstd), d_g = upload(g), d_gx = upload(gx);
    DeviceBuffer d_out(std::max<size_t>(1, bytes_of(x))), d_c1(std::max<size_t>(1, bytes_of(mean))),
        d_c2(std::max<size_t>(1, bytes_of(mean)));
    // Per channel: sum |x|, sum |dy|, sum |dy (x - mean)|: the scales of the sums' rounding.
    std::vector<double> sum_x(channels), sum_dy(channels), sum_dy_xmu(channels);
    for (size_t k = 0; k < total; ++k) {
      const size_t c = k / static_cast<size_t>(s.s) % channels;
      sum_x[c] += std::abs(double(x[k]));
      sum_dy[c] += std::abs(double(dy[k]));
      sum_dy_xmu[c] += std::abs(double(dy[k]) * (double(x[k]) - double(mean[c])));
    }
    const double m = double(s.n * s.s);
    // The two sides sum the m terms in different trees; either's rounding is at most depth x eps x sum |terms|
    // with depth ~ log2(m). A flat 2 eps was 1 ulp short for float64 on the H200 (m = 132 and 2^20 + 3).
    const double depth = std::log2(std::max(m, 2.0)) + 1;
    batch_norm_stats_cuda(stream(), s, d_x->get(), d_c1.get(), d_c2.get());
    expect_close(mean, download<T>(d_c1, channels), [&](size_t c) { return depth * kEps<T> * sum_x[c] / m; },
                 "stats mean " + what);
    expect_close(var, download<T>(d_c2, channels), [&](size_t c) { return 2 * depth * kEps<T> * var[c]; },
                 "stats var " + what);

    batch_norm_elemt_cuda(stream(), s, d_x->get(), d_mean->get(), d_invstd->get(), d_w->get(), d_b->get(), d_out.get());
    expect_close(y, download<T>(d_out, total),
                 [&](size_t k) {
                   const size_t c = k / static_cast<size_t>(s.s) % channels;
                   return 4 * kEps<T> * (std::abs(double(x[k]) - mean[c]) * invstd[c] * w[c] + std::abs(double(b[c])));
                 },
                 "elemt " + what);

    batch_norm_backward_reduce_cuda(stream(), s, d_dy->get(), d_x->get(), d_mean->get(), d_c1.get(), d_c2.get());
    expect_close(g, download<T>(d_c1, channels), [&](size_t c) { return 2 * kEps<T> * sum_dy[c]; },
                 "backward_reduce sum_dy " + what);
    expect_close(gx, download<T>(d_c2, channels), [&](size_t c) { return 2 * kEps<T> * sum_dy_xmu[c]; },
                 "backward_reduce sum_dy_xmu " + what);
    // The same first sum alone (a convolution's bias gradient): the same pieces and order, so the same bits.
    channel_sum_cuda(stream(), s, d_dy->get(), d_c2.get());
    expect_equal(download<T>(d_c1, channels), download<T>(d_c2, channels), "channel_sum " + what);

    for (bool batch_stats : {true, false}) {
      std::vector<T> want = dx;
      if (!batch_stats) {
        batch_norm_backward_elemt_cpu(s, false, dy.data(), nullptr, nullptr, invstd.data(), w.data(), nullptr, nullptr,
                                      want.data());
      }
      batch_norm_backward_elemt_cuda(stream(), s, batch_stats, d_dy->get(), d_x->get(), d_mean->get(),
                                     d_invstd->get(), d_w->get(), d_g->get(), d_gx->get(), d_out.get());
      expect_close(want, download<T>(d_out, total),
                   [&](size_t k) {
                     const size_t c = k / static_cast<size_t>(s.s) % channels;
                     const double terms = std::abs(double(dy[k])) + std::abs(double(g[c])) / m +
                                          std::abs(double(x[k]) - mean[c]) * invstd[c] * invstd[c] *
                                              std::abs(double(gx[c])) / m;
                     return 8 * kEps<T> * terms * invstd[c] * w[c];
                   },
                   std::string("backward_elemt ") + (batch_stats ? "batch " : "running ") + what);
    }
  }
}

TYPED_TEST(Parity, RandomFills) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const PhiloxState states[] = {{0, 0}, {42, 0}, {42, 1000003}, {0xdeadbeefcafef00dULL, ~uint64_t(0) - 5}};
  for (const PhiloxState& state : states) {
    for (int64_t n : kSizes) {
      const std::string what = " n=" + std::to_string(n) + " seed=" + std::to_string(state.seed) + " offset=" +
                               std::to_string(state.offset);
      DeviceBuffer d(static_cast<size_t>(n) * sizeof(T));
      std::vector<T> cpu(static_cast<size_t>(n));

      // uniform and bernoulli: the same Philox words and the same double arithmetic, rounded once: exact.
      // (uniform's low + (high - low) * u is an fma on CUDA; the CPU gets the same single rounding only because
      // GCC contracts it at -O2 on FMA hardware, which dpe's build flags give.)
      uniform_cpu(dtype_of<T>(), n, state, -2.0, 3.0, cpu.data());
      uniform_cuda(stream(), dtype_of<T>(), n, state, -2.0, 3.0, d.get());
      expect_equal(cpu, download<T>(d, cpu.size()), "uniform" + what);

      bernoulli_cpu(dtype_of<T>(), n, state, 0.3, cpu.data());
      bernoulli_cuda(stream(), dtype_of<T>(), n, state, 0.3, d.get());
      expect_equal(cpu, download<T>(d, cpu.size()), "bernoulli" + what);

      // normal: Box-Muller's log and cos in double differ by an ulp or two between CUDA and glibc, which the
      // final rounding to float32 almost always hides: one ulp of T, plus 64 eps(double) of std (1 + |z|).
      const double mean = 0.5, std = 2.0;
      normal_cpu(dtype_of<T>(), n, state, mean, std, cpu.data());
      normal_cuda(stream(), dtype_of<T>(), n, state, mean, std, d.get());
      expect_close(cpu, download<T>(d, cpu.size()),
                   [&](size_t i) {
                     const double v = double(cpu[i]);
                     return kEps<T> * std::abs(v) + 64 * kEps<double> * (std + std::abs(v - mean));
                   },
                   "normal" + what);
    }
  }
}

TYPED_TEST(Parity, RandomFillDependsOnlyOnTheCounter) {
  SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const int64_t n = 100003, skip = 17;
  DeviceBuffer whole(static_cast<size_t>(n + skip) * sizeof(T)), tail(static_cast<size_t>(n) * sizeof(T));
  uniform_cuda(stream(), dtype_of<T>(), n + skip, PhiloxState{7, 100}, 0.0, 1.0, whole.get());
  uniform_cuda(stream(), dtype_of<T>(), n, PhiloxState{7, 100 + skip}, 0.0, 1.0, tail.get());
  std::vector<T> w = download<T>(whole, static_cast<size_t>(n + skip));
  expect_equal(std::vector<T>(w.begin() + skip, w.end()), download<T>(tail, static_cast<size_t>(n)), "offset");
}

// ---------------------------------------------------------------------------------------------------------
// GEMM.

struct GemmCase {
  int64_t m, n, k;
  Transpose ta, tb;
  int64_t batch = 1;
  bool broadcast_a = false, broadcast_b = false;  // batch stride 0
  double alpha = 1.0, beta = 0.0;
  int64_t pad = 0;  // extra elements per row (ld > minimal) and between batch matrices
};

std::string describe(const GemmCase& c) {
  std::ostringstream os;
  os << "gemm m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << (c.ta == Transpose::Yes)
     << " tb=" << (c.tb == Transpose::Yes) << " batch=" << c.batch << " bcast_a=" << c.broadcast_a
     << " bcast_b=" << c.broadcast_b << " alpha=" << c.alpha << " beta=" << c.beta << " pad=" << c.pad;
  return os.str();
}

template <typename T>
void check_gemm(const GemmCase& c) {
  // Stored matrices (row-major): A is (m, k), or (k, m) when transposed; likewise B (k, n) or (n, k).
  const int64_t a_rows = c.ta == Transpose::No ? c.m : c.k, a_cols = c.ta == Transpose::No ? c.k : c.m;
  const int64_t b_rows = c.tb == Transpose::No ? c.k : c.n, b_cols = c.tb == Transpose::No ? c.n : c.k;
  GemmArgs g;
  g.dtype = dtype_of<T>();
  g.trans_a = c.ta;
  g.trans_b = c.tb;
  g.m = c.m, g.n = c.n, g.k = c.k;
  g.alpha = c.alpha, g.beta = c.beta;
  g.lda = std::max<int64_t>(1, a_cols + c.pad);
  g.ldb = std::max<int64_t>(1, b_cols + c.pad);
  g.ldc = std::max<int64_t>(1, c.n + c.pad);
  g.batch = c.batch;
  g.stride_a = c.broadcast_a ? 0 : a_rows * g.lda + c.pad;
  g.stride_b = c.broadcast_b ? 0 : b_rows * g.ldb + c.pad;
  g.stride_c = c.m * g.ldc + c.pad;
  const int64_t a_size = (c.broadcast_a ? 1 : c.batch) * (a_rows * g.lda + c.pad);
  const int64_t b_size = (c.broadcast_b ? 1 : c.batch) * (b_rows * g.ldb + c.pad);
  const int64_t c_size = c.batch * g.stride_c;
  const std::vector<T> a = random_vector<T, Rng>(a_size, -1, 1, 31), b = random_vector<T, Rng>(b_size, -1, 1, 37);
  std::vector<T> c0 = random_vector<T, Rng>(c_size, -1, 1, 41);
  if (c.beta == 0) std::fill(c0.begin(), c0.end(), T(NAN));  // beta == 0 must ignore C, NaN included

  std::vector<T> cpu = c0;
  GemmArgs host = g;
  host.a = a.data(), host.b = b.data(), host.c = cpu.data();
  gemm_cpu(host);

  auto d_a = upload(a);
  auto d_b = upload(b);
  auto d_c = upload(c0);
  GemmArgs dev = g;
  dev.a = d_a->get(), dev.b = d_b->get(), dev.c = d_c->get();
  gemm_cuda(stream(), cuda::cublas_handle(kDevice), dev);
  const std::vector<T> gpu = download<T>(*d_c, c0.size());

  // Each product element is a k-term dot product; any summation order (blocked, split-k, FMA or not) is
  // within k eps (|A| |B|)_ij of the exact value (the standard bound gamma_k), so two are within 2 (k + 2)
  // eps |alpha| (|A| |B|)_ij, plus the beta * C term's and the final rounding. Padding must be untouched.
  std::vector<double> tol(c0.size(), 0.0);
  auto at = [](const std::vector<T>& v, int64_t i) { return std::abs(double(v[static_cast<size_t>(i)])); };
  for (int64_t bt = 0; bt < c.batch; ++bt) {
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double abs_ab = 0;
        for (int64_t l = 0; l < c.k; ++l) {
          const int64_t ai = bt * g.stride_a + (c.ta == Transpose::No ? i * g.lda + l : l * g.lda + i);
          const int64_t bi = bt * g.stride_b + (c.tb == Transpose::No ? l * g.ldb + j : j * g.ldb + l);
          abs_ab += at(a, ai) * at(b, bi);
        }
        const int64_t ci = bt * g.stride_c + i * g.ldc + j;
        const double beta_c = c.beta == 0 ? 0.0 : std::abs(c.beta) * at(c0, ci);
        tol[ci] = kEps<T> * (2 * (c.k + 2) * std::abs(c.alpha) * abs_ab + 2 * beta_c + at(cpu, ci));
      }
    }
  }
  expect_close(cpu, gpu, [&](size_t i) { return tol[i]; }, describe(c));
}

TYPED_TEST(Parity, GemmTransposesAndSizes) {
  SKIP_WITHOUT_GPU();
  const int64_t dims[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 65, 129}, {257, 129, 511}, {1, 1023, 7}, {1023, 1, 1}};
  for (const auto& d : dims) {
    const int64_t m = d[0], n = d[1], k = d[2];
    for (Transpose ta : {Transpose::No, Transpose::Yes}) {
      for (Transpose tb : {Transpose::No, Transpose::Yes}) {
        check_gemm<TypeParam>({m, n, k, ta, tb});
        check_gemm<TypeParam>({m, n, k, ta, tb, 1, false, false, 0.5, 2.0, 3});  // alpha, beta, padded lds
      }
    }
  }
}

TYPED_TEST(Parity, GemmBatchedWithBroadcast) {
  SKIP_WITHOUT_GPU();
  for (Transpose ta : {Transpose::No, Transpose::Yes}) {
    for (Transpose tb : {Transpose::No, Transpose::Yes}) {
      check_gemm<TypeParam>({17, 9, 23, ta, tb, 3});
      check_gemm<TypeParam>({17, 9, 23, ta, tb, 3, false, true});         // one B for the whole batch
      check_gemm<TypeParam>({17, 9, 23, ta, tb, 5, true, false, 1.5, 0.0, 2});  // one A, padded
      check_gemm<TypeParam>({64, 32, 48, ta, tb, 4, false, true, -1.0, 1.0, 1});
    }
  }
}

TYPED_TEST(Parity, GemmDegenerateSizes) {
  SKIP_WITHOUT_GPU();
  check_gemm<TypeParam>({5, 7, 0, Transpose::No, Transpose::No, 2, false, false, 1.0, 2.0});  // C = beta C
  check_gemm<TypeParam>({5, 7, 0, Transpose::No, Transpose::Yes, 2});  // beta 0: C = 0, NaN ignored
  check_gemm<TypeParam>({7, 5, 3, Transpose::No, Transpose::No, 2, false, false, 0.0, 0.5});  // alpha 0
  check_gemm<TypeParam>({7, 5, 3, Transpose::Yes, Transpose::No, 1, false, false, 0.0, 0.0});  // C = 0
  check_gemm<TypeParam>({0, 7, 3, Transpose::No, Transpose::No});
  check_gemm<TypeParam>({5, 0, 3, Transpose::Yes, Transpose::No});
  check_gemm<TypeParam>({5, 7, 3, Transpose::No, Transpose::No, 0});
}

// 16-bit operands (autocast's products, float32 C). bfloat16: CPU (oneDNN) against CUDA (cublasGemmEx) on the
// same operands; float16, which CPU does not run: CUDA against a float64 product of the same half values. A
// product of two 16-bit values is exact in float32, so the float32 bound of check_gemm applies.
void check_gemm_16bit(DType dtype, int64_t m, int64_t n, int64_t k, Transpose ta, Transpose tb, double beta) {
  const int64_t a_cols = ta == Transpose::No ? k : m, a_rows = ta == Transpose::No ? m : k;
  const int64_t b_cols = tb == Transpose::No ? n : k, b_rows = tb == Transpose::No ? k : n;
  GemmArgs g;
  g.dtype = dtype;
  g.trans_a = ta, g.trans_b = tb;
  g.m = m, g.n = n, g.k = k;
  g.beta = beta;
  g.lda = a_cols, g.ldb = b_cols, g.ldc = n;
  std::vector<float> a = random_vector<float, Rng>(a_rows * a_cols, -1, 1, 43);
  std::vector<float> b = random_vector<float, Rng>(b_rows * b_cols, -1, 1, 47);
  const std::vector<float> c0 = random_vector<float, Rng>(m * n, -1, 1, 53);
  std::vector<uint16_t> a16, b16;  // the 16-bit patterns; a and b become their values
  for (std::vector<float>* v : {&a, &b}) {
    std::vector<uint16_t>& bits = v == &a ? a16 : b16;
    for (float& x : *v) {
      if (dtype == DType::BFloat16) {
        bits.push_back(float_to_bfloat16(x).bits);
        x = bfloat16_to_float(BFloat16{bits.back()});
      } else {
        bits.push_back(float_to_half(x).bits);
        x = half_to_float(Half{bits.back()});
      }
    }
  }
  std::vector<float> want(c0.size());
  std::vector<double> tol(c0.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0, abs_ab = 0;
      for (int64_t l = 0; l < k; ++l) {
        const double x = a[ta == Transpose::No ? i * g.lda + l : l * g.lda + i];
        const double y = b[tb == Transpose::No ? l * g.ldb + j : j * g.ldb + l];
        dot += x * y;
        abs_ab += std::abs(x * y);
      }
      const size_t ci = static_cast<size_t>(i * n + j);
      want[ci] = static_cast<float>(dot + beta * c0[ci]);
      tol[ci] = kEps<float> * (2 * (k + 2) * abs_ab + 2 * std::abs(beta * c0[ci]) + std::abs(want[ci]));
    }
  }
  if (dtype == DType::BFloat16 && cpu_isa() >= CpuIsa::Avx512) {  // the CPU kernel's sums, where it runs
    std::vector<float> cpu = c0;
    GemmArgs host = g;
    host.a = a16.data(), host.b = b16.data(), host.c = cpu.data();
    gemm_cpu(host);
    want = cpu;
  }
  auto d_a = upload(a16);
  auto d_b = upload(b16);
  auto d_c = upload(c0);
  GemmArgs dev = g;
  dev.a = d_a->get(), dev.b = d_b->get(), dev.c = d_c->get();
  gemm_cuda(stream(), cuda::cublas_handle(kDevice), dev);
  const std::vector<float> gpu = download<float>(*d_c, c0.size());
  std::ostringstream label;
  label << dtype << " gemm m=" << m << " n=" << n << " k=" << k << " ta=" << (ta == Transpose::Yes)
        << " tb=" << (tb == Transpose::Yes) << " beta=" << beta;
  expect_close(want, gpu, [&](size_t i) { return tol[i]; }, label.str());
}

TEST(Parity16, GemmBf16AndFp16OperandsAccumulateInFloat32) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    for (Transpose ta : {Transpose::No, Transpose::Yes}) {
      for (Transpose tb : {Transpose::No, Transpose::Yes}) {
        check_gemm_16bit(dtype, 1, 1, 1, ta, tb, 0.0);
        check_gemm_16bit(dtype, 33, 17, 65, ta, tb, 0.0);
        check_gemm_16bit(dtype, 128, 96, 200, ta, tb, 0.5);
      }
    }
  }
}

#endif  // DPE_WITH_CUDA

}  // namespace
}  // namespace dpe::kernels
