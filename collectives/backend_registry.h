// The backends a ProcessGroup can be built on, and the one place that picks among them (internal to
// //collectives). Registering a backend: backend.h, "Adding a backend".
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "collectives/backend.h"

namespace dpe::collectives {

// `requested`, with Auto resolved for `devices` (Cpu for CPU devices, Nccl for CUDA devices on distinct
// GPUs, PeerCopy otherwise). Throws, naming both, when the backend cannot serve the devices.
CollectiveBackend resolve_backend(CollectiveBackend requested, const std::vector<Device>& devices);

// The backend `kind` (resolved) for `devices`; `timeout` bounds what a backend waits for on its own (other
// processes, for the MPI backend). Collective for backends that span processes: every process constructs its
// group at the same point of its program.
std::unique_ptr<Backend> make_backend(CollectiveBackend kind, const std::vector<Device>& devices,
                                      std::chrono::milliseconds timeout);

}  // namespace dpe::collectives
