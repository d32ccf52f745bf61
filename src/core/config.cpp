#include "core/config.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <numeric>
#include <span>
#include <stdexcept>
#include <sstream>
#include <toml.hpp>

#include "core/error.hpp"
#include "ops.hpp"  // attn_query_block: the exact grain is whole query tiles

namespace ctxpar {

namespace {

std::string join(const std::vector<std::string_view>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::string(v[i]);
  return s;
}

std::string check_mesh(const Config& c) {
  // Shape only; the product against the world size is checked in validate_config.
  try {
    parse_mesh(c.mesh, 1 << 30);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

bool train_mode_of(const Config& c) { return c.mode == Mode::train || (c.mode == Mode::bench && c.bench == Bench::train); }

std::string check_predict_mesh(const Config& c) {
  if (c.predict_mesh.empty()) return "";
  try {
    parse_mesh(c.predict_mesh, 1 << 30, "predict_mesh");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

std::string check_docs(const Config& c) {
  if (c.docs == "none" || c.docs == "random") return "";
  std::vector<std::string> items;
  const std::string err = split_list(c.docs, ',', items);
  if (!err.empty()) return "'none', 'random' or a comma list of document lengths ≥ 1 (e.g. docs=1K,3K); " + err;
  for (const std::string& item : items) {
    int64_t n = 0;
    if (!parse_size(item, n) || n < 1)
      return "'none', 'random' or a comma list of document lengths ≥ 1 (e.g. docs=1K,3K); '" +
             item + "' is not a length";
  }
  return "";
}

// The values of `strategy` beside the registry's training names.
constexpr const char* kStrategyKeywords[] = {"auto", "all"};

StrategyChoices& choices_held() {
  static StrategyChoices held;
  return held;
}

// "" when `v` is one of `names` or `more`, else what would be valid ("one of: a, b, c").
std::string choice_error(const std::string& v, const std::vector<std::string>& names,
                         std::span<const char* const> more) {
  std::vector<std::string_view> all(names.begin(), names.end());
  all.insert(all.end(), more.begin(), more.end());
  if (std::find(all.begin(), all.end(), std::string_view(v)) != all.end()) return "";
  return all.size() == more.size() ? "a CP strategy name, and the program stated none (set_strategy_choices)"
                                   : "one of: " + join(all, ", ");
}



// An enumerated field: its choices and their enum values from the setting's name table.
template <auto M, class E, size_t N>
Field enum_field(std::string_view name, const EnumName<E> (&names)[N], std::string_view def, std::string_view help) {
  Field f{name, enum_member<M>(), def, help, {}};
  for (const EnumName<E>& e : names) {
    f.choices.push_back(e.name);
    f.values.push_back(int32_t(e.value));
  }
  return f;
}

}  // namespace

void set_strategy_choices(StrategyChoices choices) { choices_held() = std::move(choices); }
const StrategyChoices& strategy_choices() { return choices_held(); }

bool packed_docs(const Config& cfg) { return cfg.docs != "none"; }
bool synthetic_data(const Config& cfg) { return cfg.data == "synthetic"; }

// A function of seq and head_dim only, so the same on every mesh: a power-of-two seq splits into
// whole blocks on up to 8 ranks without padding, and 8K tokens run blocks of 512
// (docs/measurements.md "Exact weight gradients": near the library's full rate; 128-row blocks
// cost +24% step time in bench train, 512-row blocks +8%).
int64_t default_exact_grain(const Config& cfg) {
  int64_t b = attn_query_block(int32_t(cfg.head_dim));
  while (2 * b <= 512 && 2 * b * 16 <= cfg.seq) b *= 2;
  return b;
}
int64_t exact_grain(const Config& cfg) {
  if (!cfg.exact) return 1;
  return cfg.exact_block > 0 ? cfg.exact_block : default_exact_grain(cfg);
}

// The field table: name, member, default, help, choices, [min, max], extra check.
// Parsing, --help, the rank-0 printout and the HDF5 /config attributes all come from here.
namespace {

// The mode column of the field table: which modes read each key (their run, validation, plan or
// scan: a key whose value can change what the mode does, prints, writes or checks). Copying a key
// into the trace's /config is not a read. Audited key by key at 1c406c0 (docs/faults.md).
constexpr std::string_view kEvery = "";
constexpr std::string_view kTrain = "train, bench train";
constexpr std::string_view kInfer = "prefill, decode, chat";
constexpr std::string_view kPredict = "predict";
// The model's shape: every mode that builds a model, plans one or prices one.
constexpr std::string_view kShape =
    "run, attn, train, prefill, decode, chat, bench cp, bench train, bench infer, predict, bench calibrate";
// The model's layers (sizes, Gated DeltaNet shapes): every mode that builds, plans or prices a
// model; not run and attn, whose attention runs on synthetic Q, K, V.
constexpr std::string_view kLayers =
    "train, prefill, decode, chat, bench cp, bench train, bench infer, predict, bench calibrate";
constexpr std::string_view kHeads =
    "run, attn, train, prefill, decode, chat, bench attn, bench cp, bench train, bench infer, predict, bench calibrate";
constexpr std::string_view kMla = "attn, train, prefill, decode, chat, bench cp, bench train, bench infer, predict, bench calibrate";
constexpr std::string_view kModelNumerics = "train, prefill, decode, chat, bench train, bench infer";  // norms, RoPE
const std::pair<std::string_view, std::string_view> kModeColumn[] = {
    {"out", kEvery}, {"mesh", kEvery}, {"device", kEvery}, {"threads", kEvery}, {"watchdog_s", kEvery},
    {"steps", "run, train, prefill, decode, bench cp, bench train"},
    {"warmup", "run, attn, train, prefill, decode, chat, bench comm, bench attn, bench cp, bench train, bench infer"},
    {"seed", "run, attn, train, prefill, decode, chat, bench attn, bench cp, bench train, bench infer"},
    {"mem_per_rank", "run, attn, train, prefill, decode, chat, bench comm, bench attn, bench cp, bench train, bench infer, "
                     "bench calibrate"},
    {"csv", "run, bench comm, bench attn, bench cp, bench train, bench peak, bench infer, predict, bench calibrate"},
    {"frugal", "train, prefill, decode, chat, bench cp, bench train"},
    {"save_logits", kInfer},
    {"cpu_check", "attn"},
    {"deterministic", "train, prefill, decode, chat, bench cp, bench train, bench infer"},
    {"deterministic_block", kTrain},
    {"deterministic_heads", "train, prefill, decode, chat, bench cp, bench train, bench infer"},
    {"seq", "run, attn, train, prefill, decode, chat, bench attn, bench cp, bench train, bench infer, predict"},
    {"heads", kHeads}, {"kv_heads", kHeads}, {"head_dim", kHeads},
    {"strategy", "run, attn, train, prefill, decode, chat, bench comm, bench attn, bench cp, bench train, bench peak, "
                 "bench infer, bench calibrate"},
    {"partition", kPredict},
    {"placement", "train, prefill, decode, chat, bench train, bench cp"},
    {"mask", "run, attn, train, prefill, decode, chat, bench attn, bench cp, bench train, bench infer"},
    {"window", kHeads},
    {"docs", "run, attn, train, prefill, decode, chat, bench attn, bench cp, bench train, bench infer, bench calibrate"},
    {"doc_mean", "run, attn, train, bench cp, bench train"},
    {"bench_min_bytes", "run, bench comm"}, {"bench_max_bytes", "run, bench comm"},
    {"bench_iters", "run, bench comm, bench attn, bench infer"},
    {"in", "attn"},
    {"layers", kLayers}, {"dim", kLayers}, {"ffn_dim", kLayers}, {"vocab", kLayers},
    {"norm_eps", kModelNumerics}, {"rope_theta", kModelNumerics}, {"rope_scale_factor", kModelNumerics},
    {"rope_low_freq_factor", kModelNumerics}, {"rope_high_freq_factor", kModelNumerics},
    {"rope_original_max_pos", kModelNumerics},
    {"layer_pattern", kShape},
    {"local_strategy", "run, attn, train, bench cp, bench train, predict, bench calibrate"},
    {"attention", kShape},
    {"q_lora_rank", kMla}, {"kv_lora_rank", kMla}, {"qk_nope_head_dim", kMla}, {"qk_rope_head_dim", kMla},
    {"v_head_dim", kMla},
    {"gdn_heads", kLayers}, {"gdn_head_dim_k", kLayers}, {"gdn_head_dim_v", kLayers}, {"gdn_conv", kLayers},
    {"gdn_chunk", "train, prefill, decode, chat, bench cp, bench train, predict, bench calibrate"},
    {"gdn_schedule", "train, prefill, decode, chat, bench cp, bench train, predict"},
    {"gdn_state", kInfer},
    {"lr", kTrain}, {"weight_decay", kTrain}, {"beta1", kTrain}, {"beta2", kTrain}, {"adam_eps", kTrain},
    {"grad_clip", kTrain},
    {"remat", "run, attn, train, bench cp, bench train, predict"},
    {"offload", kTrain}, {"offload_chunk", kTrain}, {"shard", "train, bench train, predict"}, {"checkpoint_every", kTrain}, {"checkpoint_io", kTrain}, {"checkpoint", kTrain},
    {"resume", "train, prefill, decode, chat, bench train, bench infer"},
    {"data", "train, bench train, bench calibrate, predict"}, {"data_dtype", "train, bench train, predict"},
    {"eos_id", "train, bench train, bench calibrate, predict"},
    {"dump_init", kTrain}, {"dump_steps", kTrain},
    {"peak_tflops_per_rank", "run, attn, train, prefill, decode, chat, bench attn, bench cp, bench train, bench infer"},
    {"cp_algo", "prefill, decode, chat, bench infer"},
    {"decode_algo", kInfer},
    {"schedule", "chat"},
    {"batch", "prefill, decode, chat, bench infer, predict"},
    {"cached", "prefill, predict"}, {"miss_rate", "prefill, predict"},
    {"hardware", kShape},
    {"predict_mode", kPredict}, {"predict_mesh", kPredict}, {"predict_chips", kPredict}, {"predict_precision", kPredict}, {"sweep", kPredict},
};

std::vector<Field> with_mode_column(std::vector<Field> fields) {
  for (Field& f : fields) {
    bool found = false;
    for (const auto& [name, modes] : kModeColumn)
      if (name == f.name) f.modes = modes, found = true;
    if (!found) throw std::logic_error("config: field " + std::string(f.name) + " has no row in the mode column");
  }
  return fields;
}

}  // namespace

const std::vector<std::string>& mode_names_for_keys() {
  static const std::vector<std::string> names = {"run", "attn", "train", "prefill", "decode", "chat", "bench comm",
                                                 "bench attn", "bench cp", "bench train", "bench peak",
                                                 "bench infer", "predict", "bench calibrate"};
  return names;
}

const std::vector<Field>& config_fields() {
  static const std::vector<Field> fields = with_mode_column({
      // run
      {"out", &Config::out, "", "output file (trace; for `attn` the tensor results); default out/<mode>.h5", {}},
      {"mesh", &Config::mesh, "", "mesh axes, e.g. ring:4,ulysses:2 (omitted axes are 1; empty = ring:<ranks>)", {}, 0, -1, check_mesh},
      {"steps", &Config::steps, "5", "measured steps (after warmup)", {}, 1, 1e6},
      {"warmup", &Config::warmup, "1", "warmup steps (run, traced, excluded from the summary)", {}, 0, 1e6},
      {"seed", &Config::seed, "1234", "random seed for data and weights", {}, 0, 9.2e18},
      enum_field<&Config::device>("device", kDeviceNames, "cpu", "compute device: cpu, or cuda (GPU backend; every mode but predict, and bench attn, cp, train and infer (not bench comm, peak, calibrate); needs a CUDA build)"),
      {"threads", &Config::threads, "0", "OpenMP threads per rank (0 = OMP_NUM_THREADS if set, else the node's cores / its ranks)", {}, 0, 1024},
      {"watchdog_s", &Config::watchdog_s, "600", "abort the job when no progress for this many seconds (0 = off)", {}, 0, 1e7,
       [](const Config& c) -> std::string {  // shorter fires while MPI starts, on every rank at once
         return c.watchdog_s == 0 || c.watchdog_s >= 1 ? "" : "0 (off) or at least 1 (seconds; MPI's start alone takes longer)";
       }},
      {"mem_per_rank", &Config::mem_per_rank, "0", "host memory a rank may use, checked against the plan before anything is allocated (0 = this node's available memory, or its cgroup limit, shared by its ranks)", {}, 0, 9.2e18},
      {"csv", &Config::csv, "false", "bench: print CSV instead of a table", {}},
      {"frugal", &Config::visible_keys, "false", "train, bench train, bench cp, and the full prefill of prefill, decode and chat: the all-gather and the ring send a rank only the key/value rows some query there can see (the causal future, other documents and rows beyond a window stay home; dK/dV return the same way); other strategies refuse it", {}},
      {"save_logits", &Config::save_logits, "false", "prefill, decode, chat: write /infer/logits [calls, batch, vocab] (fp32 values stored as float64, the last position of every sequence after each call) and /infer/tokens [batch, tokens] (every token fed, in call order: chat's conversation; -1 after a sequence's end) and /infer/context [calls, batch] (each sequence's context length after the call) to the output file, to compare devices and meshes or replay in another framework", {}},
      {"cpu_check", &Config::cpu_check, "true", "attn with device=cuda: also run the call on the CPU with the same bf16-rounded inputs and report the largest difference per tensor (log line and output attributes cpu_check_*)", {}},
      {"deterministic", &Config::exact, "false", "results whose bits do not depend on the number of CP, tp or dp ranks, the strategy or the threads: train and bench train (losses, gradients, checkpoints; GEMMs whose rows do not depend on the shard, every sum over tokens and over tp exact; the attention's exact schedule: every rank attends to all keys in position order, dK/dV summed exactly, the layout padded to whole blocks of deterministic_block; bench train prints the plain and the deterministic schedule and the slowdown), prefill, decode and chat (logits and generated tokens: the keys stay, the query rows are all-gathered, attention as exact sums, whatever cp_algo and decode_algo say; slow, a correctness schedule), bench cp (rows <name>:det beside the plain ones) and bench infer (a table of the exact schedule against the plain one per CP size, its logits bit-compared with CP = 1's). Gated DeltaNet layers (training: gdn_schedule=ring and gdn_chunk dividing deterministic_block; inference: a prompt's recurrence as one call on every rank, any length). K/V heads replicated over ulysses or tp ranks with deterministic_heads. MLA (its exact schedule moves the expanded K/V; bench cp's <name>:det rows too). Not yet the GPU", {}},
      {"deterministic_block", &Config::exact_block, "0", "train with deterministic=true: tokens per exact term of a weight gradient (each block's product is computed on its own and added exactly); a multiple of the attention's exact query tile (128 rows for head_dim <= 128, 64 above). 0: the tile doubled while within 512 rows and seq/16 (512 from seq 8K). Larger blocks run the weight-gradient GEMMs faster and may pad the sequence to more rows (every rank's chunks whole blocks)", {}, 0, 1e6},
      {"deterministic_heads", &Config::exact_heads, "0", "deterministic=true: query heads per exact part (dK/dV summed in fp32 over a part's heads, in head order, then as integers over the parts; the tp sums, in training and inference, split into gcd(heads/deterministic_heads, ffn_dim) parts); 0: the whole K/V group (heads/kv_heads). A K/V head replicated on several ulysses or tp ranks needs parts that its ranks' query heads split into (a divisor of heads/U or heads/tp; the error message names one). Runs compared bit for bit need the same value; smaller parts cost more (one-head parts: +13 % attention backward in bench cp at 128-row blocks; bench train on inputs/bench-train.toml +13.4 %, its tp sums in 8 parts instead of 2)", {}, 0, 1024},
      // workload / attention
      {"seq", &Config::seq, "4K", "S: global sequence length in tokens (K/M suffixes)", {}, 1, 1ll << 40},
      {"heads", &Config::heads, "8", "H_q: query heads", {}, 1, 65536},
      {"kv_heads", &Config::kv_heads, "8", "H_kv: key/value heads (divides heads; 1 = MQA)", {}, 1, 65536},
      {"head_dim", &Config::head_dim, "64", "D: head dimension", {}, 1, 256},
      {"strategy", &Config::strategy, "", "CP attention strategy: a training row of `ctxpar --features` (auto: the cost model's pick for this mesh and the `hardware` profile; all: every strategy, bench cp only)", {}, 0, -1,
       [](const Config& c) { return choice_error(c.strategy, strategy_choices().training, kStrategyKeywords); }},
      enum_field<&Config::partition>("partition", kPartitionNames, "zigzag", "token partition assumed by predict (the executed strategies always shard zigzag)"),
      enum_field<&Config::placement>("placement", kPlacementNames, "zigzag", "train, bench cp, and the full prefill of a batch in prefill, decode and chat (each sequence a document; needs cp_algo=pass_kv there): where a packed batch's rows live over the CP group: zigzag (positions, blind to documents; inference: each sequence zigzag on its own) or balanced (per batch from the document lengths: short documents whole on one rank, long ones split zigzag over the fewest ranks that keep every rank's causal work within 2% of the mean; needs frugal=true), or auto (train: per batch the one the cost model prices faster, its attention on the busiest rank and the rows it receives, with the hardware profile; needs frugal=true), or document (train, bench cp: every document zigzag over all ranks on its own, the layout Transformer Engine and Megatron-LM give packed sequences; needs frugal=true)"),
      enum_field<&Config::mask>("mask", kMaskNames, "causal", "attention mask"),
      {"window", &Config::window, "0", "sliding window in tokens: of mask=window, and of the local (L) layers of layer_pattern", {}, 0, 1ll << 40},
      {"docs", &Config::docs, "none", "packed documents: none, random, or lengths L1,L2,... summing to seq", {}, 0, -1, check_docs},
      {"doc_mean", &Config::doc_mean, "1K", "mean document length for docs=random", {}, 1, 1ll << 40},
      // bench
      {"bench_min_bytes", &Config::bench_min_bytes, "4K", "bench comm: smallest message per rank", {}, 4, 1ll << 34},
      {"bench_max_bytes", &Config::bench_max_bytes, "16M", "bench comm: largest message per rank", {}, 4, 1ll << 34},
      {"bench_iters", &Config::bench_iters, "10", "bench: timed iterations per size", {}, 1, 1e6},
      // attn mode
      {"in", &Config::in, "", "attn: input HDF5 with q, k, v, do (empty = generate from seed)", {}},
      // model / train (presets: inputs/tiny.toml, inputs/llama3-8b.toml, ...)
      {"layers", &Config::layers, "2", "train: decoder layers", {}, 1, 4096},
      {"dim", &Config::dim, "256", "train: model width (residual stream)", {}, 1, 1 << 20},
      {"ffn_dim", &Config::ffn_dim, "768", "train: SwiGLU hidden width", {}, 1, 1 << 22},
      {"vocab", &Config::vocab, "512", "train: vocabulary size", {}, 2, 1ll << 31},
      {"norm_eps", &Config::norm_eps, "1e-5", "train: RMSNorm epsilon", {}, 0, 1},
      {"rope_theta", &Config::rope_theta, "500000", "train: RoPE base", {}, 1, 1e12},
      {"rope_scale_factor", &Config::rope_scale_factor, "1", "train: Llama 3 RoPE scaling factor (1 = none)", {}, 1, 1e6},
      {"rope_low_freq_factor", &Config::rope_low_freq_factor, "1", "train: Llama 3 RoPE low_freq_factor", {}, 1e-6, 1e6},
      {"rope_high_freq_factor", &Config::rope_high_freq_factor, "4", "train: Llama 3 RoPE high_freq_factor", {}, 1e-6, 1e6},
      {"rope_original_max_pos", &Config::rope_original_max_pos, "8K", "train: Llama 3 RoPE original context length", {}, 1, 1ll << 40},
      {"layer_pattern", &Config::layer_pattern, "G", "train: token mixer of each layer, the pattern repeated over the layers: G global (full causal) attention with `strategy`, L local (sliding-window) attention over `window` tokens with `local_strategy`, D Gated DeltaNet (e.g. LLLLLG as Gemma 3, DDDG)", {}, 0, -1,
       [](const Config& c) -> std::string {
         if (c.layer_pattern.empty()) return "at least one letter: G (global attention), L (local attention) or D (Gated DeltaNet), e.g. G, LLLLLG or DDDG";
         for (char ch : c.layer_pattern)
           if (ch != 'G' && ch != 'D' && ch != 'L')
             return std::string("letters G (global attention), L (local, sliding-window attention) and D (Gated DeltaNet) only, e.g. LLLLLG; '") + ch +
                    "' is not a layer kind";
         return "";
       }},
      {"local_strategy", &Config::local_strategy, "", "train: CP strategy of the local (L) layers: halo (fetches only the window's keys from the neighbouring chunks) or a training strategy", {}, 0, -1,
       [](const Config& c) { return choice_error(c.local_strategy, strategy_choices().local, {}); }},
      {"attention", &Config::attention, "mha", "train, inference, bench cp/train/infer: attention layers: mha (Q, K, V projections; GQA by kv_heads) or mla (DeepSeek-V2/V3 multi-head latent attention: q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; head_dim and kv_heads unused; ring and allgather move the latent, inference attends over a latent cache)", {}, 0, -1,
       [](const Config& c) -> std::string { return c.attention == "mha" || c.attention == "mla" ? "" : "mha or mla"; }},
      {"q_lora_rank", &Config::q_lora_rank, "0", "attention=mla: query latent width (0 = queries projected directly)", {}, 0, 1 << 20},
      {"kv_lora_rank", &Config::kv_lora_rank, "512", "attention=mla: K/V latent width (c_kv)", {}, 1, 1 << 20},
      {"qk_nope_head_dim", &Config::qk_nope_head_dim, "128", "attention=mla: per-head query/key dims without RoPE", {}, 0, 1024},
      {"qk_rope_head_dim", &Config::qk_rope_head_dim, "64", "attention=mla: decoupled RoPE dims (one key part shared by the heads; even)", {}, 2, 1024},
      {"v_head_dim", &Config::v_head_dim, "128", "attention=mla: per-head value dims (at most qk_nope_head_dim + qk_rope_head_dim)", {}, 1, 1024},
      {"gdn_heads", &Config::gdn_heads, "0", "train: Gated DeltaNet heads (0 = heads)", {}, 0, 65536},
      {"gdn_head_dim_k", &Config::gdn_head_dim_k, "0", "train: Gated DeltaNet query/key head dimension (0 = head_dim)", {}, 0, 1024},
      {"gdn_head_dim_v", &Config::gdn_head_dim_v, "0", "train: Gated DeltaNet value head dimension (0 = head_dim)", {}, 0, 1024},
      {"gdn_conv", &Config::gdn_conv, "4", "train: Gated DeltaNet short causal convolution taps (1 = none)", {}, 1, 64},
      {"gdn_chunk", &Config::gdn_chunk, "128", "train: Gated DeltaNet chunk length of the chunked form (128: the fastest measured on CPUs; docs/measurements.md)", {}, 1, 4096},
      {"gdn_schedule", &Config::gdn_schedule, "ring", "train: Gated DeltaNet under CP: ring (the state handed piece to piece, pipelined over groups of heads) or scan (log P exchange of the pieces' state maps, then corrections)", {}, 0, -1,
       [](const Config& c) -> std::string {
         return c.gdn_schedule == "scan" || c.gdn_schedule == "ring" ? "" : "scan or ring";
       }},
      {"gdn_state", &Config::gdn_state, "owner", "infer: where a sequence's Gated DeltaNet states live: owner (its decode rank; the measured default) or replicated (every CP rank, each decode step applied everywhere)", {}, 0, -1,
       [](const Config& c) -> std::string {
         return c.gdn_state == "owner" || c.gdn_state == "replicated" ? "" : "owner or replicated";
       }},
      {"lr", &Config::lr, "3e-4", "train: AdamW learning rate (constant)", {}, 0, 10},
      {"weight_decay", &Config::weight_decay, "0.1", "train: AdamW decoupled weight decay (matrices only)", {}, 0, 10},
      {"beta1", &Config::beta1, "0.9", "train: AdamW beta1", {}, 0, 0.999999},
      {"beta2", &Config::beta2, "0.95", "train: AdamW beta2", {}, 0, 0.999999999},
      {"adam_eps", &Config::adam_eps, "1e-8", "train: AdamW epsilon", {}, 0, 1},
      {"grad_clip", &Config::grad_clip, "1.0", "train: max global gradient norm (0 = no clipping)", {}, 0, 1e9},
      enum_field<&Config::remat>("remat", kRematNames, "none", "train: activation recompute per layer"),
      enum_field<&Config::shard>("shard", kShardNames, "none", "train (and predict's price of it): the training state split over the N ranks that hold one tp slice (dp x CP, ZeRO/FSDP style), each unit (embedding, layer, head) in N pieces: none; optimizer (each rank keeps the AdamW moments and fp32 master weights of its pieces and updates them, then the pieces are all-gathered into the whole weights; the same bits as none); grads (also the gradients: each unit's reduce-scattered as the backward finishes it); params (also the weights: each unit's all-gathered while the unit before it computes, just ahead of the forward or backward that uses it, then freed). --dry-run shows the state per rank at each level"),
      enum_field<&Config::checkpoint_io>("checkpoint_io", kCheckpointIoNames, "serial", "train: who writes a checkpoint: serial (rank 0, after gathering every tensor) or parallel (every rank its own part of each tensor at once into the one file, through HDF5's MPI-IO driver; no gather). The same file either way"),
      {"offload", &Config::offload, "none", "train with device=cuda: what lives in pinned host memory instead of the GPU, a list (e.g. offload=optimizer,layer_inputs): optimizer (AdamW moments, streamed through the GPU in chunks at the update), layer_inputs (the residual stream's input of every layer between the forward and the backward; 3 on the GPU), attn_out (with remat=none: every attention layer's output O and LSE, likewise), params (with optimizer: the fp32 master weights but the embedding and norms; the GPU keeps their bf16 copy, refreshed at the update; with shard= this rank's pieces, all of them, the GPU's copies all-gathered from the pieces after the update, or at shard=params each unit's gathered before its use); the same bits as without. --dry-run shows the GPU memory with and without it", {}},
      {"offload_chunk", &Config::offload_chunk, "4194304", "offload=optimizer: elements of each AdamW moment streamed through the GPU at a time (the GPU keeps one chunk of m and one of v; larger chunks make fewer, longer copies)", {}, 1, 1e12},
      {"checkpoint_every", &Config::checkpoint_every, "0", "train: steps between checkpoints (0 = none)", {}, 0, 1e9},
      {"checkpoint", &Config::checkpoint, "out/checkpoint.h5", "train: checkpoint file (written atomically)", {}},
      {"resume", &Config::resume, "", "train: checkpoint to restart from (empty = fresh start)", {}},
      {"data", &Config::data, "synthetic", "train: 'synthetic' or a token file (.bin raw integers, .h5 dataset 'tokens'); predict: a token file whose batches it places over the CP group (zigzag against placement=balanced)", {}},
      enum_field<&Config::data_dtype>("data_dtype", kTokenTypeNames, "uint16", "train: integer type of a raw .bin token file"),
      {"eos_id", &Config::eos_id, "-1", "train: token that ends a document in a token file (-1 = none)", {}, -1, 1ll << 31},
      {"dump_init", &Config::dump_init, "", "train: write an oracle dump to this HDF5 (tests/oracle): per step the weights and AdamW moments before it and its gradients, the samples, the losses, step 0's logits", {}},
      {"dump_steps", &Config::dump_steps, "0", "train with dump_init: the steps the dump records (0 = every step run)", {}, 0, 1e6},
      {"peak_tflops_per_rank", &Config::peak_tflops_per_rank, "0", "train: the peak MFU divides by, TFLOP/s per rank (0: on the CPU one core's FMA-loop rate, as `bench peak` (bench calibrate's core_fma_tflops in out/hardware/local.toml when it measured this host), times the rank's threads; with device=cuda the GPU's dense bf16 peak by its name, a table, 0 where unknown)", {}, 0, 1e6,
       [](const Config& c) -> std::string {
         return c.peak_tflops_per_rank == 0 || c.peak_tflops_per_rank >= 1e-4
                    ? "" : "0 (measure it) or at least 1e-4 TFLOP/s (0.1 GFLOP/s): a smaller peak makes MFU meaningless";
       }},
      // inference
      enum_field<&Config::cp_algo>("cp_algo", kCpAlgoNames, "auto", "infer: prefill attention (auto = chosen per call by the cost model)"),
      enum_field<&Config::decode_algo>("decode_algo", kDecodeAlgoNames, "pass_q", "infer: decode attention"),
      {"schedule", &Config::schedule, "prefill:4K,decode:16,prefill:512,decode:16", "chat: turns as prefill:T and decode:N items", {}},
      {"batch", &Config::batch, "1", "infer: B sequences decoded together", {}, 1, 65536},
      {"cached", &Config::cached, "0", "prefill: cached tokens P before the measured prefill of seq - P (0 = use miss_rate)", {}, 0, 1ll << 40},
      {"miss_rate", &Config::miss_rate, "1", "prefill: new tokens T = miss_rate * seq when cached = 0 (1 = full prefill)", {}, 1e-6, 1},
      // cost model (`ctxpar predict`)
      {"hardware", &Config::hardware, "auto", "hardware profile of the cost model (predict, strategy=auto, cp_algo=auto, placement=auto, bench calibrate's output): inputs/hardware/<name>.toml (local: bench calibrate's out/hardware/local.toml first), a path, measured (this job's ranks, measured at start: cp_algo=auto only) or auto (measured for cp_algo=auto, else local)", {}},
      enum_field<&Config::predict_mode>("predict_mode", kPerfModeNames, "train", "predict: what to predict"),
      {"predict_mesh", &Config::predict_mesh, "", "predict: mesh of the predicted cluster, e.g. tp:8,ring:16 (empty = mesh)", {}, 0, -1, check_predict_mesh},
      {"predict_chips", &Config::predict_chips, "0", "predict: search every mesh of this many chips (tp x ulysses x ring, and dp and remat in training) and print the best that fit (0 = price predict_mesh only)", {}, 0, 1ll << 30},
      enum_field<&Config::predict_precision>("predict_precision", kPrecisionNames, "auto", "predict: number formats (auto = the profile's default)"),
      {"sweep", &Config::sweep, "", "predict: one key and a list of values, e.g. sweep=seq=128K,256K,1M; values are separated by ',' or ';', those of predict_mesh by ';' (sweep=predict_mesh=tp:8,ring:16;ulysses:8,ring:16)", {}},
  });
  return fields;
}

static const Field* find_field(std::string_view name) {
  for (const Field& f : config_fields())
    if (f.name == name) return &f;
  return nullptr;
}

std::vector<std::string> keys_not_read(const std::vector<std::string>& keys, const std::string& mode) {
  std::vector<std::string> out;
  for (const std::string& key : keys) {
    const Field* f = find_field(key);
    if (!f || f->modes.empty()) continue;  // unknown keys: parse_config named them already
    std::vector<std::string> modes;
    split_list(f->modes, ',', modes);
    if (std::find(modes.begin(), modes.end(), mode) == modes.end()) out.push_back(key);
  }
  return out;
}

std::string override_key(const std::string& arg) {
  const std::string key = arg.substr(0, arg.find('='));
  return key.rfind("--", 0) == 0 ? key.substr(2) : key;
}

std::string check_keys_for_mode(const std::vector<std::string>& overrides, const std::string& mode) {
  std::vector<std::string> keys;
  for (const std::string& o : overrides) keys.push_back(override_key(o));
  const std::vector<std::string> bad = keys_not_read(keys, mode);
  if (bad.empty()) return "";
  return "config: " + bad[0] + " (command line) is not read by `ctxpar " + mode + "`; it applies to " +
         std::string(find_field(bad[0])->modes) + "; valid: leave it out, or run one of those modes";
}

bool parse_size(std::string_view t, int64_t& out) {
  if (t.empty()) return false;
  int64_t mult = 1;
  const char last = t.back();
  if (last == 'K' || last == 'k') mult = 1ll << 10;
  else if (last == 'M' || last == 'm') mult = 1ll << 20;
  else if (last == 'G' || last == 'g') mult = 1ll << 30;
  else if (last == 'T' || last == 't') mult = 1ll << 40;
  if (mult != 1) t.remove_suffix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || p != t.data() + t.size()) return false;
  if (v != 0 && std::abs(v) > INT64_MAX / mult) return false;
  out = v * mult;
  return true;
}

std::string number_text(double x) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x || !std::isfinite(x)) break;
  }
  return buf;
}

std::string printable(std::string_view text, int lines) {
  std::string out;
  int n = 0;
  for (const char ch : text) {
    const unsigned char u = static_cast<unsigned char>(ch);
    if (ch == '\n' && ++n >= lines) break;
    out += ch == '\n' || (u >= 0x20 && u < 0x7f) ? ch : '?';
  }
  return out;
}

std::string toml_nesting_error(std::string_view text) {
  constexpr int kMaxDepth = 32;
  int depth = 0, most = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '#') {  // a comment, to the end of the line
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (ch == '"' || ch == '\'') {  // a string: basic (escapes) or literal, single- or multi-line
      const bool multi = text.substr(i, 3) == std::string(3, ch);
      const std::string_view close = multi ? std::string_view(ch == '"' ? "\"\"\"" : "'''") : text.substr(i, 1);
      i += multi ? 3 : 1;
      while (i < text.size() && text.substr(i, close.size()) != close) {
        if (ch == '"' && text[i] == '\\' && i + 1 < text.size()) ++i;
        if (!multi && text[i] == '\n') break;
        ++i;
      }
      i += close.size() - 1;
    } else if (ch == '[' || ch == '{') {
      most = std::max(most, ++depth);
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  return most > kMaxDepth ? "arrays or inline tables nested " + std::to_string(most) + " deep (at most " +
                                std::to_string(kMaxDepth) + " are read)"
                          : "";
}

std::string split_list(std::string_view text, char sep, std::vector<std::string>& items) {
  items.clear();
  const auto trim = [](std::string_view v) {
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
    return v;
  };
  if (trim(text).empty()) return "the list is empty";
  size_t b = 0;
  for (;;) {
    const size_t e = text.find(sep, b);
    const std::string_view item = trim(text.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
    if (item.empty()) {
      const char* where = b == 0 ? "leading" : e == std::string_view::npos ? "trailing" : "doubled";
      return std::string("item ") + std::to_string(items.size() + 1) + " is empty (a " + where + " '" + sep + "')";
    }
    items.emplace_back(item);
    if (e == std::string_view::npos) return "";
    b = e + 1;
  }
}

// Keys that were merged into another: refused with a message naming the one to use.
struct RetiredKey {
  std::string_view name, message;
};
const RetiredKey kRetiredKeys[] = {
    {"hw_profile", "was merged into 'hardware', the one setting that names a hardware profile; valid: hardware=NAME "
                   "(e.g. hardware=h100-gtt, or hardware=measured for cp_algo=auto's measurement of this job's ranks)"},
};

static void refuse_retired(std::string_view key, const std::string& where) {
  for (const RetiredKey& r : kRetiredKeys)
    if (r.name == key) throw UsageError("config: " + std::string(key) + " (" + where + ") " + std::string(r.message));
}


// Closest field name (edit distance ≤ 2) for "did you mean".
static std::string suggest(std::string_view key) {
  auto dist = [](std::string_view a, std::string_view b) {
    std::vector<size_t> d(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) d[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t prev = d[0];
      d[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t cur = d[j];
        d[j] = std::min({d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] == b[j - 1] ? 0 : 1)});
        prev = cur;
      }
    }
    return d[b.size()];
  };
  std::string best;
  size_t bd = 3;
  for (const Field& f : config_fields()) {
    size_t dd = dist(key, f.name);
    if (dd < bd) { bd = dd; best = std::string(f.name); }
  }
  return best;
}

// The value type a field member stores (EnumMember: itself).
template <class M> struct MemberType;
template <class T> struct MemberType<T Config::*> { using type = T; };
template <> struct MemberType<EnumMember> { using type = EnumMember; };

static std::string range_text(const Field& f, bool integer) {
  std::ostringstream os;
  if (f.min > f.max) return "";
  if (integer) os << "an integer in [" << int64_t(f.min) << ", " << int64_t(f.max) << "]";
  else os << "a number in [" << f.min << ", " << f.max << "]";
  return os.str();
}

// A value as the user wrote it, for a message: printable, and a long one cut in the middle with
// its length (a 300-digit number is not worth 300 characters of the message).
static std::string quoted_value(const std::string& text) {
  const std::string p = printable(text, 1);
  if (p.size() <= 48) return "'" + p + "'";
  return "'" + p.substr(0, 24) + "..." + p.substr(p.size() - 8) + "' (" + std::to_string(text.size()) + " characters)";
}

// Sets one field from text; `where` names the source ("command line", "inputs/x.toml").
static void set_field(Config& c, const Field& f, const std::string& text, const std::string& where) {
  auto bad = [&](const std::string& valid) {
    throw UsageError("config: " + std::string(f.name) + " = " + quoted_value(text) + " (" + where + ") is invalid; expected " + valid);
  };
  std::visit(
      [&](auto m) {
        using T = typename MemberType<decltype(m)>::type;
        if constexpr (std::is_same_v<T, int64_t>) {
          int64_t v = 0;
          if (!parse_size(text, v)) bad(range_text(f, true) + " (K/M/G/T suffixes allowed, e.g. 128K)");
          if (f.min <= f.max && (double(v) < f.min || double(v) > f.max)) bad(range_text(f, true));
          c.*m = v;
        } else if constexpr (std::is_same_v<T, double>) {
          double v = 0;
          auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          if (text.empty() || ec != std::errc() || p != text.data() + text.size() || !std::isfinite(v))
            bad(range_text(f, false));
          if (f.min <= f.max && (v < f.min || v > f.max)) bad(range_text(f, false));
          c.*m = v;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text == "true" || text == "1" || text == "yes" || text == "on") c.*m = true;
          else if (text == "false" || text == "0" || text == "no" || text == "off") c.*m = false;
          else bad("true or false");
        } else if constexpr (std::is_same_v<decltype(m), EnumMember>) {
          const auto it = std::find(f.choices.begin(), f.choices.end(), std::string_view(text));
          if (it == f.choices.end()) bad("one of: " + join(f.choices, ", "));
          m.set(c, f.values[size_t(it - f.choices.begin())]);
        } else {
          c.*m = text;
        }
      },
      f.member);
  if (f.check) {
    std::string msg = f.check(c);
    if (!msg.empty()) {
      // checks either return a full sentence (from a parser) or what would be valid
      if (msg.rfind("config:", 0) == 0) throw UsageError(msg + " (" + where + ")");
      bad(msg);
    }
  }
}

