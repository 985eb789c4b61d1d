// Note [One rule for every output file] (file_args.h): what each output option may name, the path the writer
// gets, and the files two options may not share.
#include "tools/dpe/file_args.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/testing/errors.h"

namespace dpe::tool {
namespace {

using dpe::testing::error_of;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class FileArgsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/file_args_test";
    ASSERT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  }
  std::string file(const std::string& name, const std::string& content = "keep") {
    std::ofstream(dir + "/" + name) << content;
    return dir + "/" + name;
  }
  std::string dir;
};

TEST_F(FileArgsTest, WritableFilesPassAndNothingIsCreated) {
  EXPECT_EQ(check_output_file("--json", dir + "/new.json"), dir + "/new.json");
  struct stat st {};
  EXPECT_NE(stat((dir + "/new.json").c_str(), &st), 0) << "the check creates nothing";
  const std::string old = file("old.json");
  EXPECT_EQ(check_output_file("--json", old), old);
  std::ifstream in(old);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "keep") << "an existing file is not truncated";
}

TEST_F(FileArgsTest, MissingDirectoriesAndDirectoriesAreErrorsNamingOptionAndPath) {
  const std::string missing = dir + "/no/such/dir/out.json";
  const std::string e = error_of([&] { check_output_file("--json", missing); });
  EXPECT_TRUE(has(e, "--json " + missing + ": the directory " + dir + "/no/such/dir does not exist")) << e;
  const std::string d = error_of([&] { check_output_file("--csv", dir); });
  EXPECT_TRUE(has(d, "--csv " + dir + ": is a directory")) << d;
  EXPECT_TRUE(has(error_of([&] { check_output_file("--png", dir + "/"); }), "names a directory"));
  EXPECT_TRUE(has(error_of([&] { check_output_file("--png", ""); }), "--png '': expected a file path"));
  const std::string f = file("file");
  EXPECT_TRUE(has(error_of([&] { check_output_file("--json", f + "/out.json"); }), "is not a directory"));
  EXPECT_TRUE(has(error_of([&] { check_input_file("--resume", dir + "/none"); }), "--resume " + dir + "/none: no such file"));
  EXPECT_TRUE(has(error_of([&] { check_input_file("--resume", dir); }), "is not a regular file"));
}

