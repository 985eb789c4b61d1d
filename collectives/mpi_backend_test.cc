// ProcessGroup on the MPI backend, run as every process of `mpirun -np 2` (mpirun_test.sh): each process
// brings two CPU devices, so the group has four members in all, and every result is checked against the
// same collective computed here over all four.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "collectives/mpi_world.h"
#include "collectives/process_group.h"
#include "core/error.h"
#include "core/ops.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

using collectives::MpiWorld;
using testing::run_members;


ProcessGroup make_group(int members) {
  std::vector<Device> devices;
  for (int d = 0; d < members; ++d) devices.push_back(Device::cpu(d));
  return ProcessGroup(devices, {.backend = CollectiveBackend::Mpi, .timeout = std::chrono::seconds(60)});
}

// Member g's (global rank) element i: small integers, exact in every dtype and after any sum of four.
double value(int g, int64_t i) { return static_cast<double>((i * 7 + g * 3) % 10); }

TEST(MpiBackend, MembersAreNumberedAcrossProcesses) {
  const int processes = MpiWorld::get().place().size, index = MpiWorld::get().place().rank;
  ProcessGroup group = make_group(2);
  EXPECT_EQ(group.backend(), CollectiveBackend::Mpi);
  EXPECT_EQ(group.size(), 2);
  EXPECT_EQ(group.world_size(), 2 * processes);
  EXPECT_EQ(group.global_rank(0), 2 * index);
  EXPECT_EQ(group.global_rank(1), 2 * index + 1);
}

TEST(MpiBackend, AllReduceCombinesEveryMemberOfEveryProcess) {
  ProcessGroup group = make_group(2);
  const int world = group.world_size();
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::Int32}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      const bool floating = dtype == DType::Float32 || dtype == DType::Float64;
      if (op == ReduceOp::Avg && !floating) continue;
      // 100003: shares of unequal, line-aligned sizes; 3: member 1's share is empty.
      for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{100003}}) {
        std::vector<Tensor> tensors;
        for (int r = 0; r < group.size(); ++r) {
          std::vector<double> v(count);
          for (int64_t i = 0; i < count; ++i) v[i] = value(group.global_rank(r), i);
          tensors.push_back(Tensor::from_vector(v, {count}, TensorOptions(dtype).with_device(Device::cpu(r))));
        }
        const auto errors = run_members(group.size(), [&](int r) { group.all_reduce(r, tensors[r], op); });
        for (const std::string& e : errors) ASSERT_EQ(e, "");
        for (int r = 0; r < group.size(); ++r) {
          const std::vector<double> got = tensors[r].to(DType::Float64).to_vector<double>();
          for (int64_t i = 0; i < count; ++i) {
            double want = value(0, i);
            for (int g = 1; g < world; ++g) {
              const double x = value(g, i);
              want = op == ReduceOp::Max ? std::max(want, x) : op == ReduceOp::Min ? std::min(want, x) : want + x;
            }
            if (op == ReduceOp::Avg) want /= world;
            ASSERT_EQ(got[i], want) << dtype_name(dtype) << " " << reduce_op_name(op) << " count " << count
                                    << " member " << r << " element " << i;
          }
        }
      }
    }
  }
}

TEST(MpiBackend, BroadcastFromEveryGlobalRoot) {
  ProcessGroup group = make_group(2);
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Int64}) {
    for (int root = 0; root < group.world_size(); ++root) {
      const int64_t count = 100003;
      std::vector<Tensor> tensors;
      for (int r = 0; r < group.size(); ++r) {
        std::vector<double> v(count);
        for (int64_t i = 0; i < count; ++i) v[i] = value(group.global_rank(r), i);
        tensors.push_back(Tensor::from_vector(v, {count}, TensorOptions(dtype).with_device(Device::cpu(r))));
      }
      for (const std::string& e : run_members(group.size(), [&](int r) { group.broadcast(r, tensors[r], root); })) {
        ASSERT_EQ(e, "");
      }
      for (int r = 0; r < group.size(); ++r) {
        const std::vector<double> got = tensors[r].to(DType::Float64).to_vector<double>();
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(got[i], value(root, i)) << dtype_name(dtype) << " root " << root << " member " << r << " element " << i;
        }
      }
    }
  }
  std::vector<Tensor> t = {zeros({4}, Device::cpu(0)), zeros({4}, Device::cpu(1))};
  for (const std::string& e : run_members(2, [&](int r) { group.broadcast(r, t[r], group.world_size()); })) {
    EXPECT_NE(e.find("root 4 is out of range for a group of 4 members"), std::string::npos) << e;
  }
}

