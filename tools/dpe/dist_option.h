// --dist, as every subcommand takes it: where the devices' group ends.
//   none      this process's devices only;
//   mpi       one group over the devices of every process of an MPI launch, through MPI (any devices; CUDA
//             tensors staged through pinned host memory);
//   mpi-nccl  the same through NCCL, GPU to GPU (CUDA devices, no GPU in two processes).
// docs/SCALE_OUT.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "collectives/process_group.h"

namespace dpe::tool {

// `what`: what the subcommand does across the processes (the help text's rest).
CLI::Option* add_dist_option(CLI::App& cmd, std::string& dist, const std::string& what);
// The group's backend for a --dist value and the process's devices; nullopt for none. Throws, before MPI
// starts, when the backend cannot serve the devices (mpi-nccl: CUDA devices only).
std::optional<CollectiveBackend> dist_backend(const std::string& dist, const std::vector<Device>& devices);

// A `dpe train` launched as one of several processes of an MPI job (mpirun, srun, mpiexec: the launcher's
// OMPI_COMM_WORLD_SIZE or PMI_SIZE above 1) with --dist none would train alone, beside the others, each
// writing the same checkpoint: refused, naming the launch. `command`: "train".
void check_not_alone_in_a_launch(const std::string& dist, const std::string& command);

}  // namespace dpe::tool