static std::string toml_value_text(const toml::value& v) {
  if (v.is_string()) return v.as_string().str;
  if (v.is_integer()) return std::to_string(v.as_integer());
  if (v.is_boolean()) return v.as_boolean() ? "true" : "false";
  if (v.is_floating()) return number_text(v.as_floating());  // 0.1, not 0.10000000000000001
  return "";
}

Config parse_config(const std::string& toml_text, const std::string& toml_name,
                    const std::vector<std::string>& overrides, std::vector<std::string>* file_keys) {
  Config c{};
  for (const Field& f : config_fields()) set_field(c, f, field_default(f), "default");
  if (!toml_text.empty()) {
    if (const std::string nest = toml_nesting_error(toml_text); !nest.empty())
      throw UsageError("config: " + toml_name + ": " + nest + "; valid: a flat TOML file of key = value lines");
    toml::value root;
    try {
      std::istringstream is(toml_text);
      root = toml::parse(is, toml_name);
    } catch (const std::exception& e) {
      // toml11's report quotes the offending line: keep it printable and short (a binary file
      // given as --config would otherwise echo raw bytes).
      throw UsageError("config: cannot parse " + toml_name + " as TOML (valid: key = value lines, e.g. seq = 4096):\n" +
                       printable(e.what()));
    }
    if (!root.is_table()) throw UsageError("config: " + toml_name + " is not a TOML table");
    for (const auto& [key, val] : root.as_table()) {
      const Field* f = find_field(key);
      if (!f) {
        refuse_retired(key, toml_name);
        std::string s = suggest(key);
        throw UsageError("config: unknown key '" + key + "' in " + toml_name +
                         (s.empty() ? "" : "; did you mean '" + s + "'?") + " (ctxpar --help lists every key)");
      }
      if (!(val.is_string() || val.is_integer() || val.is_boolean() || val.is_floating()))
        throw UsageError("config: " + key + " in " + toml_name + " must be a string, integer, float or boolean");
      // An integer key takes a TOML integer, as the command line takes digits: a float (1e3,
      // 4096.0) would otherwise pass as its printed value.
      if (val.is_floating() && std::holds_alternative<int64_t Config::*>(f->member)) {
        const std::string d = field_default(*f);  // a size with a suffix is a TOML string ("4K")
        int64_t v = 0;
        const std::string eg = !parse_size(d, v) ? "" : key + " = " + std::to_string(v) +
                               (d == std::to_string(v) ? "" : " or " + key + " = \"" + d + "\"");
        throw UsageError("config: " + key + " in " + toml_name + " is a floating-point number (" + toml_value_text(val) +
                         "); valid: an integer" + (eg.empty() ? "" : ", e.g. " + eg));
      }
      set_field(c, *f, toml_value_text(val), toml_name);
      if (file_keys) file_keys->push_back(key);
    }
  }
  for (const std::string& arg : overrides) {
    std::string a = arg;
    if (a.rfind("--", 0) == 0) a = a.substr(2);
    const size_t eq = a.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("config: argument '" + arg + "' is not of the form key=value or --key=value");
    const std::string key = a.substr(0, eq), val = a.substr(eq + 1);
    const Field* f = find_field(key);
    if (!f) {
      refuse_retired(key, "command line");
      std::string s = suggest(key);
      throw UsageError("config: unknown key '" + key + "' (command line)" +
                       (s.empty() ? "" : "; did you mean '" + s + "'?") + " (ctxpar --help lists every key)");
    }
    set_field(c, *f, val, "command line");
  }
  return c;
}