TEST(MpiBackend, AllGatherIntoTensorPlacesEveryMembersInputAtItsGlobalRank) {
  ProcessGroup group = make_group(2);
  const int world = group.world_size();
  for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{100003}}) {
    std::vector<Tensor> inputs, outputs;
    for (int r = 0; r < group.size(); ++r) {
      std::vector<double> v(count);
      for (int64_t i = 0; i < count; ++i) v[i] = value(group.global_rank(r), i);
      inputs.push_back(Tensor::from_vector(v, {count}, TensorOptions(DType::Float32).with_device(Device::cpu(r))));
      outputs.push_back(zeros({world * count}, Device::cpu(r)));
    }
    for (const std::string& e : run_members(group.size(), [&](int r) {
           group.all_gather_into_tensor(r, outputs[r], inputs[r]);
         })) {
      ASSERT_EQ(e, "");
    }
    for (int r = 0; r < group.size(); ++r) {
      const std::vector<double> got = outputs[r].to_vector<double>();
      for (int g = 0; g < world; ++g) {
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(got[g * count + i], value(g, i)) << "count " << count << " member " << r << " slot " << g;
        }
      }
    }
  }
  // The output spans every process: world_size() x the input.
  std::vector<Tensor> small = {zeros({2 * 4}, Device::cpu(0)), zeros({2 * 4}, Device::cpu(1))};
  std::vector<Tensor> in = {zeros({4}, Device::cpu(0)), zeros({4}, Device::cpu(1))};
  for (const std::string& e : run_members(2, [&](int r) { group.all_gather_into_tensor(r, small[r], in[r]); })) {
    EXPECT_NE(e.find("passed an output of 8 elements; expected 4 x 4"), std::string::npos) << e;
  }
}

TEST(MpiBackend, AllGatherListAndObjectBroadcastSpanTheProcesses) {
  ProcessGroup group = make_group(2);
  const int world = group.world_size();
  const int64_t count = 1001;
  std::vector<Tensor> inputs;
  std::vector<std::vector<Tensor>> outputs(2);
  for (int r = 0; r < group.size(); ++r) {
    std::vector<double> v(count);
    for (int64_t i = 0; i < count; ++i) v[i] = value(group.global_rank(r), i);
    inputs.push_back(Tensor::from_vector(v, {count}, TensorOptions(DType::Float64).with_device(Device::cpu(r))));
    for (int g = 0; g < world; ++g) outputs[r].push_back(zeros({count}, TensorOptions(DType::Float64).with_device(Device::cpu(r))));
  }
  for (const std::string& e : run_members(2, [&](int r) { group.all_gather(r, outputs[r], inputs[r]); })) ASSERT_EQ(e, "");
  for (int r = 0; r < 2; ++r) {
    for (int g = 0; g < world; ++g) {
      const std::vector<double> got = outputs[r][g].to_vector<double>();
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[i], value(g, i)) << "member " << r << " output " << g;
    }
  }
  // The root's bytes (their size included) on every member of every process, from each global root.
  for (int root = 0; root < world; ++root) {
    std::vector<std::vector<uint8_t>> got(2);
    for (const std::string& e : run_members(2, [&](int r) {
           const int g = group.global_rank(r);
           got[r] = group.broadcast_object(r, std::vector<uint8_t>(static_cast<size_t>(10 + g), static_cast<uint8_t>(g)), root);
         })) {
      ASSERT_EQ(e, "");
    }
    for (int r = 0; r < 2; ++r) EXPECT_EQ(got[r], std::vector<uint8_t>(static_cast<size_t>(10 + root), static_cast<uint8_t>(root)));
  }
  // One output per member of the group: world_size() of them.
  std::vector<std::vector<Tensor>> short_lists = {{zeros({4}, Device::cpu(0))}, {zeros({4}, Device::cpu(1))}};
  std::vector<Tensor> in = {zeros({4}, Device::cpu(0)), zeros({4}, Device::cpu(1))};
  for (const std::string& e : run_members(2, [&](int r) { group.all_gather(r, short_lists[r], in[r]); })) {
    EXPECT_NE(e.find("passed 1 outputs; expected one per member (" + std::to_string(world) + ")"), std::string::npos) << e;
  }
}

