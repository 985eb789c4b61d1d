// Note [What the processes read must be the same]
// Under --dist every process reads its own copy of the training data and of the checkpoint it resumes: the
// paths may differ (a node's local scratch), the contents must not, or the ranks train on different data (or
// from different weights) without a word. Each file is named by its identity: its size and a 64-bit FNV-1a
// hash of its bytes; a file larger than kWholeFileHashBytes by its first and last kSampleBytes beside its
// size, so that start-up does not read gigabytes of token shards (two shards of one size that differ only in
// the middle pass: the price of a start-up measured in milliseconds). run_train compares every process's
// identities with process 0's (run_configuration.h) before the engine is built.
#pragma once

#include <cstdint>
#include <string>

namespace dpe::tool {

inline constexpr uint64_t kWholeFileHashBytes = uint64_t{64} << 20, kSampleBytes = uint64_t{4} << 20;

// "<bytes> bytes, fnv1a64 <16 hex digits>" ("..., first and last 4 MiB" when sampled) of the regular file at
// `path`; "absent" when nothing is there (the reader that needs it names it); throws naming the path when it
// cannot be read.
std::string file_identity(const std::string& path);

}  // namespace dpe::tool
