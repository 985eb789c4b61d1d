#include "tools/dpe/dist_option.h"

#include <cstdlib>

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

void check_not_alone_in_a_launch(const std::string& dist, const std::string& command) {
  if (dist != "none") return;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* size = std::getenv(name);
    if (size == nullptr || std::atoll(size) <= 1) continue;
    DPE_CHECK(false, "this process is one of ", size, " of an MPI launch (", name, "=", size, ") but --dist is none: "
              "it would ", command, " alone beside the others; pass --dist mpi (or mpi-nccl) to every process, or "
              "launch one process");
  }
}

}  // namespace dpe::tool