TEST(MpiBackend, ReduceAndReduceScatterSpanTheProcesses) {
  ProcessGroup group = make_group(2);
  const int world = group.world_size();
  const int64_t n = 1001;
  auto sum_over_world = [&](int64_t i) {
    double s = 0;
    for (int g = 0; g < world; ++g) s += value(g, i);
    return s;
  };
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    // reduce_scatter_tensor: member g's output = op over every member of their input's slice g, where member
    // m's input slice g element i holds value(m, g * n + i).
    std::vector<Tensor> inputs, outputs;
    for (int r = 0; r < group.size(); ++r) {
      std::vector<double> v(world * n);
      for (int64_t i = 0; i < world * n; ++i) v[i] = value(group.global_rank(r), i);
      inputs.push_back(Tensor::from_vector(v, {world * n}, TensorOptions(DType::Float64).with_device(Device::cpu(r))));
      outputs.push_back(zeros({n}, TensorOptions(DType::Float64).with_device(Device::cpu(r))));
    }
    for (const std::string& e : run_members(2, [&](int r) { group.reduce_scatter_tensor(r, outputs[r], inputs[r], op); })) {
      ASSERT_EQ(e, "");
    }
    for (int r = 0; r < group.size(); ++r) {
      const int g = group.global_rank(r);
      const std::vector<double> got = outputs[r].to_vector<double>();
      for (int64_t i = 0; i < n; ++i) {
        double want = 0;
        for (int m = 0; m < world; ++m) want += value(m, g * n + i);
        if (op == ReduceOp::Avg) want /= world;
        ASSERT_DOUBLE_EQ(got[i], want) << reduce_op_name(op) << " member " << g << " element " << i;
      }
    }
  }
  // reduce to each global root: the sum lands in the root's tensor alone.
  for (int root = 0; root < world; ++root) {
    std::vector<Tensor> t;
    for (int r = 0; r < group.size(); ++r) {
      std::vector<double> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = value(group.global_rank(r), i);
      t.push_back(Tensor::from_vector(v, {n}, TensorOptions(DType::Float64).with_device(Device::cpu(r))));
    }
    for (const std::string& e : run_members(2, [&](int r) { group.reduce(r, t[r], root); })) ASSERT_EQ(e, "");
    for (int r = 0; r < group.size(); ++r) {
      const int g = group.global_rank(r);
      const std::vector<double> got = t[r].to_vector<double>();
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], g == root ? sum_over_world(i) : value(g, i)) << "root " << root << " member " << g;
      }
    }
  }
}

// CUDA tensors cross processes through pinned host memory (Debian's Open MPI is not CUDA-aware): one member on
// cuda:0 in each process (both processes may share the GPU: no NCCL here). Skips without a GPU.
TEST(MpiBackend, CudaTensorsCrossProcessesThroughHostMemory) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  ProcessGroup group({Device::cuda(0)}, {.backend = CollectiveBackend::Mpi, .timeout = std::chrono::seconds(60)});
  const int world = group.world_size(), me = group.global_rank(0);
  const int64_t count = 100003;
  auto values = [&](int g) {
    std::vector<double> v(count);
    for (int64_t i = 0; i < count; ++i) v[i] = value(g, i);
    return Tensor::from_vector(v, {count}, TensorOptions(DType::Float32).with_device(Device::cuda(0)));
  };
  Tensor sum = values(me);
  group.all_reduce(0, sum);
  Tensor cast = values(me);
  group.broadcast(0, cast, world - 1);
  Tensor gathered = zeros({world * count}, TensorOptions(DType::Float32).with_device(Device::cuda(0)));
  group.all_gather_into_tensor(0, gathered, values(me));
  const std::vector<double> s = sum.to_vector<double>(), b = cast.to_vector<double>(), a = gathered.to_vector<double>();
  for (int64_t i = 0; i < count; ++i) {
    double want = 0;
    for (int g = 0; g < world; ++g) want += value(g, i);
    ASSERT_EQ(s[i], want) << "all_reduce element " << i;
    ASSERT_EQ(b[i], value(world - 1, i)) << "broadcast element " << i;
    for (int g = 0; g < world; ++g) ASSERT_EQ(a[g * count + i], value(g, i)) << "all_gather slot " << g;
  }
}

