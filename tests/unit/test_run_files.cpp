// The files of a run (modes/run_files.hpp) and exclusive outputs (io/output_lock.hpp): no output
// is an input or another output under any name (symlink, hard link, NAME.partial), an existing
// file is replaced only by its own kind of output, and a second holder of an output lock is
// refused with the first one's name.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/config.hpp"
#include "cp/strategy.hpp"
#include "core/memory.hpp"
#include "io/h5_trace.hpp"
#include "io/output_lock.hpp"
#include "modes/run_files.hpp"

using namespace ctxpar;
namespace fs = std::filesystem;

namespace {

struct TmpDir {
  fs::path dir;
  TmpDir() {
    char t[] = "/tmp/ctxpar-files-XXXXXX";
    dir = mkdtemp(t);
  }
  ~TmpDir() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

Config config_of(Mode mode, const std::vector<std::string>& args, Bench bench = Bench::none) {
  state_strategy_choices();  // the registry's strategy names, as the program states them
  Config c = parse_config("", "test", args);
  c.mode = mode;
  c.bench = bench;
  return c;
}

std::string check(const Config& c, const std::string& config_path = "") {
  return check_run_files(run_files(c, config_path), c);
}

// A finished trace of `mode` at `path`, as the tracer writes it.
void write_trace(const std::string& path, const std::string& mode) {
  H5TraceWriter w(path);
  w.attr("/", "ctxpar_file", "trace");
  w.attr("/", "schema_version", int64_t(1));
  w.attr("/", "mode", mode);
  w.attr("/", "bench", "none");
  w.attr("/", "status", "complete");
  w.close_and_rename();
}

void touch(const std::string& path, const std::string& text = "x\n") { std::ofstream(path) << text; }

}  // namespace

TEST(RunFiles, AnOutputIsNeverAnInputUnderAnyName) {
  TmpDir t;
  touch(t / "run.toml");
  EXPECT_NE(check(config_of(Mode::train, {"out=" + t / "run.toml"}), t / "run.toml").find("--config"), std::string::npos);
  fs::create_symlink(t / "run.toml", t / "link.h5");
  EXPECT_NE(check(config_of(Mode::train, {"out=" + t / "link.h5"}), t / "run.toml").find("would overwrite"),
            std::string::npos);
  fs::create_hard_link(t / "run.toml", t / "hard.h5");
  EXPECT_NE(check(config_of(Mode::train, {"out=" + t / "hard.h5"}), t / "run.toml").find("would overwrite"),
            std::string::npos);
  // attn's results at its own input; the trace at resume; dump_init at the token file.
  EXPECT_NE(check(config_of(Mode::attn, {"in=" + t / "in.h5", "out=" + t / "in.h5"})).find("in = "), std::string::npos);
  // The suggested other name is never the same file.
  write_trace(t / "p.h5", "predict");
  const std::string p = check(config_of(Mode::train, {"out=" + t / "p.h5"}));
  EXPECT_NE(p.find("`ctxpar predict` run"), std::string::npos) << p;
  EXPECT_NE(check(config_of(Mode::train, {"out=" + t / "ck.h5", "resume=" + t / "ck.h5"})).find("resume"),
            std::string::npos);
  const std::string e =
      check(config_of(Mode::train, {"out=" + t / "t.h5", "dump_init=" + t / "tok.bin", "data=" + t / "tok.bin"}));
  EXPECT_NE(e.find("data = "), std::string::npos) << e;
  // An input named like an output's partial file.
  EXPECT_NE(check(config_of(Mode::train, {"out=" + t / "a.h5", "resume=" + t / "a.h5.partial"})).find("resume"),
            std::string::npos);
  EXPECT_NE(check(config_of(Mode::train, {"out=" + t / "a.h5", "checkpoint_every=1", "checkpoint=" + t / "a.h5.lock"}))
                .find("name the same file"),
            std::string::npos);
}

TEST(RunFiles, TwoOutputsNeverShareAFile) {
  TmpDir t;
  const std::string e = check(config_of(Mode::train, {"out=" + t / "x.h5", "checkpoint=" + t / "x.h5", "checkpoint_every=1"}));
  EXPECT_NE(e.find("name the same file"), std::string::npos) << e;
  // A checkpoint that is never written (checkpoint_every = 0) is not an output.
  EXPECT_EQ(check(config_of(Mode::train, {"out=" + t / "x.h5", "checkpoint=" + t / "x.h5"})), "");
}

TEST(RunFiles, ResumingFromTheCheckpointItWritesIsTheUsualRestart) {
  TmpDir t;
  EXPECT_EQ(check(config_of(Mode::train, {"out=" + t / "t.h5", "checkpoint=" + t / "ck.h5", "checkpoint_every=2",
                                          "resume=" + t / "ck.h5"})),
            "");
}

TEST(RunFiles, AnExistingFileIsReplacedOnlyByItsOwnKind) {
  TmpDir t;
  write_trace(t / "train.h5", "train");
  EXPECT_EQ(check(config_of(Mode::train, {"out=" + t / "train.h5"})), "");  // a rerun
  const std::string e = check(config_of(Mode::predict, {"out=" + t / "train.h5"}));
  EXPECT_NE(e.find("`ctxpar train` run"), std::string::npos) << e;
  EXPECT_NE(e.find("out/predict.h5"), std::string::npos) << e;
  // A trace is not a checkpoint, and a file ctxpar did not write is nobody's output.
  EXPECT_NE(check(config_of(Mode::train, {"out=" + t / "o.h5", "checkpoint=" + t / "train.h5", "checkpoint_every=1"}))
                .find("holds a ctxpar trace"),
            std::string::npos);
  touch(t / "notes.txt");
  EXPECT_NE(check(config_of(Mode::train, {"out=" + t / "notes.txt"})).find("did not write"), std::string::npos);
  // bench calibrate replaces only a profile it wrote itself.
  touch(t / "mine.toml", "name = \"mine\"\n");
  EXPECT_NE(check(config_of(Mode::bench, {"hardware=" + t / "mine.toml"}, Bench::calibrate)).find("did not write"),
            std::string::npos);
  touch(t / "cal.toml", "# Written by `ctxpar bench calibrate` (src/bench/bench_calibrate.cpp) on vm\n");
  EXPECT_EQ(check(config_of(Mode::bench, {"hardware=" + t / "cal.toml", "out=" + t / "cal.h5"}, Bench::calibrate)), "");
}

// A symlink at an output is refused (the commit's rename would replace the link), whether it
// points at a trace of this mode or nowhere.
TEST(RunFiles, AnOutputThatIsASymlinkIsRefused) {
  TmpDir t;
  write_trace(t / "target.h5", "train");
  fs::create_symlink(t / "target.h5", t / "link.h5");
  fs::create_symlink(t / "nowhere.h5", t / "dangling.h5");
  for (const char* link : {"link.h5", "dangling.h5"}) {
    const std::string err = check(config_of(Mode::train, {"out=" + t / link}));
    EXPECT_NE(err.find("symbolic link"), std::string::npos) << link << ": " << err;
  }
  EXPECT_TRUE(fs::is_symlink(t / "link.h5"));
}

// What the run claimed at an output is all its commit may replace: a file that appears there, or
// replaces the run's own, while the run goes on is kept, and the run's file goes beside it.
TEST(OutputLock, AFileThatAppearsDuringTheRunIsNeverReplaced) {
  TmpDir t;
  const std::string out = t / "run.h5";
  {
    OutputLocks locks;
    ASSERT_EQ(locks.add(out, "train"), "");  // claims the path: nothing there
    write_trace(out, "train");               // a first commit: the run's own file
    EXPECT_TRUE(fs::exists(out));
    write_trace(out, "train");               // replaces its own file
    fs::remove(out);
    touch(out, "my notes\n");                // the user's, while the run goes on
    try {
      write_trace(out, "train");
      FAIL() << "the user's file was replaced";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("kept as it is"), std::string::npos) << e.what();
    }
    std::ifstream f(out);
    std::string line;
    std::getline(f, line);
    EXPECT_EQ(line, "my notes");
    int beside = 0;
    for (const auto& e : fs::directory_iterator(t.dir))
      beside += e.path().filename().string().rfind("run.ctxpar-", 0) == 0 && e.path().extension() == ".h5";
    EXPECT_EQ(beside, 1);
  }
  // Appearing where nothing was when the run claimed it: the same.
  const std::string out2 = t / "run2.h5";
  OutputLocks locks;
  ASSERT_EQ(locks.add(out2, "train"), "");
  touch(out2, "mine\n");
  EXPECT_THROW(write_trace(out2, "train"), std::runtime_error);
  EXPECT_EQ(fs::file_size(out2), 5u);
}

