#include "tools/dpe/dist_option.h"

#include "core/error.h"

namespace dpe::tool {

CLI::Option* add_dist_option(CLI::App& cmd, std::string& dist, const std::string& what) {
  return cmd.add_option("--dist", dist, "mpi: " + what + " (mpirun -np P dpe " + cmd.get_name() + " --dist mpi ...); "
                        "mpi-nccl: the same through NCCL, GPU to GPU (CUDA devices, none shared between processes); "
                        "docs/SCALE_OUT.md")
      ->check(CLI::IsMember({"none", "mpi", "mpi-nccl"}));
}

std::optional<CollectiveBackend> dist_backend(const std::string& dist, const std::vector<Device>& devices) {
  if (dist == "mpi") return CollectiveBackend::Mpi;
  if (dist != "mpi-nccl") return std::nullopt;
  for (const Device& d : devices) {
    DPE_CHECK(d.is_cuda(), "--dist mpi-nccl needs CUDA devices (NCCL), got ", d, "; use --dist mpi for CPU devices");
  }
  return CollectiveBackend::MpiNccl;
}

}  // namespace dpe::tool