// Process 1 arrives 1 s late: process 0's members must wait for it (0.5 s of slack for scheduling).
TEST(MpiBackend, BarrierWaitsForEveryProcess) {
  ProcessGroup group = make_group(2);
  const int index = MpiWorld::get().place().rank;
  for (const std::string& e : run_members(2, [&](int r) { group.barrier(r); })) ASSERT_EQ(e, "");
  if (index == 1) std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& e : run_members(2, [&](int r) { group.barrier(r); })) ASSERT_EQ(e, "");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (index == 0) {
    EXPECT_GE(waited, 0.5);
  }
}

// A member of process 1 fails and aborts its group, as DataParallel does: the members of process 0, waiting
// in the all-reduce for it, learn its reason at once (not "did not arrive" after the 60 s timeout), and the
// group is over in both processes.
TEST(MpiBackend, AFailureInOneProcessEndsTheOthersWaitsWithItsReason) {
  ProcessGroup group = make_group(2);
  const int index = MpiWorld::get().place().rank;
  std::vector<Tensor> t = {zeros({1000}, Device::cpu(0)), zeros({1000}, Device::cpu(1))};
  const auto start = std::chrono::steady_clock::now();
  std::vector<ErrorKind> kinds(2, ErrorKind::Internal);
  const auto errors = run_members(2, [&](int r) {
    if (index == 1 && r == 0) {
      group.abort("replica 0 on cpu:0 failed: injected failure");
      throw Error("injected failure");
    }
    try {
      group.all_reduce(r, t[r]);
    } catch (const Error& e) {
      kinds[static_cast<size_t>(r)] = e.kind();
      throw;
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (index == 0) {
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(errors[r].find("(all_reduce, member " + std::to_string(r) + "): rank 1 failed: replica 0 on cpu:0 "
                               "failed: injected failure"), std::string::npos) << errors[r];
      EXPECT_EQ(kinds[static_cast<size_t>(r)], ErrorKind::Aborted) << errors[r];  // another's failure, not a timeout
    }
    EXPECT_LT(seconds, 30.0) << "the failure was not heard before the timeout";
  } else {
    EXPECT_EQ(errors[0], "injected failure");
    EXPECT_NE(errors[1], "");
  }
  // Every later collective of the group fails in both processes, without waiting.
  if (index == 0) {
    for (const std::string& e : run_members(2, [&](int r) { group.all_reduce(r, t[r]); })) {
      EXPECT_NE(e.find("aborted by an earlier failure"), std::string::npos) << e;
    }
  }
}

TEST(MpiBackend, WhatCannotBeReducedAcrossProcessesIsRefusedOnEveryMember) {
  ProcessGroup group = make_group(2);
  std::vector<Tensor> t = {zeros({4}, Device::cpu(0)), zeros({4}, Device::cpu(1))};
  std::vector<Tensor> half = {t[0].to(DType::BFloat16), t[1].to(DType::BFloat16)};
  for (const std::string& e : run_members(2, [&](int r) { group.all_reduce(r, half[r]); })) {
    EXPECT_NE(e.find("all_reduce of bfloat16 is not supported across processes"), std::string::npos) << e;
  }
  // The group is still usable.
  for (const std::string& e : run_members(2, [&](int r) { group.all_reduce(r, t[r]); })) EXPECT_EQ(e, "");
}

// Member t's pieces have 3 + t elements (member t of every process: the same size, as MPI's gather needs).
Tensor piece(int g, int t, int64_t offset, Device device) {
  std::vector<double> v(static_cast<size_t>(3 + t));
  for (size_t i = 0; i < v.size(); ++i) v[i] = value(g, static_cast<int64_t>(i) + offset);
  return Tensor::from_vector(v, {3 + t}, TensorOptions(DType::Int64).with_device(device));
}

TEST(MpiBackend, GatherAndScatterReachEveryGlobalRoot) {
  ProcessGroup group = make_group(2);
  const int world = group.world_size();
  for (int root = 0; root < world; ++root) {
    const int root_member = root % 2;
    const bool root_here = group.global_rank(root_member) == root;
    // gather: the root's outputs[g] = global rank g's input; the root's list only where the root is.
    std::vector<Tensor> inputs, outputs;
    for (int r = 0; r < 2; ++r) inputs.push_back(piece(group.global_rank(r), r, 0, Device::cpu(r)));
    for (int g = 0; root_here && g < world; ++g) outputs.push_back(zeros({3 + g % 2}, TensorOptions(DType::Int64).with_device(Device::cpu(root_member))));
    for (const std::string& e : run_members(2, [&](int r) {
           group.gather(r, r == root_member ? outputs : std::vector<Tensor>{}, inputs[r], root);
         })) {
      ASSERT_EQ(e, "") << "gather to root " << root;
    }
    for (int g = 0; root_here && g < world; ++g) {
      EXPECT_TRUE(equal(outputs[g], piece(g, g % 2, 0, Device::cpu(root_member)))) << "gather to root " << root << ", from " << g;
    }
    // scatter: global rank g's output = the root's inputs[g].
    std::vector<Tensor> sources, received;
    for (int g = 0; root_here && g < world; ++g) sources.push_back(piece(g, g % 2, 100 + root, Device::cpu(root_member)));
    for (int r = 0; r < 2; ++r) received.push_back(zeros({3 + r}, TensorOptions(DType::Int64).with_device(Device::cpu(r))));
    for (const std::string& e : run_members(2, [&](int r) {
           group.scatter(r, received[r], r == root_member ? sources : std::vector<Tensor>{}, root);
         })) {
      ASSERT_EQ(e, "") << "scatter from root " << root;
    }
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(equal(received[r], piece(group.global_rank(r), r, 100 + root, Device::cpu(r))))
          << "scatter from root " << root << " to " << group.global_rank(r);
    }
  }
}

// all_to_all's pieces: global rank `from`'s input for global rank `to` has scale * ((from * 5 + to) % 4)
// elements (some empty, sizes differing per pair) holding value(from * 100 + to, i).
int64_t pair_count(int from, int to, int64_t scale = 1) { return scale * ((from * 5 + to) % 4); }

Tensor pair_piece(int from, int to, Device device, int64_t scale = 1) {
  const int64_t count = pair_count(from, to, scale);
  std::vector<double> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = value(from * 100 + to, i);
  return Tensor::from_vector(v, {count}, TensorOptions(DType::Float32).with_device(device));
}

TEST(MpiBackend, AllToAllExchangesEveryPairAcrossProcesses) {
  ProcessGroup group = make_group(2);
  const int world = group.world_size();
  std::vector<std::vector<Tensor>> inputs(2), outputs(2);
  for (int r = 0; r < 2; ++r) {
    const int g = group.global_rank(r);
    for (int k = 0; k < world; ++k) {
      inputs[r].push_back(pair_piece(g, k, Device::cpu(r)));
      outputs[r].push_back(zeros({pair_count(k, g)}, Device::cpu(r)));
    }
  }
  for (const std::string& e : run_members(2, [&](int r) { group.all_to_all(r, outputs[r], inputs[r]); })) ASSERT_EQ(e, "");
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < world; ++k) {
      EXPECT_TRUE(equal(outputs[r][k], pair_piece(k, group.global_rank(r), Device::cpu(r))))
          << "global rank " << group.global_rank(r) << "'s output from " << k;
    }
  }
  // Global rank 2's output for global rank 0 one element too long: the same error on every member of every
  // process, before any byte moves; the group stays usable.
  std::vector<std::vector<Tensor>> wrong = outputs;
  if (group.global_rank(0) == 2) wrong[0][0] = zeros({outputs[0][0].numel() + 1}, Device::cpu(0));
  for (const std::string& e : run_members(2, [&](int r) { group.all_to_all(r, wrong[r], inputs[r]); })) {
    EXPECT_NE(e.find("all_to_all: global rank 2's output for global rank 0 has 3 float32 elements, but global "
                     "rank 0's input for it has 2 float32 elements; expected the same count and dtype"),
              std::string::npos) << e;
  }
  for (const std::string& e : run_members(2, [&](int r) { group.all_to_all(r, outputs[r], inputs[r]); })) EXPECT_EQ(e, "");
}

