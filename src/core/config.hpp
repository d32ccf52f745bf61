// Configuration: one field table (name, type, default, help, check) drives parsing of
// inputs/*.toml and command-line overrides, `--help`, the rank-0 printout and the HDF5 /config
// attributes. Every value is parsed from text the same way, wherever it came from.
#pragma once
#include <cstdint>
#include <functional>
#include <type_traits>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/settings.hpp"

namespace ctxpar {

// The dimension vocabulary of the whole code (declared once, here and in kernels/ops.hpp):
//   S global tokens, S_loc local tokens, H_q query heads, H_kv key/value heads, D head dim,
//   P CP group size, r CP rank.
// What host offload (config `offload`, an ordered list) may move to pinned host memory; in the
// order MaxText recommends trying them. So far `optimizer` is built.
enum class Offload { optimizer, attn_out, layer_inputs, params };
struct Config;
bool offloads(const Config& c, Offload what);  // is `what` in c.offload?
// The items of an `offload` value in their order ("none" = no item; validate_config checks them).
std::vector<std::string> offload_items(const std::string& s);

struct Config {
  // run
  Mode mode = Mode::run;     // positional: run, attn, bench, train, ... (not a table field)
  Bench bench = Bench::none; // positional after `bench`: comm, attn, cp, ...
  std::string out;           // trace file; "" = out/<mode>.h5
  std::string mesh;          // "ring:4,ulysses:2"; "" = every rank on the ring axis
  int64_t steps;
  int64_t warmup;
  int64_t seed;
  Device device;
  int64_t threads;           // OpenMP threads per rank; 0 = the OpenMP default
  double watchdog_s;
  int64_t mem_per_rank;      // host bytes a rank may use; 0 = this node's available memory / its ranks
  bool csv;
  // workload / attention
  int64_t seq;               // S
  int64_t heads;             // H_q
  int64_t kv_heads;          // H_kv
  int64_t head_dim;          // D
  std::string strategy;      // a training strategy of the registry (strategy_choices), auto (the cost model's pick) or all
  // The settings `frugal` and `deterministic` (and its _block, _heads), resolved here once: the
  // strategy's schedule (cp_schedule) and the numerics (exact: model/numerics.hpp). Only config.cpp
  // and the registry (src/cp/registry.cpp, which names the setting in its refusals) read the keys.
  bool visible_keys;         // frugal=true: the all-gather and the ring move only the key/value rows a receiver can see
  bool exact;                // deterministic=true: exact numerics and the exact schedule, the same bits on any mesh
  int64_t exact_block;       // deterministic_block: rows per exact weight-gradient term (0: exact_grain's default)
  int64_t exact_heads;       // deterministic_heads: query heads per exact dK/dV part (0: a whole K/V group)
  CpSchedule cp_schedule() const {
    return exact ? CpSchedule::exact : visible_keys ? CpSchedule::visible : CpSchedule::plain;
  }
  bool cpu_check;            // attn device=cuda: the same call on the CPU, differences reported
  bool save_logits;          // prefill/decode/chat: /infer/logits and /infer/tokens in the output file
  PartitionKind partition;
  PlacementKind placement;   // train: where a packed batch's rows live (shard/placement.hpp)
  ShardLevel shard;          // train: the training state split over dp x CP (model/state_shard.hpp)
  CheckpointIo checkpoint_io; // train: who writes checkpoints (model/checkpoint.hpp)
  MaskKind mask;
  int64_t window;
  std::string docs;          // "none" | "random" | "L1,L2,..." (document lengths in tokens)
  int64_t doc_mean;          // mean document length for docs=random
  // bench
  int64_t bench_min_bytes;
  int64_t bench_max_bytes;
  int64_t bench_iters;
  // attn mode
  std::string in;            // input HDF5 for `ctxpar attn` ("" = generate from seed)
  // model / train (a model preset is a TOML file in inputs/: llama3-8b.toml, ...)
  int64_t layers;            // decoder layers
  int64_t dim;               // model (residual stream) width
  int64_t ffn_dim;           // SwiGLU hidden width
  int64_t vocab;             // vocabulary size
  double norm_eps;           // RMSNorm epsilon
  double rope_theta;
  double rope_scale_factor;  // Llama 3 RoPE frequency scaling (1 = none)
  double rope_low_freq_factor;
  double rope_high_freq_factor;
  int64_t rope_original_max_pos;
  std::string layer_pattern; // token mixer per layer, repeated over the layers: G global attention, L local (window), D Gated DeltaNet
  std::string local_strategy; // CP strategy of the L layers: halo, or a training strategy
  std::string attention;     // attention layers: mha (Q/K/V projections, GQA) or mla (DeepSeek's latent attention)
  int64_t q_lora_rank;       // mla: query latent width (0 = no query compression)
  int64_t kv_lora_rank;      // mla: K/V latent width (c_kv)
  int64_t qk_nope_head_dim;  // mla: per-head query/key dims without RoPE
  int64_t qk_rope_head_dim;  // mla: the decoupled RoPE dims (one key shared by every head)
  int64_t v_head_dim;        // mla: per-head value dims
  int64_t gdn_heads;         // GDN heads (0 = heads)
  int64_t gdn_head_dim_k;    // GDN key/query head dim (0 = head_dim)
  int64_t gdn_head_dim_v;    // GDN value head dim (0 = head_dim)
  int64_t gdn_conv;          // GDN short causal convolution taps
  int64_t gdn_chunk;         // GDN chunk length of the chunked (WY) form
  std::string gdn_schedule;  // GDN under CP: "scan" or "ring"
  std::string gdn_state;     // inference: a sequence's GDN state on its "owner" rank, or "replicated" on every CP rank
  double lr;
  double weight_decay;
  double beta1;
  double beta2;
  double adam_eps;
  double grad_clip;          // max global gradient norm (0 = no clipping)
  Remat remat;
  std::string offload;       // train on a GPU: what moves to pinned host memory ("none", or a list; offloads())
  int64_t offload_chunk;     // offload=optimizer: elements of m and v per streamed chunk
  int64_t checkpoint_every;  // steps between checkpoints (0 = none)
  std::string checkpoint;    // checkpoint file (HDF5)
  std::string resume;        // checkpoint to restart from ("" = fresh start)
  std::string data;          // "synthetic" or a token file (.bin raw integers, .h5 dataset "tokens")
  TokenType data_dtype;      // raw token files
  int64_t eos_id;            // token that ends a document in a token file (-1 = no boundaries)
  std::string dump_init;     // oracle dump: per step the weights, moments and gradients (modes/oracle_dump.hpp)
  int64_t dump_steps;        // the steps the dump records (0 = every step run)
  double peak_tflops_per_rank;  // for MFU; 0 = measured at start (sgemm, as `ctxpar bench peak`)
  // inference (prefill, decode, chat, bench infer; src/infer)
  CpAlgoSetting cp_algo;     // prefill attention (auto: chosen per call)
  DecodeAlgo decode_algo;    // decode attention
  std::string schedule;      // chat: "prefill:32K,decode:64,prefill:2K,decode:64"
  int64_t batch;             // B sequences
  int64_t cached;            // prefill: P cached tokens before the measured prefill (0 = from miss_rate)
  double miss_rate;          // prefill: T / seq new tokens when cached = 0 (1 = full prefill)
  // cost model (`ctxpar predict`, src/perf; seq, batch, cached, miss_rate, partition, remat and
  // the model fields describe the predicted workload)
  std::string hardware;        // profile: inputs/hardware/<name>.toml, a path, measured, or auto
  PerfMode predict_mode;
  std::string predict_mesh;    // the predicted cluster's mesh ("" = mesh); need not match the job's ranks
  int64_t predict_chips;       // > 0: search every mesh of this many chips instead (predict_mesh unset)
  Precision predict_precision;  // auto = the profile's
  std::string sweep;           // "seq=128K,256K,1M" (one key, a list of values): one table row group per value
};

// An enumerated field: its value as the enum's int32 (core/settings.hpp), read and written
// through the member's own type.
struct EnumMember {
  int32_t (*get)(const Config&);
  void (*set)(Config&, int32_t);
};
template <auto M> EnumMember enum_member() {
  return {[](const Config& c) { return int32_t(c.*M); },
          [](Config& c, int32_t v) { c.*M = std::remove_reference_t<decltype(c.*M)>(v); }};
}

using FieldMember =
    std::variant<int64_t Config::*, double Config::*, std::string Config::*, bool Config::*, EnumMember>;

struct Field {
  std::string_view name;
  FieldMember member;
  std::string_view def;                   // default, as text (parsed like user input)
  std::string_view help;
  std::vector<std::string_view> choices;  // enumerated fields: the names, in display order
  double min = 0, max = 0;                // numeric fields: inclusive range (min > max = unchecked)
  // Extra check on the parsed value; returns "" when valid, else what would be valid.
  std::function<std::string(const Config&)> check = nullptr;
  std::vector<int32_t> values = {};       // enumerated fields: the enum value of each choice
  // The modes that read it ("train, bench train"; "" = every mode): config.cpp's mode column.
  // A key given on the command line to a mode that does not read it is refused.
  std::string_view modes = "";
};

const std::vector<Field>& config_fields();

// The CP strategies a configuration may name come from the registry (src/cp/registry.cpp), which
// core does not link: the program states them before it parses a configuration (main.cpp and
// app/startup.cpp's check_startup, from strategy_names() and local_strategy_names()). `strategy` takes a training
// one, auto or all; `local_strategy` a local one; the registry states their defaults too. Until
// they are stated, parsing refuses every name of both fields (a program that skipped this step
// fails at once, and loudly).
struct StrategyChoices {
  std::vector<std::string> training, local;
  std::string training_default, local_default;  // the fields' defaults (one of each list)
};
void set_strategy_choices(StrategyChoices choices);
const StrategyChoices& strategy_choices();

// Parses `toml_text` (may be empty; `toml_name` names it in messages) and then `overrides`
// ("key=value", "--key=value"); throws UsageError naming the field and what would be valid.
// `file_keys`: where given, the keys the TOML text set, in its order.
Config parse_config(const std::string& toml_text, const std::string& toml_name,
                    const std::vector<std::string>& overrides, std::vector<std::string>* file_keys = nullptr);

// The key of a command-line override ("seq=4K", "--seq=4K" -> "seq").
std::string override_key(const std::string& arg);
// The keys among `keys` (names) that the mode `mode` ("train", "bench cp") does not read, by the
// config table's mode column; unknown keys are skipped.
std::vector<std::string> keys_not_read(const std::vector<std::string>& keys, const std::string& mode);
// "" when every key of `overrides` (the command line's key=value, --key=value) is read by the mode
// `mode`; else the first one that is not, the modes that read it and what to do. Keys of a
// --config file are not refused (a file is a preset shared by several modes): main names those
// the mode does not read in a note.
std::string check_keys_for_mode(const std::vector<std::string>& overrides, const std::string& mode);
// The words of every mode ("run", ..., "bench calibrate"), for the mode column's test.
const std::vector<std::string>& mode_names_for_keys();

// Cross-field checks that need the world size (mesh product, divisibility, ...); throws UsageError.
void validate_config(const Config& cfg, int world_size);

// Text value of one field, for printing and for the HDF5 /config attributes.
std::string field_text(const Config& cfg, const Field& f);
// "name = value" lines of every field, aligned.
std::string config_listing(const Config& cfg);
// For --help (core/help.cpp): a field's default as text (the strategy fields: the registry's),
// its choices (enum names; the strategy fields: the registry's names), its type ("int", "float",
// "bool", "choice", "string").
std::string field_default(const Field& f);
std::vector<std::string_view> help_choices(const Field& f);
const char* field_type_name(const Field& f);

// `ctxpar --help` (mode ""): the modes and the most used keys; `ctxpar MODE --help` ("train",
// "bench cp"): the keys that mode reads, grouped, each described in short, wrapped to `width`
// columns (0: the terminal's, else 80). `help_keys_markdown`: every key in full (docs/keys.md).
std::string help_text(const std::string& mode = "", int width = 0);
std::string help_keys_markdown();
// "" when every field is in exactly one of --help's groups, else the first that is not (a test).
std::string help_groups_error();

// Integer with an optional binary K/M/G/T suffix ("128K" = 131072); false when not one.
bool parse_size(std::string_view text, int64_t& out);

// A number as a user would write it: at least 6 significant digits, more only where 6 do not
// read back as the same value (1e-05, 500000, 0.30000000000000004).
std::string number_text(double x);

// User bytes for a message: printable ASCII kept, every other byte (control, non-ASCII) '?', at
// most `lines` lines (a binary file given as a TOML file must not reach the terminal raw).
std::string printable(std::string_view text, int lines = 8);
// "" when `text` nests arrays and inline tables at most 32 deep, else the message. toml11 recurses
// once per level: a deeper file would overflow the stack instead of failing to parse.
std::string toml_nesting_error(std::string_view text);

// The one list splitter of every list-valued setting (mesh, docs, schedule, sweep, ...): the
// items of `text` separated by `sep`, each trimmed of spaces. Returns "" when every item is
// non-empty, else what is wrong (an empty list, a doubled, leading or trailing separator).
std::string split_list(std::string_view text, char sep, std::vector<std::string>& items);

struct MeshSpec {
  int64_t dp = 1, tp = 1, ulysses = 1, ring = 1;
  // Each axis is at most kMaxAxis (parse_mesh), so the product fits int64.
  static constexpr int64_t kMaxAxis = int64_t(1) << 15;
  int64_t product() const { return dp * tp * ulysses * ring; }
};
// Parsed views of free-form settings: packed documents configured (docs != none); synthetic
// training data (data = synthetic, else a token file).
bool packed_docs(const Config& cfg);
bool synthetic_data(const Config& cfg);
// Tokens per exact term of the weight gradients and dK/dV (the layout pads every rank's chunks to
// whole blocks of it): 1 with plain numerics; with exact ones exact_block, or by default the
// attention's exact query tile doubled while the block stays within 512 rows and seq / 16.
int64_t exact_grain(const Config& cfg);
int64_t default_exact_grain(const Config& cfg);

// Parses cfg.mesh (or another mesh setting, named `field` in messages); "" means ring:world_size.
MeshSpec parse_mesh(const std::string& mesh, int world_size, const char* field = "mesh");

}  // namespace ctxpar
