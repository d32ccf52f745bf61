// --help from the field table (core/config.hpp help_text, help_keys_markdown): the modes, each
// mode's keys by group, wrapped to the terminal; docs/keys.md is help_keys_markdown's output.
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace ctxpar {

namespace {

// The modes, as `ctxpar --help` lists them.
const std::pair<const char*, const char*> kModeLines[] = {
    {"run", "the default job: comm bench + a sharded attention workload, summary table"},
    {"attn", "one CP attention forward+backward (in=IN.h5 or generated), results to out"},
    {"train", "training steps of a Llama-3-style model with CP (--config inputs/tiny.toml)"},
    {"prefill", "one (partial) prefill with a sharded KV cache: TTFT"},
    {"decode", "prefill seq tokens, then decode steps: TTIT per step"},
    {"chat", "a multi-turn schedule of prefills and decodes: TTFT and TTIT"},
    {"bench comm", "collective bandwidth and latency (nccl-tests style)"},
    {"bench attn", "the attention kernel alone: time and TFLOP/s per size"},
    {"bench cp", "every CP strategy on one attention call: time, exposed comm, bytes"},
    {"bench train", "training step MFU and time shares per strategy"},
    {"bench peak", "this rank's sgemm and FMA-loop peak"},
    {"bench infer", "pass-KV vs pass-Q TTFT over miss rates; decode TTIT vs CP size"},
    {"predict", "the cost model: time, MFU, exposed comm, memory per strategy"},
    {"bench calibrate", "measure this machine into a hardware profile"},
};

// The keys most runs set, for `ctxpar --help`.
const char* const kCommonKeys[] = {"out", "mesh", "strategy", "seq", "steps", "device", "threads", "hardware"};

// Every key in one group, in the order help lists them (the test checks each key has one).
const std::pair<const char*, std::vector<std::string_view>> kGroups[] = {
    {"model", {"layers", "dim", "ffn_dim", "vocab", "heads", "kv_heads", "head_dim", "layer_pattern", "window",
               "attention", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
               "gdn_heads", "gdn_head_dim_k", "gdn_head_dim_v", "gdn_conv", "gdn_chunk", "norm_eps", "rope_theta",
               "rope_scale_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_pos"}},
    {"mesh and strategy", {"mesh", "strategy", "local_strategy", "partition", "placement", "cp_algo", "decode_algo", "gdn_schedule",
                           "gdn_state", "frugal", "remat", "shard", "offload", "offload_chunk", "deterministic",
                           "deterministic_block", "deterministic_heads"}},
    {"data", {"seq", "batch", "mask", "docs", "doc_mean", "data", "data_dtype", "eos_id", "seed", "in", "schedule",
              "cached", "miss_rate"}},
    {"training", {"lr", "weight_decay", "beta1", "beta2", "adam_eps", "grad_clip"}},
    {"run length", {"steps", "warmup", "bench_iters", "bench_min_bytes", "bench_max_bytes", "watchdog_s"}},
    {"outputs", {"out", "csv", "save_logits", "checkpoint", "checkpoint_every", "checkpoint_io", "resume", "dump_init", "dump_steps",
                 "cpu_check"}},
    {"performance", {"device", "threads", "mem_per_rank", "peak_tflops_per_rank", "hardware"}},
    {"predict", {"predict_mode", "predict_mesh", "predict_chips", "predict_precision", "sweep"}},
};

int terminal_width() {
  if (const char* c = std::getenv("COLUMNS")) {
    const int w = std::atoi(c);
    if (w > 0) return std::clamp(w, 60, 160);
  }
  winsize ws{};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return std::clamp(int(ws.ws_col), 60, 160);
  return 80;
}

// `text` wrapped into lines of at most `width` characters (a word longer than that on its own).
std::vector<std::string> wrap(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::istringstream words(text);
  std::string w, line;
  while (words >> w) {
    if (!line.empty() && line.size() + 1 + w.size() > width) lines.push_back(std::move(line)), line.clear();
    line += (line.empty() ? "" : " ") + w;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

// A description cut to at most `limit` characters at a clause's end ("; ", ". ", " (" outside any
// parentheses), marked "[...]" when cut; whole when it fits.
std::string short_help(std::string_view help, size_t limit) {
  if (help.size() <= limit) return std::string(help);
  size_t cut = 0;
  int depth = 0;
  for (size_t i = 0; i + 1 < help.size() && i < limit; ++i) {
    if (help[i] == ')') --depth;
    if (i < 30) continue;  // a cut leaves more than a word or two
    const bool clause = depth == 0 && ((help[i] == ';' || help[i] == '.' || help[i] == ':') && help[i + 1] == ' ');
    if (clause || (depth == 0 && help[i] == ' ' && help[i + 1] == '(')) cut = i;
    if (help[i] == '(') ++depth;
  }
  if (cut == 0) {
    cut = help.rfind(' ', limit);
    if (cut == std::string_view::npos) cut = limit;
  }
  return std::string(help.substr(0, cut)) + " [...]";
}

// A description without its leading list of modes ("train, bench train: ..."), which a mode's own
// key list makes redundant; a condition ("attention=mla: ...", "train with device=cuda: ...")
// stays.
std::string_view without_modes(std::string_view help) {
  const size_t colon = help.find(": ");
  if (colon == std::string_view::npos) return help;
  std::vector<std::string> items;
  split_list(help.substr(0, colon), ',', items);
  static const char* const kWords[] = {"run", "attn", "train", "prefill", "decode", "chat", "bench", "predict",
                                       "inference", "infer"};
  for (std::string item : items) {
    item.erase(0, item.find_first_not_of(' '));
    const std::string first = item.substr(0, item.find(' '));
    const bool mode_word = std::find(std::begin(kWords), std::end(kWords), first) != std::end(kWords);
    if (!mode_word || item.find('=') != std::string::npos || item.find(" with ") != std::string::npos) return help;
  }
  return help.substr(colon + 2);
}

std::string choices_text(const Field& f) {
  std::string s;
  for (std::string_view c : help_choices(f)) s += (s.empty() ? "{" : "|") + std::string(c);
  return s.empty() ? s : s + "}";
}

// One key: "  name=default" and its description beside it (or below, when the first column is
// too wide), wrapped at `width`.
void key_lines(std::ostringstream& os, const Field& f, size_t col, size_t width) {
  std::string def = field_default(f);
  const std::string head = "  " + std::string(f.name) + "=" + (def.empty() ? "\"\"" : def);
  const std::string choices = choices_text(f);
  const std::string desc = short_help(without_modes(f.help), 2 * (width - col) - 12) + (choices.empty() ? "" : " " + choices);
  std::vector<std::string> lines = wrap(desc, width - col);
  if (head.size() + 1 > col) os << head << "\n";
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string lead = i == 0 && head.size() + 1 <= col ? head : "";
    os << lead << std::string(col - lead.size(), ' ') << lines[i] << "\n";
  }
}

std::string overview(size_t width) {
  std::ostringstream os;
  os << "usage: ctxpar MODE [--config FILE.toml] [key=value ...] [--dry-run]\n"
        "       ctxpar MODE --help   that mode's keys, grouped\n"
        "       ctxpar --features    the CP strategies and what each serves\n"
        "       ctxpar --help-keys   every key in full, as markdown (docs/keys.md)\n"
        "       --print-config: the settings a run would use; --dry-run: its plan\n\nmodes:\n";
  for (const auto& [name, what] : kModeLines) {
    const std::vector<std::string> lines = wrap(what, width - 20);
    for (size_t i = 0; i < lines.size(); ++i)
      os << "  " << (i == 0 ? name : "") << std::string(18 - (i == 0 ? std::string(name).size() : 0), ' ')
         << lines[i] << "\n";
  }
  os << "\nmost used keys (every mode's: ctxpar MODE --help):\n";
  for (const char* k : kCommonKeys)
    for (const Field& f : config_fields())
      if (f.name == k) key_lines(os, f, 24, width);
  os << "\nexample: mpirun -np 4 ctxpar train --config inputs/tiny.toml strategy=ring\n";
  return os.str();
}

}  // namespace

std::string help_text(const std::string& mode, int width_in) {
  const size_t width = size_t(width_in > 0 ? width_in : terminal_width());
  if (mode.empty()) return overview(width);
  std::ostringstream os;
  const char* what = "";
  for (const auto& [name, w] : kModeLines)
    if (mode == name) what = w;
  for (const std::string& l : wrap("ctxpar " + mode + ": " + what, width)) os << l << "\n";
  const std::vector<std::string> usage =
      wrap("ctxpar " + mode + " [--config FILE.toml] [key=value ...] [--print-config] [--dry-run]", width - 7);
  for (size_t i = 0; i < usage.size(); ++i) os << (i == 0 ? "usage: " : "       ") << usage[i] << "\n";
  os << "keys this mode reads (key=default; [...]: more in docs/keys.md):\n";
  for (const auto& [group, keys] : kGroups) {
    std::ostringstream g;
    for (std::string_view k : keys)
      for (const Field& f : config_fields())
        if (f.name == k && keys_not_read({std::string(k)}, mode).empty()) key_lines(g, f, 26, width);
    if (!g.str().empty()) os << "\n" << group << ":\n" << g.str();
  }
  return os.str();
}

std::string help_keys_markdown() {
  std::ostringstream os;
  os << "# Every key\n\n"
     << "Generated by `ctxpar --help-keys` from the field table (src/core/config.cpp); a test keeps this\n"
     << "file equal to that output. `ctxpar MODE --help` lists one mode's keys in short.\n";
  for (const auto& [group, keys] : kGroups) {
    os << "\n## " << group << "\n\n| key | type | default | modes | what |\n|---|---|---|---|---|\n";
    for (std::string_view k : keys)
      for (const Field& f : config_fields()) {
        if (f.name != k) continue;
        std::string help(f.help), choices = choices_text(f);
        for (char& c : help)
          if (c == '|') c = '/';
        for (char& c : choices)
          if (c == '|') c = ' ';
        const std::string def = field_default(f);
        os << "| `" << f.name << "` | " << field_type_name(f) << " | " << (def.empty() ? "" : "`" + def + "`")
           << " | " << (f.modes.empty() ? "every mode" : std::string(f.modes)) << " | " << help
           << (choices.empty() ? "" : " " + choices) << " |\n";
      }
  }
  return os.str();
}

// For the test: every field is in exactly one group of kGroups.
std::string help_groups_error() {
  for (const Field& f : config_fields()) {
    int n = 0;
    for (const auto& [group, keys] : kGroups) n += int(std::count(keys.begin(), keys.end(), f.name));
    if (n != 1) return std::string(f.name) + " is in " + std::to_string(n) + " help groups";
  }
  return "";
}

}  // namespace ctxpar