// The staging buffers are kept from call to call: a larger exchange, then a smaller one, each whole.
TEST(MpiBackend, AllToAllAgainWithLargerAndSmallerPieces) {
  ProcessGroup group = make_group(2);
  const int world = group.world_size();
  for (int64_t scale : {1, 5000, 3}) {
    std::vector<std::vector<Tensor>> inputs(2), outputs(2);
    for (int r = 0; r < 2; ++r) {
      const int g = group.global_rank(r);
      for (int k = 0; k < world; ++k) {
        inputs[r].push_back(pair_piece(g, k, Device::cpu(r), scale));
        outputs[r].push_back(zeros({pair_count(k, g, scale)}, Device::cpu(r)));
      }
    }
    for (const std::string& e : run_members(2, [&](int r) { group.all_to_all(r, outputs[r], inputs[r]); })) {
      ASSERT_EQ(e, "");
    }
    for (int r = 0; r < 2; ++r) {
      for (int k = 0; k < world; ++k) {
        EXPECT_TRUE(equal(outputs[r][k], pair_piece(k, group.global_rank(r), Device::cpu(r), scale)))
            << "scale " << scale << ": global rank " << group.global_rank(r) << "'s output from " << k;
      }
    }
  }
}

// An argument only one process can see is wrong: that process refuses it, and the others, which wait for it
// inside the collective, learn why at once instead of at the timeout. The group is then over in both.
TEST(MpiBackend, ArgumentsOnlyOneProcessRefusesEndTheCollectiveEverywhereWithItsMessage) {
  const int index = MpiWorld::get().place().rank;
  ProcessGroup group = make_group(2);
  std::vector<Tensor> t = {zeros({4}, Device::cpu(0)), zeros({index == 1 ? 5 : 4}, Device::cpu(1))};
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_members(2, [&](int r) { group.all_reduce(r, t[r]); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string refusal = "member 1 (cpu:1) passed a tensor of 5 float32 elements on cpu:1 but member 0's has 4 "
                              "float32 elements on cpu:0; expected the same count and dtype";
  for (const std::string& e : errors) {
    EXPECT_NE(e.find(refusal), std::string::npos) << e;
    if (index == 0) {
      EXPECT_NE(e.find("rank 1 failed: all_reduce #1: "), std::string::npos) << e;
    }
  }
  EXPECT_LT(seconds, 30.0) << "the refusal was not heard before the timeout";
  std::vector<Tensor> good = {zeros({4}, Device::cpu(0)), zeros({4}, Device::cpu(1))};
  for (const std::string& e : run_members(2, [&](int r) { group.all_reduce(r, good[r]); })) EXPECT_NE(e, "");
}

TEST(MpiBackend, ProcessesWithDifferentDeviceCountsAreRefusedNamingTheCounts) {
  const int index = MpiWorld::get().place().rank;
  try {
    make_group(index == 0 ? 1 : 2);
    ADD_FAILURE() << "a group with 1 device in process 0 and 2 in process 1 was built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ProcessGroup 'mpi': every process must bring the same number of "
                                         "devices; process " + std::to_string(index)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the processes have between 1 and 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dpe
