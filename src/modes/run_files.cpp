#include "modes/run_files.hpp"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "core/config.hpp"
#include "io/h5_probe.hpp"
#include "io/output_lock.hpp"
#include "modes/modes.hpp"

namespace ctxpar {

namespace fs = std::filesystem;

namespace {

bool is_train(const Config& c) { return c.mode == Mode::train || (c.mode == Mode::bench && c.bench == Bench::train); }
bool is_infer(const Config& c) {
  return c.mode == Mode::prefill || c.mode == Mode::decode || c.mode == Mode::chat ||
         (c.mode == Mode::bench && c.bench == Bench::infer);
}

// Two names of one file: the same path once symlinks, "." and ".." are resolved, or (both
// existing) the same inode, which catches hard links too.
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  // Absolute first: weakly_canonical leaves a relative path with no existing prefix as it is.
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, ec1), ec1), cb = fs::weakly_canonical(fs::absolute(b, ec2), ec2);
  if (!ec1 && !ec2 && ca == cb) return true;
  struct stat sa {}, sb {};
  return stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// `other` is `out` itself or one of the files a writer of `out` makes beside it.
bool clashes(const std::string& out, const std::string& other) {
  return same_file(out, other) || same_file(out + ".partial", other) || same_file(lock_path(out), other);
}

std::string name(const RunFile& f) { return f.field + " = '" + f.path + "'"; }

const char* kind_text(const std::string& kind) {
  if (kind == "trace") return "a ctxpar trace";
  if (kind == "checkpoint") return "a ctxpar checkpoint";
  if (kind == "attn_result") return "ctxpar attn results";
  if (kind == "oracle_dump") return "a ctxpar oracle dump (dump_init)";
  if (kind == "hardware_profile") return "a hardware profile";
  if (kind == "hdf5") return "an HDF5 file ctxpar did not write";
  return "a file ctxpar did not write";
}

bool calibrated_profile(const std::string& path) {
  std::ifstream f(path);
  std::string first;
  std::getline(f, first);
  return first.rfind("# Written by `ctxpar bench calibrate`", 0) == 0;
}

// A regular file with one name (not a link: links there are removed, never written through).
bool plain_file(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1;
}

// What a run of ctxpar leaves at NAME.lock: "host ..." (io/output_lock), or nothing yet.
bool ctxpar_lock_file(const std::string& path) {
  std::ifstream f(path);
  std::string first;
  std::getline(f, first);
  return first.empty() || first.rfind("host ", 0) == 0;
}

// "" when the files a writer of `out` keeps beside it (NAME.partial, NAME.lock) may be replaced:
// absent, links (removed, not followed), or left by an earlier ctxpar run; a file of the user's
// under such a name is never removed.
std::string check_side_files(const RunFile& out) {
  const std::string valid = "; valid: another " + out.field + "= (or move that file away first)";
  std::error_code ec;
  const std::string partial = out.path + ".partial", lock = lock_path(out.path);
  for (const std::string& side : {partial, lock})
    if (fs::is_directory(fs::symlink_status(side, ec)))
      return "config: " + name(out) + ": '" + side + "' is a directory, where this run keeps its " +
             (side == lock ? "lock" : "unfinished file") + valid;
  if (plain_file(lock) && !ctxpar_lock_file(lock))
    return "config: " + name(out) + ": '" + lock + "' is a file ctxpar did not write, where this run keeps its lock" + valid;
  if (plain_file(partial)) {
    // Empty: a run killed right after creating it.
    const bool ours = fs::file_size(partial, ec) == 0 ||
                      (out.kind == "hardware_profile" ? calibrated_profile(partial) : !describe_file(partial).kind.empty());
    if (!ours)
      return "config: " + name(out) + ": '" + partial + "' is a file ctxpar did not write, where this run keeps its "
             "unfinished output" + valid;
  }
  return "";
}

// "" when `out` may replace what is at its path now.
std::string check_existing(const RunFile& out, const Config& cfg) {
  const std::string valid = "; valid: another " + out.field + "= (or move that file away first)";
  std::error_code ec;
  if (const std::string side = check_side_files(out); !side.empty()) return side;
  // A symlink at the output: the commit's rename would replace the link, not write its target.
  if (fs::is_symlink(fs::symlink_status(out.path, ec))) {
    const std::string target = fs::read_symlink(out.path, ec).string();
    return "config: " + name(out) + " is a symbolic link (to '" + printable(target, 1) + "'); ctxpar writes " +
           out.path + ".partial and renames it, which would replace the link, not its target; valid: the " +
           "target's own path, or another " + out.field + "=";
  }
  if (!fs::exists(out.path, ec)) return "";
  if (out.kind == "hardware_profile") {
    if (calibrated_profile(out.path)) return "";
    return "config: " + name(out) + " is a hardware profile that `ctxpar bench calibrate` did not write (a published " +
           "one, or your own); calibrating would replace it" + "; valid: hardware=NAME for a new profile " +
           "(e.g. hardware=local), or move that file away first";
  }
  const ExistingFile f = describe_file(out.path);
  if (!f.regular) return "config: " + name(out) + " exists and is not a regular file" + valid;
  if (f.kind != out.kind)
    return "config: " + name(out) + " holds " + kind_text(f.kind) + "; this run would replace it with " +
           kind_text(out.kind) + valid;
  if (out.kind == "trace" && f.mode != mode_words(cfg)) {
    std::string own = "out/" + mode_words(cfg, "_") + ".h5";
    if (same_file(own, out.path)) own = "out/" + mode_words(cfg, "_") + "_2.h5";
    return "config: " + name(out) + " holds the trace of a `ctxpar " + f.mode + "` run" +
           (f.status.empty() ? "" : " (status " + f.status + ")") + "; this `ctxpar " + mode_words(cfg) +
           "` run would replace it; valid: another out= (e.g. out=" + own + "), or move that file away first";
  }
  return "";
}

}  // namespace