MeshSpec parse_mesh(const std::string& mesh, int world_size, const char* field) {
  MeshSpec m;
  if (mesh.empty()) {
    m.ring = world_size;
    return m;
  }
  bool seen[4] = {false, false, false, false};
  std::vector<std::string> items;
  const std::string err = split_list(mesh, ',', items);
  if (!err.empty())
    throw UsageError(std::string("config: ") + field + " = '" + mesh + "': " + err + "; valid: axis:size items joined by ',' (e.g. mesh=ring:4,ulysses:2)");
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    const std::string axis = item.substr(0, colon);
    int64_t n = 0;
    const char* names[4] = {"dp", "tp", "ulysses", "ring"};
    int idx = -1;
    for (int i = 0; i < 4; ++i)
      if (axis == names[i]) idx = i;
    if (idx < 0)
      throw UsageError(std::string("config: ") + field + " = '" + mesh + "': unknown axis '" + axis +
                       "'; valid axes: dp, tp, ulysses, ring (e.g. mesh=ring:4,ulysses:2)");
    if (colon == std::string::npos || !parse_size(item.substr(colon + 1), n) || n < 1 || n > MeshSpec::kMaxAxis)
      throw UsageError(std::string("config: ") + field + " = '" + mesh + "': axis '" + axis + "' needs a size in [1, " +
                       std::to_string(MeshSpec::kMaxAxis) + "], as " + axis + ":N (e.g. " + field + "=ring:4,ulysses:2)");
    if (seen[idx]) throw UsageError(std::string("config: ") + field + " = '" + mesh + "': axis '" + axis + "' is given twice");
    seen[idx] = true;
    int64_t* dst[4] = {&m.dp, &m.tp, &m.ulysses, &m.ring};
    *dst[idx] = n;
  }
  return m;
}

