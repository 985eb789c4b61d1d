#include "tools/dpe/subprocess.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/testing/errors.h"

namespace dpe::tool {
namespace {

std::string tmp_dir() { return std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"; }

bool exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

// What a shell would run ($(...), backquotes, ;, quotes) reaches the program as plain text.
TEST(RunProcess, ArgumentsAreNeverInterpreted) {
  const std::string marker = tmp_dir() + "/pwned";
  const std::string nasty = "a'b\" $(touch " + marker + ") `touch " + marker + "`; touch " + marker + " | x";
  ProcessResult r = run_process({"/bin/echo", nasty, "two words"});
  EXPECT_TRUE(r.ok()) << describe_status(r);
  EXPECT_EQ(r.output, nasty + " two words\n");
  EXPECT_FALSE(exists(marker)) << "a shell ran the argument";
}

TEST(RunProcess, InputGoesToStdinAndLargeOutputComesBack) {
  std::string big;
  for (int i = 0; i < 200000; ++i) big += "line " + std::to_string(i) + "\n";  // ~2.5 MB: far beyond a pipe
  ProcessResult r = run_process({"cat"}, big);                                 // PATH is searched
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.output.size(), big.size());
  EXPECT_TRUE(r.output == big);
  EXPECT_EQ(split_lines(r.output).size(), 200000u);
  EXPECT_EQ(split_lines(r.output)[199999], "line 199999");
}

TEST(RunProcess, NoInputMeansEndOfFileNotOurStdin) {
  ProcessResult r = run_process({"cat"});
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.output, "");
}

TEST(RunProcess, ChildThatIgnoresItsInputIsNotAnError) {
  // true exits at once: the writes fail with EPIPE, which must neither kill us (SIGPIPE) nor throw.
  ProcessResult r = run_process({"true"}, std::string(4 << 20, 'x'));
  EXPECT_TRUE(r.ok()) << describe_status(r);
}

TEST(RunProcess, ExitStatusAndSignals) {
  ProcessResult f = run_process({"false"});
  EXPECT_EQ(f.exit_status, 1);
  EXPECT_FALSE(f.ok());
  EXPECT_EQ(describe_status(f), "exit status 1");
  ProcessResult k = run_process({"/bin/sh", "-c", "kill -9 $$"});
  EXPECT_EQ(k.signal, 9);
  EXPECT_FALSE(k.ok());
  EXPECT_EQ(describe_status(k).rfind("killed by signal 9", 0), 0u) << describe_status(k);
}

// A helper program that hangs, or floods its output, is killed at its limit and says so; one that closed its
// output and went on is killed at the same deadline.
TEST(RunProcess, LimitsOfTimeAndOutput) {
  const auto start = std::chrono::steady_clock::now();
  ProcessResult slow = run_process({"sleep", "30"}, {}, {.seconds = 0.3});
  EXPECT_TRUE(slow.timed_out);
  EXPECT_FALSE(slow.ok());
  EXPECT_EQ(describe_status(slow), "killed after running past its 0.3-s limit");
  ProcessResult detached = run_process({"/bin/sh", "-c", "exec >&-; sleep 30"}, {}, {.seconds = 0.3});
  EXPECT_TRUE(detached.timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  ProcessResult flood = run_process({"yes"}, {}, {.seconds = 30, .output_bytes = size_t{1} << 20});
  EXPECT_TRUE(flood.output_exceeded);
  EXPECT_LE(flood.output.size(), size_t{1} << 20);
  EXPECT_EQ(describe_status(flood), "killed after writing more than 1 MiB to its standard output");
  ProcessResult small = run_process({"yes"}, {}, {.seconds = 30, .output_bytes = 1000});
  EXPECT_EQ(describe_status(small), "killed after writing more than 1000 bytes to its standard output");
  ProcessResult fits = run_process({"/bin/sh", "-c", "printf 12345"}, {}, {.seconds = 30, .output_bytes = 5});
  EXPECT_TRUE(fits.ok()) << describe_status(fits);
  EXPECT_EQ(fits.output, "12345");
  EXPECT_NE(dpe::testing::error_of([] { run_process({"true"}, {}, {.seconds = 0}); }).find("expected seconds in (0, "),
            std::string::npos);
}

TEST(RunProcess, MissingProgramsAreErrorsNamingThem) {
  const std::string e = dpe::testing::error_of([] { run_process({"/no/such/program", "x"}); });
  EXPECT_NE(e.find("cannot run /no/such/program: No such file or directory"), std::string::npos) << e;
  EXPECT_NE(dpe::testing::error_of([] { run_process({"dpe-no-such-program-on-path"}); }).find("cannot run"),
            std::string::npos);
  EXPECT_NE(dpe::testing::error_of([] { run_process({}); }).find("expected a program name"), std::string::npos);
}

TEST(FindProgram, SearchesPathLikeSpawn) {
  EXPECT_FALSE(find_program("cat").empty());
  EXPECT_EQ(find_program("cat").back(), 't');
  EXPECT_EQ(find_program("/bin/sh"), "/bin/sh");
  EXPECT_EQ(find_program("dpe-no-such-program-on-path"), "");
  EXPECT_EQ(find_program("/no/such/program"), "");
  const std::string plain = tmp_dir() + "/plain_file";
  FILE* f = std::fopen(plain.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  chmod(plain.c_str(), 0644);
  EXPECT_EQ(find_program(plain), "") << "not executable";
  chmod(plain.c_str(), 0755);
  EXPECT_EQ(find_program(plain), plain);
  EXPECT_EQ(find_program(""), "");
}

TEST(SplitLines, LastLineWithoutNewline) {
  EXPECT_EQ(split_lines("a\nb"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(split_lines("a\n\nb\n"), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_TRUE(split_lines("").empty());
}

}  // namespace
}  // namespace dpe::tool
