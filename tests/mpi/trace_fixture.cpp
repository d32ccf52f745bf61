// A traced run with known content, driven by environment variables, for the Python tests in
// tests/python/test_trace.py (loader, external signal, crash, watchdog). Not a ctest by itself.
//
//   CTXPAR_FIXTURE_OUT        trace path (required)
//   CTXPAR_FIXTURE_MODE       complete | wait_signal | crash | hang         (default complete)
//   CTXPAR_FIXTURE_STEPS      steps to run (complete) or the most to run    (default 5)
//   CTXPAR_FIXTURE_WARMUP     config warmup                                 (default 1)
//   CTXPAR_FIXTURE_AT         crash: exit after this step; hang: stall in it (default 2)
//   CTXPAR_FIXTURE_RANK       hang: the rank that stalls                    (default last)
//   CTXPAR_FIXTURE_PIDDIR     wait_signal: each rank writes rank<r>.pid here after step 0
//   CTXPAR_FIXTURE_WATCHDOG_S config watchdog_s                             (default 0 = off)
//
// Content per step and rank r (P ranks): for layers 0..1, P attn_fwd spans (ring steps 0..P-1,
// flops = 1e6*(r+1)), then one comm_wait span; tokens 1024, model_flops 4e9, loss 1/(step+1).
// Extra objects: /generated int32 [2, 3, 4] with values 7*i, root attribute fixture_note.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/config.hpp"
#include "cp/strategy.hpp"
#include "dist/topology.hpp"
#include "mpi_test_env.hpp"
#include "trace/trace.hpp"

using namespace ctxpar;
using ctxpar::test::world;

namespace {

std::string env(const char* name, const std::string& def) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : def;
}

constexpr int kLayers = 2;

}  // namespace

TEST(TraceFixture, Run) {
  Comm& w = world();
  const int P = w.size(), me = w.rank();
  const std::string out = env("CTXPAR_FIXTURE_OUT", "");
  ASSERT_FALSE(out.empty()) << "set CTXPAR_FIXTURE_OUT";
  const std::string mode = env("CTXPAR_FIXTURE_MODE", "complete");
  ASSERT_TRUE(mode == "complete" || mode == "wait_signal" || mode == "crash" || mode == "hang")
      << "unknown CTXPAR_FIXTURE_MODE " << mode;
  const int64_t steps = std::stoll(env("CTXPAR_FIXTURE_STEPS", "5"));
  const int64_t at = std::stoll(env("CTXPAR_FIXTURE_AT", "2"));
  const int hang_rank = std::stoi(env("CTXPAR_FIXTURE_RANK", std::to_string(P - 1)));
  const std::string pid_dir = env("CTXPAR_FIXTURE_PIDDIR", "");

  state_strategy_choices();  // the registry's strategy names, as the program states them
  Config cfg = parse_config("", "fixture",
                            {"warmup=" + env("CTXPAR_FIXTURE_WARMUP", "1"),
                             "watchdog_s=" + env("CTXPAR_FIXTURE_WATCHDOG_S", "0"),
                             "steps=" + std::to_string(steps), "out=" + out});
  MeshSpec mesh;
  mesh.ring = P;
  auto topo = Topology::create(w, mesh);
  Tracer tr(w, cfg, *topo, out, /*peak_flops_per_rank=*/1e12, "fixture");

  // A mode's extra objects (inference writes /generated [turn, step, batch] token ids).
  std::vector<int32_t> ids(2 * 3 * 4);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 7);
  tr.write_dataset("/generated", ids, {2, 3, 4});
  tr.write_attr("/", "fixture_note", "extra attribute");

  bool stopped = false;
  for (int64_t s = 0; s < steps && !stopped; ++s) {
    tr.begin_step(s);
    double wait_us = 0;
    for (int layer = 0; layer < kLayers; ++layer) {
      for (int rs = 0; rs < P; ++rs) {
        auto sc = tr.scope(Phase::attn_fwd, layer, rs, 1e6 * (me + 1), 0);
      }
      if (mode == "hang" && s == at && me == hang_rank && layer == 1) {
        // Stall without a heartbeat: the watchdog must end the job.
        std::this_thread::sleep_for(std::chrono::seconds(120));
      }
      const double t0 = tr.now_us();
      w.barrier();
      const double t1 = tr.now_us();
      tr.add_span(Phase::comm_wait, layer, -1, t0, t1, 0, 0);
      wait_us += t1 - t0;
    }
    if (mode == "wait_signal") std::this_thread::sleep_for(std::chrono::milliseconds(50));
    StepRecord rec;
    rec.tokens = 1024;
    rec.model_flops = 4e9;
    rec.loss = 1.0 / double(s + 1);
    rec.exposed_comm_s = wait_us * 1e-6;
    stopped = tr.end_step(rec);
    if (mode == "wait_signal" && s == 0 && !pid_dir.empty()) {
      std::filesystem::create_directories(pid_dir);
      const std::string f = pid_dir + "/rank" + std::to_string(me) + ".pid";
      {
        std::ofstream(f + ".tmp") << ::getpid() << "\n";
      }
      std::filesystem::rename(f + ".tmp", f);  // the driver never reads a half-written file
    }
    if (mode == "crash" && s == at) std::_Exit(17);  // killed after a flushed step, no finish
  }
  tr.finish(stopped);
  if (mode == "wait_signal") {
    EXPECT_TRUE(stopped) << "no signal arrived within " << steps << " steps";
  }
}