namespace {
constexpr const char* kOffloadNames[] = {"optimizer", "attn_out", "layer_inputs", "params"};
}  // namespace

std::vector<std::string> offload_items(const std::string& s) {
  std::vector<std::string> out;
  if (s == "none" || s.empty()) return out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ',')) out.push_back(item);
  if (!s.empty() && s.back() == ',') out.push_back("");
  return out;
}

bool offloads(const Config& c, Offload what) {
  for (const std::string& i : offload_items(c.offload))
    if (i == kOffloadNames[int(what)]) return true;
  return false;
}

void validate_config(const Config& c, int world_size) {
  for (const std::string& i : offload_items(c.offload)) {
    if (i == "optimizer" || i == "layer_inputs" || i == "attn_out" || i == "params") continue;
    throw UsageError("config: offload = '" + c.offload + "': '" + i + "' is not something to offload" +
                     "; valid: none, or a list of optimizer (the AdamW moments), layer_inputs, attn_out and params");
  }
  if (offloads(c, Offload::params) && !offloads(c, Offload::optimizer))
    throw UsageError("config: offload = '" + c.offload + "': params streams the weights through the GPU with the "
                     "AdamW moments at each update, so it needs optimizer too; valid: e.g. offload=optimizer,params");
  if (offloads(c, Offload::attn_out) && c.remat != Remat::none)
    throw UsageError(std::string("config: offload = '") + c.offload + "' with remat = " + name_of(c.remat) +
                     ": the attention outputs are recomputed in the backward, not kept, so there is nothing to "
                     "offload; valid: remat=none, or an offload list without attn_out");
  if (c.offload != "none" && !c.offload.empty()) {
    const bool train = c.mode == Mode::train || (c.mode == Mode::bench && c.bench == Bench::train);
    if (!train)
      throw UsageError("config: offload = '" + c.offload + "' applies to train and bench train; valid here: offload=none");
    if (c.device == Device::cpu)
      throw UsageError("config: offload = '" + c.offload + "' moves GPU memory to the host, and with device = cpu "
                       "everything is in host memory already; valid: offload=none, or device=cuda");
  }
  const bool bench_cp = c.mode == Mode::bench && c.bench == Bench::cp;
  if (c.strategy == "all" && !bench_cp && c.mode != Mode::predict)
    throw UsageError("config: strategy = all is only for `ctxpar bench cp` (and predict); valid here: " +
                     join({strategy_choices().training.begin(), strategy_choices().training.end()}, ", ") + ", auto" +
                     (train_mode_of(c) ? std::string("; to train with each strategy and compare them in one table: "
                                                     "jobs/sweep.py --local --mode train --strategies allgather,ulysses,"
                                                     "ring,usp (README, \"Compare the training strategies\")")
                                       : std::string()));
  const bool train_mode = train_mode_of(c);
  // with the inference modes: bench infer (its deterministic table)
  const bool infer_mode = c.mode == Mode::prefill || c.mode == Mode::decode || c.mode == Mode::chat ||
                          (c.mode == Mode::bench && c.bench == Bench::infer);
  if (c.exact && !bench_cp && !train_mode && !infer_mode)
    throw UsageError(std::string("config: deterministic = true applies to train, prefill, decode, chat, `ctxpar "
                                 "bench train`, `ctxpar bench cp` and `ctxpar bench infer`; valid here: deterministic=false"));
  if (c.exact_heads != 0 && !(c.exact && (train_mode || bench_cp || infer_mode)))
    throw UsageError("config: deterministic_heads = " + std::to_string(c.exact_heads) + " applies to train, "
                     "bench train, bench cp, bench infer, prefill, decode and chat with deterministic = true; valid here: "
                     "deterministic_heads=0" + std::string(train_mode || bench_cp || infer_mode ? ", or deterministic=true" : ""));
  const int64_t kv_group = c.attention == "mla" ? 1 : c.kv_heads > 0 ? c.heads / c.kv_heads : 0;  // MLA: a head each
  if (c.exact_heads != 0 && kv_group > 0 && (c.attention == "mla" || c.heads % c.kv_heads == 0) &&
      kv_group % c.exact_heads != 0)
    throw UsageError("config: deterministic_heads = " + std::to_string(c.exact_heads) + " does not divide the " +
                     std::to_string(kv_group) + " query heads of a K/V group (" +
                     (c.attention == "mla" ? std::string("attention = mla: every head its own K and V") :
                      "heads = " + std::to_string(c.heads) + ", kv_heads = " + std::to_string(c.kv_heads)) +
                     "); valid: 0 (the whole group) or a divisor of " + std::to_string(kv_group));
  if (c.exact_block != 0 && !(c.exact && train_mode))
    throw UsageError("config: deterministic_block = " + std::to_string(c.exact_block) + " applies to train and "
                     "bench train with deterministic = true; valid here: deterministic_block=0" +
                     std::string(train_mode ? ", or deterministic=true" : ""));
  if (const int64_t tile = attn_query_block(int32_t(c.head_dim)); c.exact_block % tile != 0)
    throw UsageError("config: deterministic_block = " + std::to_string(c.exact_block) + " is not a multiple of the " +
                     "attention's query tile, " + std::to_string(tile) + " rows at head_dim = " + std::to_string(c.head_dim) +
                     "; valid: 0 (the default: " + std::to_string(default_exact_grain(c)) + " here) or a multiple of " +
                     std::to_string(tile));
  if (c.exact && (c.visible_keys || c.device != Device::cpu))
    throw UsageError(std::string("config: deterministic = true with ") + (c.visible_keys ? "frugal = true" : "device = cuda") +
                     ": not served yet (the exact schedule gathers every K/V row, on the CPU); valid: deterministic=false");
  if (c.attention == "mla" && c.device != Device::cpu)
    throw UsageError("config: attention = mla with device = cuda: MLA's latent K/V run on the CPU only so far; "
                     "valid: attention=mha, or device=cpu");
  if (c.shard != ShardLevel::none && !train_mode && !(c.mode == Mode::predict && c.predict_mode == PerfMode::train))
    throw UsageError(std::string("config: shard = ") + name_of(c.shard) + " splits the training state (weights, "
                     "gradients, AdamW moments), which only train and bench train hold (and predict prices with "
                     "predict_mode = train); valid here: shard=none");
  // prefill, decode and chat: a batch's full prefill (bench infer compares the rows in its batched-prefill table)
  const bool serve_mode = c.mode == Mode::prefill || c.mode == Mode::decode || c.mode == Mode::chat;
  if (c.placement == PlacementKind::balanced && !(train_mode || bench_cp || serve_mode))
    throw UsageError(std::string("config: placement = balanced applies to train, bench train, bench cp, prefill, decode "
                                 "and chat") +
                     (infer_mode ? " (bench infer compares zigzag and balanced in its batched-prefill table)" : "") +
                     "; valid here: placement=zigzag");
  if (c.placement == PlacementKind::document && !(train_mode || bench_cp))
    throw UsageError(std::string("config: placement = document applies to train, bench train and bench cp") +
                     (infer_mode || serve_mode ? " (inference already shards each sequence zigzag on its own: "
                                                 "placement=zigzag)" : "") +
                     "; valid here: placement=zigzag");
  if (c.placement == PlacementKind::automatic && !train_mode)
    throw UsageError(std::string("config: placement = auto applies to train and bench train (bench cp compares the "
                     "placements row by row: placement=balanced or document)") + "; valid here: placement=zigzag" +
                     (bench_cp ? ", balanced or document" : ""));
  if (c.placement != PlacementKind::zigzag && !c.visible_keys)
    throw UsageError(std::string("config: placement = ") + name_of(c.placement) + " needs frugal = true: a document's "
                     "rows may sit on any rank, and only the visible-keys exchange moves just the rows a query can see "
                     "(a whole document exchanges nothing); valid: frugal=true, or placement=zigzag");
  if (c.visible_keys && !(train_mode || bench_cp || serve_mode))
    throw UsageError(std::string("config: frugal = true applies to train, bench train, bench cp, prefill, decode and "
                                 "chat (their full prefill)") +
                     (infer_mode ? " (bench infer compares the plain and frugal rows in its batched-prefill table)" : "") +
                     "; valid here: frugal=false");
  // (bench cp strategy=all runs the visible rows on MLA's expanded K/V beside the latent rows)
  if (c.visible_keys && c.attention == "mla" && !(bench_cp && c.strategy == "all"))
    throw UsageError("config: frugal = true with attention = mla: the latent ring and all-gather move every row so far; "
                     "valid: frugal=false");
  if (c.visible_keys && c.device != Device::cpu)
    throw UsageError("config: frugal = true with device = cuda: the frugal schedules run on the CPU only so far; "
                     "valid: frugal=false, or device=cpu");
  if (c.partition != PartitionKind::zigzag && c.mode != Mode::predict)
    throw UsageError(std::string("config: partition = ") + name_of(c.partition) + " is an input of `ctxpar predict` only; the executed strategies "
                     "shard zigzag (equal causal work per rank and ring step); valid here: partition=zigzag");
  const MeshSpec m = parse_mesh(c.mesh, world_size);
  if (m.product() != world_size) {
    std::ostringstream os;
    os << "config: mesh = '" << c.mesh << "' has dp*tp*ulysses*ring = " << m.dp << "*" << m.tp << "*"
       << m.ulysses << "*" << m.ring << " = " << m.product() << " ranks, but the job has " << world_size
       << "; valid: axis sizes whose product is " << world_size << " (e.g. mesh=ring:" << world_size << ")";
    throw UsageError(os.str());
  }
  if (c.heads % c.kv_heads != 0 && c.attention != "mla")  // MLA: every head its own K and V (kv_heads unused)
    throw UsageError("config: heads = " + std::to_string(c.heads) + " is not a multiple of kv_heads = " +
                     std::to_string(c.kv_heads) + "; valid: kv_heads dividing heads (e.g. kv_heads=" +
                     std::to_string(std::gcd(c.heads, c.kv_heads)) + ")");
  if (c.bench_min_bytes > c.bench_max_bytes)
    throw UsageError("config: bench_min_bytes = " + std::to_string(c.bench_min_bytes) + " is above bench_max_bytes = " +
                     std::to_string(c.bench_max_bytes) + "; valid: bench_min_bytes <= bench_max_bytes");
  if (c.mask == MaskKind::window && c.window < 1)
    throw UsageError("config: mask = window needs window ≥ 1 (tokens), got window = " + std::to_string(c.window));
  const bool local_layers = c.layer_pattern.find('L') != std::string::npos;
  if (local_layers && c.window < 1)
    throw UsageError("config: layer_pattern = '" + c.layer_pattern + "' has local layers (L), which need window ≥ 1 " +
                     "(their sliding window in tokens, e.g. window=1024), got window = " + std::to_string(c.window));
  if (c.mask != MaskKind::window && c.window != 0 && !local_layers)
    throw UsageError("config: window = " + std::to_string(c.window) + " is set but mask = " + name_of(c.mask) +
                     " and layer_pattern = '" + c.layer_pattern + "' has no local layers (L); valid: mask=window " +
                     "or a layer_pattern with L layers, with window ≥ 1, or window=0");
}

