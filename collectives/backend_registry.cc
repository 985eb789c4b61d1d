#include "collectives/backend_registry.h"

#include <set>

#include "collectives/mpi_backend.h"
#include "collectives/shared_memory_backend.h"
#include "core/error.h"

#if DPE_WITH_CUDA
#include "collectives/mpi_nccl_backend.h"
#include "collectives/nccl_backend.h"
#include "core/cuda/cuda_device.h"
#endif

namespace dpe::collectives {

namespace {

bool all_distinct_gpus(const std::vector<Device>& devices) {
#if DPE_WITH_CUDA
  std::set<int> physical;
  for (const Device& d : devices) physical.insert(cuda::physical_device(d.index));
  return physical.size() == devices.size();
#else
  (void)devices;
  return false;
#endif
}

}  // namespace

CollectiveBackend resolve_backend(CollectiveBackend requested, const std::vector<Device>& devices) {
  bool cpu = devices[0].is_cpu();
  CollectiveBackend backend = requested;
  if (backend == CollectiveBackend::Auto) {
    backend = cpu ? CollectiveBackend::Cpu
                  : (all_distinct_gpus(devices) ? CollectiveBackend::Nccl : CollectiveBackend::PeerCopy);
  }
  // mpi serves both kinds (CUDA tensors cross processes through host memory); the others one kind each.
  const bool serves_cpu = backend == CollectiveBackend::Cpu || backend == CollectiveBackend::Mpi;
  const bool serves_cuda = backend != CollectiveBackend::Cpu;
  DPE_CHECK(cpu ? serves_cpu : serves_cuda, "ProcessGroup: backend '", backend_name(backend), "' cannot serve ",
            devices[0], "; expected '", cpu ? "cpu' or 'mpi" : "nccl', 'peer-copy', 'mpi' or 'mpi-nccl", "'");
  if (backend == CollectiveBackend::Nccl) {
    DPE_CHECK(all_distinct_gpus(devices), "ProcessGroup: backend 'nccl' needs every member on its own GPU "
              "(NCCL refuses one GPU as two ranks); these logical devices share a GPU: use 'peer-copy'");
  }
  return backend;
}

// The registrations: one case per backend.
std::unique_ptr<Backend> make_backend(CollectiveBackend kind, const std::vector<Device>& devices,
                                      std::chrono::milliseconds timeout) {
  switch (kind) {
    case CollectiveBackend::Cpu:
    case CollectiveBackend::PeerCopy:
      return make_shared_memory_backend(devices);
    case CollectiveBackend::Mpi:
      return make_mpi_backend(devices, timeout);
    case CollectiveBackend::MpiNccl:
#if DPE_WITH_CUDA
      return make_mpi_nccl_backend(devices, timeout);
#else
      break;  // resolve_backend refuses it without CUDA devices
#endif
    case CollectiveBackend::Nccl:
#if DPE_WITH_CUDA
      return make_nccl_backend(devices);
#else
      break;  // resolve_backend refuses 'nccl' without CUDA (no GPU is distinct)
#endif
    case CollectiveBackend::Auto:
      break;
  }
  DPE_INTERNAL_ASSERT(false, "no backend registered for '", backend_name(kind), "'");
}

}  // namespace dpe::collectives
