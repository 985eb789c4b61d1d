#include "tools/dpe/file_args.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <memory>

#include "core/error.h"
#include "tools/dpe/cli_util.h"

namespace dpe::tool {

namespace {

// "a/b/c.json" -> "a/b"; "c.json" -> "."; "/c.json" -> "/".
std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

std::string name_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// What a file path names, for comparing two of them: the file (device and inode) where it exists, else the
// entry `name` of its directory.
struct FileIdentity {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string name;  // where !exists
  bool operator==(const FileIdentity&) const = default;
};

FileIdentity identity_of(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) return {true, st.st_dev, st.st_ino, ""};
  if (stat(directory_of(path).c_str(), &st) != 0) return {false, 0, 0, path};
  return {false, st.st_dev, st.st_ino, name_of(path)};
}

long path_limit(const std::string& dir, int name, long fallback) {
  const long limit = pathconf(dir.c_str(), name);
  return limit > 0 ? limit : fallback;
}

}  // namespace

CLI::Option* add_path_option(CLI::App& cmd, const std::string& names, std::string& target,
                             const std::string& description) {
  const std::string name = detail::long_name(names);
  CLI::Option* option = cmd.add_option_function<std::string>(
      names,
      [&target, name](const std::string& text) {
        DPE_CHECK(!text.empty(), name, " '': expected a path; leave the option out for none");
        target = text;
      },
      description);
  option->type_name("PATH");
  if (!target.empty()) option->default_str(target);
  return option;
}

std::string check_output_file(const std::string& option, const std::string& path, size_t temporary_suffix) {
  DPE_CHECK(!path.empty(), option, " '': expected a file path");
  DPE_CHECK(path.back() != '/', option, " ", path, ": names a directory; expected a file path");
  std::string target = path;
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    const std::unique_ptr<char, decltype(&std::free)> resolved(realpath(path.c_str(), nullptr), &std::free);
    DPE_CHECK(resolved != nullptr, option, " ", path, ": is a symbolic link to a file that does not exist (or a "
              "loop of links); name the file to write");
    target = resolved.get();
  }
  const std::string shown = target == path ? path : path + " (a link to " + target + ")";
  if (stat(target.c_str(), &st) == 0) {
    DPE_CHECK(!S_ISDIR(st.st_mode), option, " ", shown, ": is a directory; expected a file path");
    DPE_CHECK(S_ISREG(st.st_mode), option, " ", shown, ": is not a regular file (a device, FIFO or socket); "
              "expected a file to write");
    DPE_CHECK(access(target.c_str(), W_OK) == 0, option, " ", shown, ": exists and is not writable");
  }
  const std::string dir = directory_of(target);
  DPE_CHECK(stat(dir.c_str(), &st) == 0, option, " ", shown, ": the directory ", dir,
            " does not exist (create it first)");
  DPE_CHECK(S_ISDIR(st.st_mode), option, " ", shown, ": ", dir, " is not a directory");
  DPE_CHECK(access(dir.c_str(), W_OK | X_OK) == 0, option, " ", shown, ": the directory ", dir, " is not writable");
  const size_t name_bytes = name_of(target).size() + temporary_suffix;
  const long name_max = path_limit(dir, _PC_NAME_MAX, NAME_MAX), path_max = path_limit(dir, _PC_PATH_MAX, PATH_MAX);
  DPE_CHECK(name_bytes <= static_cast<size_t>(name_max), option, " ", shown, ": the file name",
            temporary_suffix > 0 ? " with its temporary's suffix" : "", " is ", name_bytes,
            " bytes; the file system takes at most ", name_max);
  DPE_CHECK(target.size() + temporary_suffix < static_cast<size_t>(path_max), option, " ", shown, ": the path",
            temporary_suffix > 0 ? " with its temporary's suffix" : "", " is ", target.size() + temporary_suffix,
            " bytes; at most ", path_max - 1, " are allowed");
  return target;
}

void check_input_file(const std::string& option, const std::string& path) {
  struct stat st {};
  DPE_CHECK(!path.empty(), option, " '': expected a file path");
  DPE_CHECK(stat(path.c_str(), &st) == 0, option, " ", path, ": no such file");
  DPE_CHECK(S_ISREG(st.st_mode), option, " ", path, ": is not a regular file");
  DPE_CHECK(access(path.c_str(), R_OK) == 0, option, " ", path, ": is not readable");
}

void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& files) {
  for (size_t i = 0; i < files.size(); ++i) {
    for (size_t j = i + 1; j < files.size(); ++j) {
      const auto& [a_option, a] = files[i];
      const auto& [b_option, b] = files[j];
      if (a.empty() || b.empty()) continue;
      DPE_CHECK(!(identity_of(a) == identity_of(b)), a_option, " ", a, " and ", b_option, " ", b,
                " are the same file; expected a file of its own for each");
    }
  }
}

}  // namespace dpe::tool