TEST(OutputLock, ASecondHolderIsRefusedWithTheFirstOnesName) {
  TmpDir t;
  const std::string out = t / "run.h5";
  OutputLocks mine;
  ASSERT_EQ(mine.add(out, "train"), "");
  ASSERT_TRUE(fs::exists(lock_path(out)));
  // fcntl locks belong to a process: the second holder is a child process.
  const auto try_in_child = [&] {
    const pid_t pid = fork();
    if (pid == 0) {
      OutputLocks other;
      const std::string e = other.add(out, "predict");
      const bool refused = e.find("another job") != std::string::npos &&
                           e.find("pid " + std::to_string(getppid())) != std::string::npos &&
                           e.find("ctxpar train") != std::string::npos;
      _exit(e.empty() ? 0 : refused ? 1 : 2);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WEXITSTATUS(st);
  };
  EXPECT_EQ(try_in_child(), 1);  // refused, naming this process and its mode
  // Reading the lock file in this process (as the file checks do) must not drop the lock: a
  // classic POSIX lock would go with the first close of any descriptor of the file.
  { std::ifstream(lock_path(out)).get(); }
  EXPECT_EQ(try_in_child(), 1);
  mine.release();
  EXPECT_FALSE(fs::exists(lock_path(out)));  // no stale lock file after a clean end
  EXPECT_EQ(try_in_child(), 0);  // free again
}

TEST(Memory, TheNodeReportsAvailableMemory) {
  std::string source;
  const int64_t avail = node_available_bytes(&source);
  EXPECT_GT(avail, 0);
  EXPECT_FALSE(source.empty());
}
