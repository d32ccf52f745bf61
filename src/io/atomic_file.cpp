#include "io/atomic_file.hpp"

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace ctxpar {

namespace fs = std::filesystem;

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
  std::error_code ec;
  fs::rename(partial_, final_, ec);
  if (ec) throw std::runtime_error("cannot rename '" + partial_ + "' to '" + final_ + "': " + ec.message());
  committed_ = true;
}

}  // namespace ctxpar
