// The bad-input table in one process (tests/cli/test_bad_input.py): every case's command line run
// through the program's own start-up checks (app/startup.hpp, the function main.cpp calls), one
// after the other, in one MPI job. Cases (a file, one per line: the case's directory, then its
// arguments, all separated by the unit separator 0x1f) are read by rank 0 and sent to every rank;
// each rank runs the case from its directory. Between cases rank 0 writes a marker line to stdout
// and stderr, so the caller can split both streams per case:
//   @@ctxpar-case N             before case N
//   @@ctxpar-rc N RC SECONDS    after it: the exit code every rank agreed on (-1: the checks
//                               passed, the run would go on) and its wall time
// usage: mpirun -np 2 check_inputs CASES_FILE
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "app/startup.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "dist/comm_mpi.hpp"

using namespace ctxpar;

namespace {

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string read_all(Comm& world, const char* path) {
  std::string text;
  if (world.rank() == 0) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  int64_t n = int64_t(text.size());
  world.broadcast(std::span<int64_t>(&n, 1), 0);
  text.resize(size_t(n));
  world.broadcast(std::span<uint8_t>(reinterpret_cast<uint8_t*>(text.data()), text.size()), 0);
  return text;
}

void marker(Comm& world, const std::string& line) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (world.rank() == 0) {
    std::fprintf(stdout, "%s\n", line.c_str());
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stdout);
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  Identity& id = identity();
  MPI_Comm_rank(MPI_COMM_WORLD, &id.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &id.world);
  set_abort_hook([](int code) { MPI_Abort(MPI_COMM_WORLD, code); });
  int rc = 0;
  {
    std::unique_ptr<Comm> world = make_mpi_comm(MPI_COMM_WORLD, "world");
    if (argc != 2) {
      if (world->rank() == 0) std::fprintf(stderr, "usage: check_inputs CASES_FILE\n");
      rc = 1;
    } else {
      const std::string text = read_all(*world, argv[1]);
      std::istringstream lines(text);
      std::string line;
      for (int n = 0; std::getline(lines, line); ++n) {
        std::vector<std::string> fields = split(line, '\x1f');
        const std::string dir = fields.front();
        fields.erase(fields.begin());
        marker(*world, "@@ctxpar-case " + std::to_string(n));
        world->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        int code = -1;
        if (chdir(dir.c_str()) != 0) {
          err0("check_inputs: cannot enter %s\n", dir.c_str());
          code = 1;
        } else {
          code = check_startup(fields, *world, nullptr).rc;
        }
        int32_t worst = code, least = code;
        world->all_reduce(std::span<int32_t>(&worst, 1), ReduceOp::max);
        world->all_reduce(std::span<int32_t>(&least, 1), ReduceOp::min);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // ranks that disagree: reported as 99, which no case expects
        marker(*world, "@@ctxpar-rc " + std::to_string(n) + " " + std::to_string(worst == least ? worst : 99) + " " +
                           std::to_string(s));
      }
    }
  }
  MPI_Finalize();
  return rc;
}
