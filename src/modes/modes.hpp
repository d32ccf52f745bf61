// Run modes dispatched by main.cpp. Each takes the validated config, the mesh and the tracer.
#pragma once
#include <string>

namespace ctxpar {

struct Config;
class Topology;
class Tracer;

// Mode-specific validation before any allocation (same result on every rank); "" when valid.
std::string validate_mode(const Config& cfg, Topology& topo);
// The plan printed by --dry-run (mesh, each rank's coordinates and token ranges, memory estimate).
std::string dry_run_plan(const Config& cfg, Topology& topo);
// Trace file of a run: cfg.out, or out/<mode>.h5 (attn: the results go to out, the trace beside).
std::string trace_path(const Config& cfg);

// attn mode's own checks (input file datasets and shapes); "" when valid. Implemented with the mode.
std::string validate_attn_mode(const Config& cfg, Topology& topo);

int run_default(const Config& cfg, Topology& topo, Tracer& tracer);   // `ctxpar run`
int run_attn_mode(const Config& cfg, Topology& topo, Tracer& tracer); // `ctxpar attn`

}  // namespace ctxpar
