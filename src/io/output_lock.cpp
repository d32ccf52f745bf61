#include "io/output_lock.hpp"

#include "io/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.hpp"

namespace ctxpar {

namespace fs = std::filesystem;

std::string lock_path(const std::string& output) { return output + ".lock"; }

namespace {
// Every lock file this process holds, for the abort's cleanup (core/error.hpp add_abort_cleanup):
// a job ended by a fault leaves no lock file behind either.
std::mutex& held_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::string>& held_paths() {
  static std::vector<std::string> paths;
  return paths;
}
void note_held(const std::string& path) {
  const std::lock_guard<std::mutex> lk(held_mutex());
  static std::once_flag once;
  std::call_once(once, [] {
    add_abort_cleanup([] {
      const std::lock_guard<std::mutex> lk2(held_mutex());
      for (const std::string& p : held_paths()) unlink(p.c_str());
      held_paths().clear();
    });
  });
  held_paths().push_back(path);
}
void note_released(const std::string& path) {
  const std::lock_guard<std::mutex> lk(held_mutex());
  std::erase(held_paths(), path);
}
}  // namespace

OutputLocks::~OutputLocks() { release(); }

OutputLocks::OutputLocks(OutputLocks&& o) noexcept
    : held_(std::move(o.held_)), unlocked_(std::move(o.unlocked_)), created_dirs_(std::move(o.created_dirs_)) {
  o.held_.clear();
}

OutputLocks& OutputLocks::operator=(OutputLocks&& o) noexcept {
  if (this != &o) {
    release();
    held_ = std::move(o.held_);
    unlocked_ = std::move(o.unlocked_);
    created_dirs_ = std::move(o.created_dirs_);
    o.held_.clear();
  }
  return *this;
}

namespace {

std::string holder_text(int fd) {
  char buf[512];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "another process (it has not written its name yet)";
  buf[n] = 0;
  std::string s(buf);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

bool same_file(int fd, const std::string& path) {
  struct stat a {}, b {};
  if (fstat(fd, &a) != 0 || stat(path.c_str(), &b) != 0) return false;
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

std::string OutputLocks::add(const std::string& output, const std::string& label) {
  const std::string lp = lock_path(output);
  const fs::path parent = fs::path(lp).parent_path();
  std::error_code ec;
  if (!parent.empty()) {
    // The directories this call creates, outermost first (abandon() removes them again).
    std::vector<fs::path> missing;
    for (fs::path p = parent; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) missing.insert(missing.begin(), p);
    fs::create_directories(parent, ec);
    if (ec) return "cannot create directory '" + parent.string() + "': " + ec.message();
    for (const fs::path& p : missing) created_dirs_.push_back(p.string());
  }
  // A holder that ends between our open and our lock unlinks the file we opened: lock the file
  // that is at the path now, or try again. A symlink or a hard link at the lock's path is never
  // written through (it would overwrite the file it points at): its name is removed first.
  for (int attempt = 0; attempt < 20; ++attempt) {
    const int fd = open(lp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno == ELOOP) {
      unlink(lp.c_str());
      continue;
    }
    if (fd < 0) return "cannot create the lock file '" + lp + "': " + std::strerror(errno);
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return "the lock file '" + lp + "' is not a regular file";
    }
    if (st.st_nlink > 1) {
      close(fd);
      unlink(lp.c_str());
      continue;
    }
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    // Open-file-description locks where the kernel has them (Linux >= 3.15): a classic POSIX lock
    // is dropped when the process closes ANY descriptor of the file, e.g. a later read of it.
#ifdef F_OFD_SETLK
    const int cmd = F_OFD_SETLK;
#else
    const int cmd = F_SETLK;
#endif
    if (fcntl(fd, cmd, &fl) != 0) {
      const int e = errno;
      if (e == EACCES || e == EAGAIN) {
        const std::string who = holder_text(fd);
        close(fd);
        return "another job is writing it (" + who + "; lock " + lp + ")";
      }
      // ENOLCK, EOPNOTSUPP, ...: this file system keeps no locks. Go on unlocked.
      close(fd);
      unlink(lp.c_str());
      unlocked_.push_back(output);
      claim_output(output);
      return "";
    }
    if (!same_file(fd, lp)) {
      close(fd);
      continue;
    }
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    char when[32];
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    const std::string who = "host " + std::string(host) + ", pid " + std::to_string(getpid()) + ", ctxpar " + label +
                            ", since " + when + "\n";
    if (ftruncate(fd, 0) != 0 || pwrite(fd, who.data(), who.size(), 0) != ssize_t(who.size())) {
      const int e = errno;
      unlink(lp.c_str());
      close(fd);
      return "cannot write the lock file '" + lp + "': " + std::strerror(e);
    }
    held_.push_back({lp, fd});
    note_held(lp);
    claim_output(output);  // what is at the output now is what its commit may replace
    return "";
  }
  return "the lock file '" + lp + "' keeps changing (another job is taking it)";
}

void OutputLocks::abandon() {
  release();
  // Innermost first; fs::remove leaves a directory that is not empty.
  for (auto it = created_dirs_.rbegin(); it != created_dirs_.rend(); ++it) {
    std::error_code ec;
    fs::remove(*it, ec);
  }
  created_dirs_.clear();
}

void OutputLocks::release() {
  // Unlink while still locked: a job waiting on the old file finds it gone and makes a new one.
  for (const Held& h : held_) {
    note_released(h.path);
    unlink(h.path.c_str());
    close(h.fd);
  }
  held_.clear();
}

}  // namespace ctxpar
