// The enumerated settings of ctxpar, declared once: their types and their names (the values a
// user writes). The configuration table (core/config.cpp) parses every enumerated field into
// these enums; below the parser nothing compares setting strings. Each name table lists the
// values in the order --help and the error messages show them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "attn_params.hpp"  // MaskKind (kernels' header-only vocabulary)
#include "dtype.hpp"        // Device

namespace ctxpar {

// `ctxpar <mode>` and `ctxpar bench <bench>`.
enum class Mode : int32_t { run, attn, train, prefill, decode, chat, bench, predict };
enum class Bench : int32_t { none, comm, attn, cp, train, peak, infer, calibrate };
// Which schedule of a strategy runs, resolved once from the configuration (Config::cp_schedule):
// deterministic=true -> exact (the same bits on any mesh, cp/exact.hpp), frugal=true ->
// visible (only the key rows a receiving rank can see move, cp/visible.hpp), else plain. Each is a
// row of its own in the registry (src/cp/registry.cpp), served by its own file.
enum class CpSchedule : int32_t { plain, exact, visible };
// Token partition of a CP group (shard/partition.hpp).
enum class PartitionKind : int32_t { contiguous, zigzag, striped };
// Where a packed batch's rows live over a CP group, per batch (shard/placement.hpp).
enum class PlacementKind : int32_t { zigzag, balanced, automatic, document };
// How much of the training state the ranks that hold one tp slice (dp x CP) split among them
// (model/state_shard.hpp): none; the AdamW moments and master weights (ZeRO-1); also the
// gradients (ZeRO-2); also the weights themselves (ZeRO-3).
enum class ShardLevel : int32_t { none, optimizer, grads, params };
// Who writes a checkpoint (model/checkpoint.hpp): rank 0 after gathering every tensor, or every
// rank its own part at once through MPI-IO.
enum class CheckpointIo : int32_t { serial, parallel };
// Activation recompute per layer (model/transformer.hpp).
enum class Remat : int32_t { none, attention, full };
// Prefill attention: the cost model's choice per call, or one of the two.
enum class CpAlgoSetting : int32_t { automatic, pass_kv, pass_q };
// Decode attention (the decode strategies of src/cp).
enum class DecodeAlgo : int32_t { pass_q, allgather };
// Integer type of a raw token file.
enum class TokenType : int32_t { uint16, uint32 };
// What `ctxpar predict` predicts (src/perf).
enum class PerfMode : int32_t { train, prefill, partial_prefill, decode };
// Number formats of the cost model: the profile's default, or one of them.
enum class Precision : int32_t { automatic, bf16, fp8_ffn, fp32 };

template <class E> struct EnumName {
  E value;
  const char* name;
};
inline constexpr EnumName<Mode> kModeNames[] = {{Mode::run, "run"},         {Mode::attn, "attn"},
                                                {Mode::train, "train"},     {Mode::prefill, "prefill"},
                                                {Mode::decode, "decode"},   {Mode::chat, "chat"},
                                                {Mode::bench, "bench"},     {Mode::predict, "predict"}};
inline constexpr EnumName<Bench> kBenchNames[] = {{Bench::none, ""},          {Bench::comm, "comm"},
                                                  {Bench::attn, "attn"},      {Bench::cp, "cp"},
                                                  {Bench::train, "train"},    {Bench::peak, "peak"},
                                                  {Bench::infer, "infer"},    {Bench::calibrate, "calibrate"}};
inline constexpr EnumName<Device> kDeviceNames[] = {{Device::cpu, "cpu"}, {Device::cuda, "cuda"}};
inline constexpr EnumName<PartitionKind> kPartitionNames[] = {
    {PartitionKind::zigzag, "zigzag"}, {PartitionKind::contiguous, "contiguous"}, {PartitionKind::striped, "striped"}};
inline constexpr EnumName<PlacementKind> kPlacementNames[] = {{PlacementKind::zigzag, "zigzag"},
                                                                {PlacementKind::balanced, "balanced"},
                                                                {PlacementKind::automatic, "auto"},
                                                                {PlacementKind::document, "document"}};
inline constexpr EnumName<ShardLevel> kShardNames[] = {
    {ShardLevel::none, "none"}, {ShardLevel::optimizer, "optimizer"}, {ShardLevel::grads, "grads"},
    {ShardLevel::params, "params"}};
inline constexpr EnumName<CheckpointIo> kCheckpointIoNames[] = {{CheckpointIo::serial, "serial"},
                                                                {CheckpointIo::parallel, "parallel"}};
inline constexpr EnumName<MaskKind> kMaskNames[] = {
    {MaskKind::causal, "causal"}, {MaskKind::none, "none"}, {MaskKind::window, "window"}};
inline constexpr EnumName<Remat> kRematNames[] = {
    {Remat::none, "none"}, {Remat::attention, "attention"}, {Remat::full, "full"}};
inline constexpr EnumName<CpAlgoSetting> kCpAlgoNames[] = {
    {CpAlgoSetting::automatic, "auto"}, {CpAlgoSetting::pass_kv, "pass_kv"}, {CpAlgoSetting::pass_q, "pass_q"}};
inline constexpr EnumName<DecodeAlgo> kDecodeAlgoNames[] = {{DecodeAlgo::pass_q, "pass_q"},
                                                            {DecodeAlgo::allgather, "allgather"}};
inline constexpr EnumName<TokenType> kTokenTypeNames[] = {{TokenType::uint16, "uint16"}, {TokenType::uint32, "uint32"}};
inline constexpr EnumName<PerfMode> kPerfModeNames[] = {{PerfMode::train, "train"},
                                                        {PerfMode::prefill, "prefill"},
                                                        {PerfMode::partial_prefill, "partial_prefill"},
                                                        {PerfMode::decode, "decode"}};
inline constexpr EnumName<Precision> kPrecisionNames[] = {{Precision::automatic, "auto"},
                                                          {Precision::bf16, "bf16"},
                                                          {Precision::fp8_ffn, "fp8_ffn"},
                                                          {Precision::fp32, "fp32"}};

template <class E, size_t N> constexpr const char* name_in(const EnumName<E> (&t)[N], E v) {
  for (const EnumName<E>& e : t)
    if (e.value == v) return e.name;
  return "?";
}
// false when `s` is not one of the names.
template <class E, size_t N> constexpr bool parse_in(const EnumName<E> (&t)[N], std::string_view s, E& out) {
  for (const EnumName<E>& e : t)
    if (s == e.name) {
      out = e.value;
      return true;
    }
  return false;
}

constexpr const char* name_of(Mode v) { return name_in(kModeNames, v); }
constexpr const char* name_of(Bench v) { return name_in(kBenchNames, v); }
constexpr const char* name_of(Device v) { return name_in(kDeviceNames, v); }
constexpr const char* name_of(PartitionKind v) { return name_in(kPartitionNames, v); }
constexpr const char* name_of(PlacementKind v) { return name_in(kPlacementNames, v); }
constexpr const char* name_of(ShardLevel v) { return name_in(kShardNames, v); }
constexpr const char* name_of(CheckpointIo v) { return name_in(kCheckpointIoNames, v); }
constexpr const char* name_of(MaskKind v) { return name_in(kMaskNames, v); }
constexpr const char* name_of(Remat v) { return name_in(kRematNames, v); }
constexpr const char* name_of(CpAlgoSetting v) { return name_in(kCpAlgoNames, v); }
constexpr const char* name_of(DecodeAlgo v) { return name_in(kDecodeAlgoNames, v); }
constexpr const char* name_of(TokenType v) { return name_in(kTokenTypeNames, v); }
constexpr const char* name_of(PerfMode v) { return name_in(kPerfModeNames, v); }
constexpr const char* name_of(Precision v) { return name_in(kPrecisionNames, v); }

}  // namespace ctxpar
