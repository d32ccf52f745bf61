// Writes one Gated DeltaNet problem and the chunked CPU kernel's results as raw little-endian
// files for the PyTorch oracle (tests/oracle/test_gdn_torch.py): inputs q k v g beta s0 d_o
// ds_out (float32) and doc (int32), results o s_out dq dk dv dg dbeta ds0 (float32), each
// DIR/NAME.bin. usage: gdn_dump DIR T H Dk Dv chunk docs seed
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gdn_problem.hpp"

namespace {
template <class T>
void put(const std::string& dir, const char* name, const std::vector<T>& x) {
  const std::string path = dir + "/" + name + ".bin";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(x.data(), sizeof(T), x.size(), f) != x.size()) {
    std::fprintf(stderr, "gdn_dump: cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: gdn_dump DIR T H Dk Dv chunk docs seed\n");
    return 2;
  }
  using namespace ctxpar::test;
  GdnShape s{std::atol(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]), true};
  s.docs = std::atoi(argv[7]);
  const GdnProblem pr(s, unsigned(std::atoi(argv[8])));
  const auto r = run_fast(pr);
  const std::string dir = argv[1];
  std::vector<int32_t> doc = pr.doc.empty() ? std::vector<int32_t>(size_t(s.T), 0) : pr.doc;
  put(dir, "q", pr.q), put(dir, "k", pr.k), put(dir, "v", pr.v), put(dir, "g", pr.g), put(dir, "beta", pr.beta);
  put(dir, "s0", pr.s0), put(dir, "d_o", pr.d_o), put(dir, "ds_out", pr.ds_out), put(dir, "doc", doc);
  put(dir, "o", r.o), put(dir, "s_out", r.s_out), put(dir, "dq", r.dq), put(dir, "dk", r.dk), put(dir, "dv", r.dv);
  put(dir, "dg", r.dg), put(dir, "dbeta", r.dbeta), put(dir, "ds0", r.ds0);
  return 0;
}
