// How the dpe tool sets up glibc's malloc for a run under an address-space limit.
//
// Note [One malloc arena under an address-space limit]
// glibc gives every thread that allocates a malloc arena of its own (up to 8 per core), and each arena reserves
// 64 MiB of address space; making one maps 128 MiB for a moment and trims it to those 64. Memory limits that
// count resident memory (cgroups, Slurm's --mem) never see the reservations, but an address-space limit
// (`ulimit -v`, RLIMIT_AS) counts them. There, the burst of a device worker or the data loader making its arena
// during a step takes the room a oneDNN kernel build on another thread has just checked for (Note [Exceptions
// and oneDNN] in core/kernels/onednn_cpu.cc), and oneDNN, failing to allocate its JIT buffer, dies of SIGSEGV;
// a thread whose arena could not be made tries again, with another 128 MiB mapping, at every allocation after.
// tools/reliability/ulimit_stress.sh: 5 SIGSEGV in 16,068 runs; in 3 of the 4 cores kept, other threads were
// inside glibc's arena creation or allocating without an arena. So with a finite RLIMIT_AS the tool keeps one
// arena for every thread (mallopt(M_ARENA_MAX, 1)), set before any thread starts: no reservations, no bursts
// (the same soak with one arena: 14,820 runs, no SIGSEGV). The price is the arena's lock, which the threads
// then share: 0-6% of an MLP step on 2 CPU devices (three alternating pairs), paid only under the limit.
// MALLOC_ARENA_MAX or a glibc.malloc.arena_max tunable, when set, is left to glibc. A program that embeds dpe
// and runs under an address-space limit does well to set MALLOC_ARENA_MAX=1 itself.
#pragma once

namespace dpe::tool {

// Call first in main(), before any thread starts (glibc fixes its arena limit at a second thread's first
// allocation). Returns whether it limited malloc to one arena: RLIMIT_AS is finite and the user chose no
// arena limit of their own.
bool one_malloc_arena_under_address_limit();

}  // namespace dpe::tool