// A writer would replace a device node or a socket with a regular file, or block on a FIFO.
TEST_F(FileArgsTest, DevicesFifosAndSocketsAreRefused) {
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(error_of([&] { check_output_file("--checkpoint", fifo, kCheckpointTemporarySuffix); }).rfind(
                "--checkpoint " + fifo + ": is not a regular file (a device, FIFO or socket); expected a file to write", 0),
            0u);
  EXPECT_TRUE(has(error_of([&] { check_output_file("--json", "/dev/null"); }), "/dev/null: is not a regular file"));
  // A socket's path must fit sockaddr_un (108 bytes): a short directory of its own.
  char socket_dir[] = "/tmp/dpe_file_args_XXXXXX";
  ASSERT_NE(mkdtemp(socket_dir), nullptr);
  const std::string socket_path = std::string(socket_dir) + "/socket";
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  socket_path.copy(address.sun_path, sizeof address.sun_path - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  EXPECT_TRUE(has(error_of([&] { check_output_file("--csv", socket_path); }), "is not a regular file"));
  close(fd);
  unlink(socket_path.c_str());
  rmdir(socket_dir);
}

// A link is followed, for every output alike: the writer gets what it names; a link to nothing is refused.
TEST_F(FileArgsTest, LinksAreFollowedToTheFileTheyName) {
  const std::string target = file("target.json");
  const std::string link = dir + "/link.json";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  char resolved[PATH_MAX];
  ASSERT_NE(realpath(target.c_str(), resolved), nullptr);
  EXPECT_EQ(check_output_file("--checkpoint", link, kCheckpointTemporarySuffix), resolved);
  EXPECT_EQ(check_output_file("--json", link), resolved);
  const std::string dangling = dir + "/dangling.json";
  ASSERT_EQ(symlink((dir + "/nothing.json").c_str(), dangling.c_str()), 0);
  EXPECT_TRUE(has(error_of([&] { check_output_file("--json", dangling); }),
                  "--json " + dangling + ": is a symbolic link to a file that does not exist"));
  const std::string to_fifo = dir + "/to_fifo";
  ASSERT_EQ(mkfifo((dir + "/fifo2").c_str(), 0600), 0);
  ASSERT_EQ(symlink((dir + "/fifo2").c_str(), to_fifo.c_str()), 0);
  EXPECT_TRUE(has(error_of([&] { check_output_file("--json", to_fifo); }), "(a link to "));
}

// A name the file system takes at start-up must not fail at the end: the checkpoint's temporary beside it
// adds 11 bytes to the name.
TEST_F(FileArgsTest, NamesFitWithTheirTemporary) {
  const std::string longest = dir + "/" + std::string(255, 'a');
  EXPECT_EQ(check_output_file("--json", longest), longest);
  EXPECT_EQ(error_of([&] { check_output_file("--checkpoint", longest, kCheckpointTemporarySuffix); })
                .rfind("--checkpoint " + longest + ": the file name with its temporary's suffix is 266 bytes; the file "
                       "system takes at most 255", 0),
            0u);
  const std::string fits = dir + "/" + std::string(255 - kCheckpointTemporarySuffix, 'b');
  EXPECT_EQ(check_output_file("--checkpoint", fits, kCheckpointTemporarySuffix), fits);
  EXPECT_TRUE(has(error_of([&] { check_output_file("--json", longest + "x"); }), "is 256 bytes"));
}

TEST_F(FileArgsTest, TwoOptionsNamingOneFileAreRefused) {
  const std::string a = file("a"), b = file("b");
  EXPECT_NO_THROW(check_distinct_files({{"--json", a}, {"--csv", b}, {"--png", ""}, {"--data-dir", ""}}));
  EXPECT_EQ(error_of([&] { check_distinct_files({{"--json", a}, {"--checkpoint", a}}); }).rfind(
                "--json " + a + " and --checkpoint " + a + " are the same file; expected a file of its own for each", 0),
            0u);
  // Through another spelling, a link and a hard link; and a file that does not exist yet.
  EXPECT_TRUE(has(error_of([&] { check_distinct_files({{"--json", a}, {"--csv", dir + "/./a"}}); }), "the same file"));
  ASSERT_EQ(symlink(a.c_str(), (dir + "/link").c_str()), 0);
  ASSERT_EQ(link(a.c_str(), (dir + "/hard").c_str()), 0);
  EXPECT_TRUE(has(error_of([&] { check_distinct_files({{"--json", dir + "/link"}, {"--resume", a}}); }), "the same file"));
  EXPECT_TRUE(has(error_of([&] { check_distinct_files({{"--json", dir + "/hard"}, {"--csv", a}}); }), "the same file"));
  EXPECT_TRUE(has(error_of([&] { check_distinct_files({{"--json", dir + "/new"}, {"--png", dir + "/../file_args_test/new"}}); }),
                  "the same file"));
  EXPECT_NO_THROW(check_distinct_files({{"--json", dir + "/new"}, {"--png", dir + "/new2"}}));
}

// `--resume "$UNSET"` must not retrain from scratch and overwrite the checkpoint.
TEST_F(FileArgsTest, AnEmptyPathOptionIsAnErrorNotAbsent) {
  CLI::App app;
  std::string resume, checkpoint = "dpe_checkpoint.safetensors";
  add_path_option(app, "--resume", resume, "resume");
  add_path_option(app, "--checkpoint", checkpoint, "checkpoint");
  EXPECT_TRUE(has(app.help(), "dpe_checkpoint.safetensors")) << app.help();
  EXPECT_EQ(error_of([&] { app.parse(std::vector<std::string>{"", "--resume"}); }).rfind(
                "--resume '': expected a path; leave the option out for none", 0),
            0u);
  EXPECT_THROW(app.parse(std::vector<std::string>{"--checkpoint="}), CLI::ParseError);  // CLI11's "1 required"
  app.parse(std::vector<std::string>{"x.safetensors", "--resume"});
  EXPECT_EQ(resume, "x.safetensors");
}

}  // namespace
}  // namespace dpe::tool
