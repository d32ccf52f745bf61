#include "io/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <system_error>

namespace ctxpar {

namespace fs = std::filesystem;

namespace {

// What is at a path (not following a final symlink): enough to tell a file replaced or rewritten.
struct Ident {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const Ident&) const = default;
};
Ident ident_of(const std::string& path) {
  struct stat st {};
  Ident id;
  if (lstat(path.c_str(), &st) != 0) return id;
  id.exists = true;
  id.dev = st.st_dev, id.ino = st.st_ino, id.size = st.st_size;
  id.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return id;
}

std::string claim_key(const std::string& path) { return fs::absolute(path).lexically_normal().string(); }

std::mutex& claims_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, Ident>& claims() {
  static std::map<std::string, Ident> c;
  return c;
}

// rename(2) that never replaces `to`: false when `to` exists. File systems without
// RENAME_NOREPLACE (EINVAL) get a check and a plain rename.
bool rename_noreplace(const std::string& from, const std::string& to) {
  if (renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return true;
  if (errno == EEXIST) return false;
  if (errno != EINVAL && errno != ENOSYS)
    throw std::runtime_error("cannot rename '" + from + "' to '" + to + "': " + std::strerror(errno));
  if (ident_of(to).exists) return false;
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw std::runtime_error("cannot rename '" + from + "' to '" + to + "': " + std::strerror(errno));
  return true;
}

// A free name beside `final`: DIR/STEM.ctxpar-PID[-N].EXT.
std::string beside(const std::string& final_path, int n) {
  const fs::path p(final_path);
  return (p.parent_path() / (p.stem().string() + ".ctxpar-" + std::to_string(getpid()) +
                             (n > 0 ? "-" + std::to_string(n) : "") + p.extension().string()))
      .string();
}

}  // namespace

void claim_output(const std::string& path) {
  const std::lock_guard<std::mutex> lk(claims_mutex());
  claims()[claim_key(path)] = ident_of(path);
}

AtomicFile::AtomicFile(std::string final_path, bool keep_abandoned)
    : final_(std::move(final_path)), partial_(final_ + ".partial"), keep_(keep_abandoned) {
  if (final_.empty()) throw std::runtime_error("output path is empty");
  const fs::path parent = fs::path(final_).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) throw std::runtime_error("cannot create directory '" + parent.string() + "': " + ec.message());
  }
  std::error_code ec;
  if (fs::is_directory(final_, ec)) throw std::runtime_error("output '" + final_ + "' is a directory");
  // A NAME.partial left by an earlier run (the output lock says no running job owns it) is
  // removed, not written through: were it a symlink or a hard link, writing it would overwrite
  // the file it points at.
  const fs::file_status st = fs::symlink_status(partial_, ec);
  if (fs::is_directory(st)) throw std::runtime_error("'" + partial_ + "' is a directory");
  if (fs::exists(st) && !fs::remove(partial_, ec))
    throw std::runtime_error("cannot remove the stale '" + partial_ + "': " + ec.message());
}

AtomicFile::~AtomicFile() {
  if (!committed_ && !keep_) std::remove(partial_.c_str());
}

void AtomicFile::commit() {
  const std::lock_guard<std::mutex> lk(claims_mutex());
  const auto claim = claims().find(claim_key(final_));
  bool placed = true;
  if (claim == claims().end() || (claim->second.exists && ident_of(final_) == claim->second)) {
    std::error_code ec;  // unclaimed, or what the run claimed is still there: replace it
    fs::rename(partial_, final_, ec);
    if (ec) throw std::runtime_error("cannot rename '" + partial_ + "' to '" + final_ + "': " + ec.message());
  } else {  // changed since the claim: placed only where nothing is now (a removed file is not lost)
    placed = rename_noreplace(partial_, final_);
  }
  if (placed) {
    committed_ = true;
    if (claim != claims().end()) claim->second = ident_of(final_);
    return;
  }
  // NAME changed hands while the run went on: never replaced; the run's file goes beside it.
  std::string other;
  for (int n = 0; other.empty() && n < 100; ++n)
    if (rename_noreplace(partial_, beside(final_, n))) other = beside(final_, n);
  if (other.empty()) throw std::runtime_error("'" + final_ + "' changed during the run, and no free name beside it");
  committed_ = true;
  throw std::runtime_error("'" + final_ + "' was created or replaced by someone else while this run was going; it is " +
                           "kept as it is, and this run's complete file is '" + other + "'");
}

}  // namespace ctxpar