// A field's default as text: its own, or (the strategy fields) the one the program stated.
std::string field_default(const Field& f) {
  const StrategyChoices& sc = strategy_choices();
  if (f.name == "strategy") return sc.training_default;
  if (f.name == "local_strategy") return sc.local_default;
  return std::string(f.def);
}

// A field's choices for --help: its enum names, or (the strategy fields) the registry's stated names.
std::vector<std::string_view> help_choices(const Field& f) {
  const StrategyChoices& sc = strategy_choices();
  if (f.name == "local_strategy") return {sc.local.begin(), sc.local.end()};
  if (f.name != "strategy") return f.choices;
  std::vector<std::string_view> c(sc.training.begin(), sc.training.end());
  c.insert(c.end(), std::begin(kStrategyKeywords), std::end(kStrategyKeywords));
  return c;
}

const char* field_type_name(const Field& f) {
  if (!help_choices(f).empty()) return "choice";
  return std::visit(
      [](auto m) -> const char* {
        using T = typename MemberType<decltype(m)>::type;
        if constexpr (std::is_same_v<T, int64_t>) return "int";
        else if constexpr (std::is_same_v<T, double>) return "float";
        else if constexpr (std::is_same_v<T, bool>) return "bool";
        else if constexpr (std::is_same_v<T, EnumMember>) return "choice";
        else return "string";
      },
      f.member);
}

