// `bazel run //:install -- PREFIX`: copies libdpe.so to PREFIX/lib, dpe's public headers to PREFIX/include/dpe
// and writes PREFIX/lib/pkgconfig/dpe.pc, so that an application built without Bazel compiles with
//   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig g++ app.cc $(pkg-config --cflags --libs dpe)
// What is copied, and dpe.pc's flags, come from the generated dpe_install_manifest.h (tools/install/defs.bzl).
// PREFIX is used as a path only, never handed to a shell.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>

#include "dpe_install_manifest.h"
#include "tools/cpp/runfiles/runfiles.h"

namespace fs = std::filesystem;
using bazel::tools::cpp::runfiles::Runfiles;

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "dpe install: %s\n", message.c_str());
  return 2;
}

// The reason PREFIX cannot be used, or "" if it can. dpe.pc holds PREFIX verbatim except for spaces, which
// pkg-config reads escaped; '$' (a variable), '#' (a comment), quotes and backslashes would change its meaning.
std::string unusable(const std::string& prefix) {
  if (prefix.empty()) return "is empty; expected an absolute path";
  if (prefix[0] != '/') {
    // bazel run starts the installer in its runfiles directory, so a relative path would land there.
    std::string hint;
    if (const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY")) hint = ", such as '" + std::string(cwd) + "/" + prefix + "'";
    return "is relative; expected an absolute path" + hint;
  }
  for (unsigned char c : prefix) {
    if (c < 0x20 || c == 0x7f) return "contains a control character, which dpe.pc cannot hold";
    if (c == '$' || c == '#' || c == '\\' || c == '"' || c == '\'') {
      return std::string("contains '") + static_cast<char>(c) + "', which dpe.pc cannot hold";
    }
  }
  return "";
}

std::string pkg_config_escaped(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == ' ') out += '\\';
    out += c;
  }
  return out;
}

// Replaces rather than writes through: an earlier install may have left a read-only file or a symlink.
void install_file(const fs::path& source, const fs::path& destination, bool is_library) {
  fs::create_directories(destination.parent_path());
  fs::remove(destination);
  fs::copy_file(source, destination);
  fs::permissions(destination, is_library ? fs::perms(0755) : fs::perms(0644));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    return fail("expected one argument, the installation prefix (an absolute path), got " +
                std::to_string(argc - 1) + "; usage: bazel run //:install -- /absolute/prefix");
  }
  std::string prefix = argv[1];
  if (std::string why = unusable(prefix); !why.empty()) return fail("PREFIX '" + prefix + "' " + why);
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();

  std::string error;
  std::unique_ptr<Runfiles> runfiles(Runfiles::Create(argv[0], &error));
  if (!runfiles) return fail("cannot find the files to install (run it with bazel run): " + error);

  try {
    int headers = 0;
    std::string library;
    for (const dpe_install::InstalledFile& f : dpe_install::kFiles) {
      install_file(runfiles->Rlocation(f.rlocation), fs::path(prefix) / f.destination, f.is_library);
      if (f.is_library) {
        library = f.destination;
      } else {
        ++headers;
      }
    }
    const fs::path pc = fs::path(prefix) / dpe_install::kPkgConfigFile;
    fs::create_directories(pc.parent_path());
    const fs::path partial = pc.string() + ".partial";
    {
      std::ofstream out(partial, std::ios::binary | std::ios::trunc);
      out << "prefix=" << pkg_config_escaped(prefix) << "\n" << dpe_install::kPkgConfigBody;
      out.close();
      if (!out) throw fs::filesystem_error("cannot write", partial, std::make_error_code(std::errc::io_error));
    }
    fs::rename(partial, pc);
    std::printf("dpe install: %s: %s, %d headers in include/dpe, %s\n", prefix.c_str(), library.c_str(), headers,
                dpe_install::kPkgConfigFile);
  } catch (const fs::filesystem_error& e) {
    std::fprintf(stderr, "dpe install: %s\n", e.what());
    return 1;
  }
  return 0;
}
