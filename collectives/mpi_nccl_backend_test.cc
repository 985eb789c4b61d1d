// ProcessGroup on the multi-process NCCL backend ('mpi-nccl'), run as every process of an mpirun launch
// (mpirun_test.sh: 1, 2 and 3 processes). Two processes on one GPU are refused, naming both ranks; then every
// process drives cuda:<local rank>, or, with fewer GPUs than processes, shares one under NCCL_HOSTID (NCCL's
// own way to let two ranks use one GPU: as two hosts, over its socket transport). Last, NcclComms::shrink
// across processes: ncclCommShrink excluding a rank, which one GPU can show this way (in one process NCCL
// refuses one GPU twice). Each case skips, saying why, where the machine cannot show it (no GPU: every case).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/mpi_world.h"
#if DPE_WITH_CUDA
#include "collectives/nccl_comms.h"
#endif
#include "collectives/process_group.h"
#include "core/error.h"
#include "core/ops.h"
#include "tests/testing/errors.h"

namespace dpe {
namespace {

using collectives::MpiWorld;
using testing::error_of;

double value(int g, int64_t i) { return static_cast<double>((i * 7 + g * 3) % 10); }

Tensor values(int g, int64_t count, Device device) {
  std::vector<double> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = value(g, i);
  return Tensor::from_vector(v, {count}, TensorOptions(DType::Float32).with_device(device));
}

TEST(MpiNcclBackend, TwoRanksOnOneGpuAreRefusedNamingBoth) {
  const collectives::ProcessPlace& place = MpiWorld::get().place();
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (place.size < 2) GTEST_SKIP() << "one process: no GPU can be shared";
  // Every process on cuda:0 of its host: processes 0 and 1 share a GPU when they share a host.
  const std::string e = error_of([] { ProcessGroup({Device::cuda(0)}, {.backend = CollectiveBackend::MpiNccl}); });
  if (place.local_size < 2) GTEST_SKIP() << "processes 0 and 1 are on different hosts";
  EXPECT_NE(e.find("ProcessGroup 'mpi-nccl': global ranks 0 (cuda:0 of process 0) and 1 (cuda:0 of process 1) are "
                   "the same GPU ("), std::string::npos) << e;
  EXPECT_NE(e.find("NCCL refuses one GPU as two ranks"), std::string::npos) << e;
}

// This process's GPU: cuda:<local rank>, or, with fewer GPUs than processes on this host, a shared one, the
// processes then as NCCL allows, each its own NCCL_HOSTID, their traffic through NCCL's socket transport over
// the loopback interface.
Device device_of_this_process() {
  const collectives::ProcessPlace& place = MpiWorld::get().place();
  const bool shared = cuda_device_count() < place.local_size;
  if (shared) {
    ::setenv("NCCL_HOSTID", ("dpe-test-host-" + std::to_string(place.rank)).c_str(), 1);
    ::setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  }
  return Device::cuda(shared ? place.local_rank % cuda_device_count() : place.local_rank);
}

TEST(MpiNcclBackend, CollectivesRunGpuToGpuAcrossProcesses) {
  const collectives::ProcessPlace& place = MpiWorld::get().place();
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Device device = device_of_this_process();
  ProcessGroup group({device}, {.backend = CollectiveBackend::MpiNccl, .timeout = std::chrono::seconds(60)});
  ASSERT_EQ(group.backend(), CollectiveBackend::MpiNccl);
  const int world = group.world_size(), me = group.global_rank(0);
  ASSERT_EQ(world, place.size);
  const int64_t count = 100003;
  auto sum_over_world = [&](int64_t i) {
    double s = 0;
    for (int g = 0; g < world; ++g) s += value(g, i);
    return s;
  };

  Tensor sum = values(me, count, device), avg = values(me, count, device), cast = values(me, count, device);
  Tensor reduced = values(me, count, device);
  group.all_reduce(0, sum);
  group.all_reduce(0, avg, ReduceOp::Avg);
  group.broadcast(0, cast, world - 1);
  group.reduce(0, reduced, 0);
  Tensor gathered = zeros({world * count}, TensorOptions(DType::Float32).with_device(device));
  group.all_gather_into_tensor(0, gathered, values(me, count, device));
  Tensor scattered = zeros({count}, TensorOptions(DType::Float32).with_device(device));
  Tensor spread = zeros({world * count}, TensorOptions(DType::Float32).with_device(device));
  for (int g = 0; g < world; ++g) spread.narrow(0, g * count, count).copy_(values(me + g, count, device));
  group.reduce_scatter_tensor(0, scattered, spread);
  // A collective NCCL does not serve here: the MPI backend's, through host memory.
  std::vector<Tensor> list;
  for (int g = 0; g < world; ++g) list.push_back(zeros({count}, TensorOptions(DType::Float32).with_device(device)));
  group.all_gather(0, list, values(me, count, device));

  const std::vector<double> s = sum.to_vector<double>(), a = avg.to_vector<double>(), b = cast.to_vector<double>(),
                            r = reduced.to_vector<double>(), all = gathered.to_vector<double>(),
                            rs = scattered.to_vector<double>();
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(s[i], sum_over_world(i)) << "all_reduce element " << i;
    ASSERT_FLOAT_EQ(a[i], sum_over_world(i) / world) << "all_reduce avg element " << i;
    ASSERT_EQ(b[i], value(world - 1, i)) << "broadcast element " << i;
    ASSERT_EQ(r[i], me == 0 ? sum_over_world(i) : value(me, i)) << "reduce element " << i;
    for (int g = 0; g < world; ++g) ASSERT_EQ(all[g * count + i], value(g, i)) << "all_gather slot " << g;
    double want = 0;  // slot `me` of every member's spread: value(member + me, i)
    for (int g = 0; g < world; ++g) want += value(g + me, i);
    ASSERT_EQ(rs[i], want) << "reduce_scatter element " << i;
  }
  for (int g = 0; g < world; ++g) EXPECT_TRUE(equal(list[g], values(g, count, device))) << "all_gather list " << g;
}

#if DPE_WITH_CUDA
// Rank 1 of the clique leaves (it aborts its communicator, as a failed process would be cut off); the others
// shrink without it, are renumbered in order, and all-reduce in the new clique.
TEST(MpiNcclBackend, ShrinkExcludingARankLeavesAWorkingClique) {
  const collectives::ProcessPlace& place = MpiWorld::get().place();
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (place.size < 2) GTEST_SKIP() << "one process: nobody to exclude";
  const Device device = device_of_this_process();
  collectives::MpiComm world(std::chrono::seconds(60));
  NcclUniqueId id{};
  if (place.rank == 0) id = make_nccl_unique_id();
  world.broadcast(id.data(), static_cast<int64_t>(id.size()), 0, "the NCCL unique id");
  NcclComms comms({device.index}, id, place.size, place.rank);
  const int leaving = 1;
  if (place.rank == leaving) {
    comms.abort("left the clique");
    const std::string e = error_of([&] {
      comms.wait(0, std::chrono::steady_clock::now() + std::chrono::seconds(1), [] { return std::string(); }, "wait");
    });
    EXPECT_NE(e.find("aborted by an earlier failure: left the clique"), std::string::npos) << e;
  } else {
    std::unique_ptr<NcclComms> shrunk = comms.shrink({leaving});
    const int new_rank = place.rank < leaving ? place.rank : place.rank - 1;
    Tensor t = full({5}, static_cast<double>(new_rank + 1), TensorOptions(DType::Float32).with_device(device));
    shrunk->all_reduce(0, t, ReduceOp::Sum);
    shrunk->wait(0, std::chrono::steady_clock::now() + std::chrono::seconds(60), [] { return std::string(); },
                 "all_reduce after the shrink");
    const int survivors = place.size - 1;
    EXPECT_EQ(t.to_vector<float>(), std::vector<float>(5, static_cast<float>(survivors * (survivors + 1) / 2)));
    // The parent is gone for good.
    EXPECT_NE(error_of([&] {
                comms.wait(0, std::chrono::steady_clock::now(), [] { return std::string(); }, "parent");
              }).find("the group was shrunk (ncclCommShrink)"),
              std::string::npos);
  }
  // Everyone reaches here before any process tears down what another may still use.
  world.barrier("end of the shrink test");
}
#endif

}  // namespace
}  // namespace dpe