std::string field_text(const Config& c, const Field& f) {
  return std::visit(
      [&](auto m) -> std::string {
        using T = typename MemberType<decltype(m)>::type;
        if constexpr (std::is_same_v<T, EnumMember>) {
          const int32_t v = m.get(c);
          for (size_t i = 0; i < f.values.size(); ++i)
            if (f.values[i] == v) return std::string(f.choices[i]);
          return "?";
        } else if constexpr (std::is_same_v<T, std::string>) return c.*m;
        else if constexpr (std::is_same_v<T, bool>) return c.*m ? "true" : "false";
        else if constexpr (std::is_same_v<T, double>) {
          return number_text(c.*m);  // the value itself: traces and checkpoints record it
        } else return std::to_string(c.*m);
      },
      f.member);
}

namespace {
// Width of the widest field name: every listing's columns line up, whatever the names.
int name_width() {
  size_t w = 0;
  for (const Field& f : config_fields()) w = std::max(w, f.name.size());
  return int(w) + 1;
}
}  // namespace

std::string config_listing(const Config& c) {
  std::ostringstream os;
  const int w = name_width();
  for (const Field& f : config_fields()) {
    std::string v = field_text(c, f);
    os << "  " << std::left << std::setw(w) << f.name << " = " << (v.empty() ? "\"\"" : v) << "\n";
  }
  return os.str();
}

}  // namespace ctxpar
