// The files the dpe tool's options name (--json, --csv, --png, --checkpoint written; --resume, --pytorch-script
// read), checked when a command starts, before any work.
//
// Note [One rule for every output file]
// Every output goes through check_output_file, and every writer writes the path it returns:
//  - the path is non-empty and names a file ("out/" and a directory are refused);
//  - its directory exists, is a directory, and may be written and searched;
//  - the name fits: at most NAME_MAX bytes (the directory's pathconf) with the suffix of the temporary the
//    writer makes beside it (a checkpoint's ".tmp.XXXXXX"), and the whole path under PATH_MAX, so a name the
//    file system takes at start-up cannot fail after the training;
//  - a symbolic link is followed: what it names is the file written, replaced or rewritten, never the link
//    (a checkpoint's rename and --json's plain write treated links differently before); a link to nothing
//    is refused;
//  - what exists there must be a regular file we may write: a device node, a FIFO or a socket is refused (a
//    writer would replace it with a regular file, or block on it).
// Two options of one command naming the same file (through links and hard links too) are refused by
// check_distinct_files, except where a command means it (--resume and --checkpoint: continue and keep saving).
// Nothing here creates, truncates or opens a file.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace dpe::tool {

// A path option ("--json", "--resume"...): the empty value is an error ("--json '': expected a path; leave
// the option out for none"), not "not given", so `--resume "$UNSET"` cannot silently retrain from scratch.
// `target` must outlive the App's parse; its value is the default --help shows.
CLI::Option* add_path_option(CLI::App& cmd, const std::string& names, std::string& target,
                             const std::string& description);

// The suffix save_checkpoint's temporary adds to the name (io/checkpoint.h): ".tmp.XXXXXX".
inline constexpr size_t kCheckpointTemporarySuffix = 11;

// Note [One rule for every output file]. `temporary_suffix`: bytes the writer's temporary adds to the name.
// Returns the path to write: `path`, or what it links to. Errors name the option and the path.
std::string check_output_file(const std::string& option, const std::string& path, size_t temporary_suffix = 0);

// An input file that must exist and be a readable regular file (a link to one is followed).
void check_input_file(const std::string& option, const std::string& path);

// (option, path) of a command's file options, the empty ones left out: throws when two name the same file
// ("--json out.x and --checkpoint out.x are the same file; give each output its own"). Paths that do not
// exist yet are the same when they name the same entry of the same directory.
void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& files);

}  // namespace dpe::tool