std::vector<RunFile> run_files(const Config& cfg, const std::string& config_path) {
  std::vector<RunFile> files;
  const auto in = [&](const std::string& path, const char* field) {
    if (!path.empty()) files.push_back({path, field, false, ""});
  };
  const auto out = [&](const std::string& path, const char* field, const char* kind) {
    files.push_back({path, field, true, kind});
  };
  in(config_path, "--config");
  if (cfg.mode == Mode::attn) in(cfg.in, "in");
  if (is_train(cfg) || is_infer(cfg)) in(cfg.resume, "resume");
  if (is_train(cfg) && !synthetic_data(cfg)) in(cfg.data, "data");

  out(trace_path(cfg), "out", "trace");
  if (cfg.mode == Mode::attn) out(attn_result_path(cfg), "out", "attn_result");
  if (is_train(cfg) && cfg.checkpoint_every > 0) out(cfg.checkpoint, "checkpoint", "checkpoint");
  if (is_train(cfg) && !cfg.dump_init.empty()) out(cfg.dump_init, "dump_init", "oracle_dump");
  if (cfg.mode == Mode::bench && cfg.bench == Bench::calibrate) out(calibrate_path(cfg), "hardware", "hardware_profile");
  return files;
}

std::string check_run_files(const std::vector<RunFile>& files, const Config& cfg) {
  for (size_t i = 0; i < files.size(); ++i) {
    const RunFile& o = files[i];
    if (!o.output) continue;
    if (o.path.empty()) return "config: " + o.field + " is empty; valid: a file name such as out/run.h5";
    if (o.path.back() == '/')
      return "config: " + name(o) + " names a directory; valid: a file name such as " + o.path + "run.h5";
    for (const char ch : o.path)
      if (static_cast<unsigned char>(ch) < 0x20)
        return "config: " + o.field + " = '" + printable(o.path, 1) + "' holds a control character; valid: a plain file name";
    for (const char* reserved : {".partial", ".lock"}) {
      const std::string r(reserved);
      if (o.path.size() >= r.size() && o.path.compare(o.path.size() - r.size(), r.size(), r) == 0)
        return "config: " + name(o) + " ends in " + r + ", the name ctxpar gives its own unfinished files and locks "
               "(another run's live file could be replaced); valid: another name";
    }
    // NAME.partial and NAME.lock must fit the file system's name limit too.
    if (fs::path(o.path).filename().string().size() + 8 > 255)
      return "config: " + name(o) + ": the file name is " + std::to_string(fs::path(o.path).filename().string().size()) +
             " characters; valid: at most 247 (ctxpar adds .partial beside it)";
    for (size_t j = 0; j < files.size(); ++j) {
      const RunFile& x = files[j];
      if (j == i || (x.output && j < i)) continue;  // each pair of outputs once
      if (!clashes(o.path, x.path) && !(x.output && clashes(x.path, o.path))) continue;
      // The usual restart: resume from the checkpoint the run goes on writing.
      if (o.kind == "checkpoint" && x.field == "resume" && same_file(o.path, x.path)) continue;
      if (x.output)
        return "config: " + name(o) + " and " + name(x) + " name the same file; valid: a different file for each output";
      return "config: " + name(o) + " would overwrite the file this run reads as " + name(x) +
             "; valid: an output that is none of the run's inputs";
    }
    std::string err = check_output(o.path, o.field.c_str());
    if (err.empty()) err = check_existing(o, cfg);
    if (!err.empty()) return err;
  }
  return "";
}

std::string lock_run_outputs(const std::vector<RunFile>& files, const Config& cfg, OutputLocks& locks) {
  for (const RunFile& f : files) {
    if (!f.output) continue;
    const std::string err = locks.add(f.path, mode_words(cfg));
    if (err.rfind("another job", 0) == 0)
      return "config: " + name(f) + ": " + err + "; valid: wait for that job to end, or give this run another " +
             f.field + "=";
    if (!err.empty())
      return "config: " + name(f) + ": " + err + "; valid: a path in a writable directory, with a name its file system accepts";
  }
  return "";
}

}  // namespace ctxpar
