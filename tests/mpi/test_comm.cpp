// Comm (MPI backend): every operation against its definition, at the ctest rank count.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "mpi_test_env.hpp"

using namespace ctxpar;
using ctxpar::test::world;

TEST(Comm, SendRecvRingPassesToNeighbour) {
  Comm& c = world();
  const int n = c.size(), r = c.rank();
  std::vector<double> send(1000), recv(1000, -1.0);
  for (size_t i = 0; i < send.size(); ++i) send[i] = r * 1e4 + double(i);
  Request q = c.send_recv_async(std::span<const double>(send), (r + 1) % n, std::span<double>(recv), (r - 1 + n) % n);
  EXPECT_TRUE(q.pending());
  c.wait(q);
  EXPECT_FALSE(q.pending());
  const int from = (r - 1 + n) % n;
  for (size_t i = 0; i < recv.size(); ++i) EXPECT_EQ(recv[i], from * 1e4 + double(i)) << "element " << i;
}

TEST(Comm, TestCompletesAnAsyncPair) {
  Comm& c = world();
  const int n = c.size(), r = c.rank();
  std::vector<int32_t> send(1 << 18, r), recv(1 << 18, -1);
  Request q = c.send_recv_async(std::span<const int32_t>(send), (r + 1) % n, std::span<int32_t>(recv), (r - 1 + n) % n, 3);
  while (!c.test(q)) {
  }
  EXPECT_FALSE(q.pending());
  EXPECT_EQ(recv.front(), (r - 1 + n) % n);
  EXPECT_EQ(recv.back(), (r - 1 + n) % n);
}

TEST(Comm, AllGatherInRankOrder) {
  Comm& c = world();
  std::vector<int64_t> send = {c.rank() * 10, c.rank() * 10 + 1, c.rank() * 10 + 2};
  std::vector<int64_t> recv(3 * size_t(c.size()));
  c.all_gather(std::span<const int64_t>(send), std::span<int64_t>(recv));
  for (int q = 0; q < c.size(); ++q)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(recv[size_t(q * 3 + i)], q * 10 + i);
}

// Two nonblocking collectives in flight at once, a blocking one between them, completed by test
// and by wait: each result equals its blocking form's.
TEST(Comm, AsyncCollectivesMatchBlocking) {
  Comm& c = world();
  const int n = c.size();
  const size_t m = size_t(1) << 17;  // large enough for OpenMPI's rendezvous protocol
  std::vector<float> send(m), gathered(m * size_t(n), -1.0f), want(m * size_t(n));
  for (size_t i = 0; i < m; ++i) send[i] = float(c.rank()) * 1e6f + float(i % 4096);
  std::vector<double> parts(4 * size_t(n)), mine(4, -1.0), mine_want(4);
  for (size_t i = 0; i < parts.size(); ++i) parts[i] = double(c.rank() + 1) * double(i);
  Request g = c.all_gather_async(std::span<const float>(send), std::span<float>(gathered));
  Request rs = c.reduce_scatter_async(std::span<const double>(parts), std::span<double>(mine));
  EXPECT_TRUE(g.pending());
  c.all_gather(std::span<const float>(send), std::span<float>(want));
  c.reduce_scatter(std::span<const double>(parts), std::span<double>(mine_want));
  while (!c.test(g)) {
  }
  c.wait(rs);
  EXPECT_FALSE(g.pending());
  EXPECT_FALSE(rs.pending());
  EXPECT_EQ(gathered, want);
  EXPECT_EQ(mine, mine_want);
}

TEST(Comm, AllToAllTransposesBlocks) {
  Comm& c = world();
  const int n = c.size();
  const size_t block = 5;
  std::vector<float> send(block * size_t(n)), recv(block * size_t(n));
  for (int dst = 0; dst < n; ++dst)
    for (size_t i = 0; i < block; ++i) send[size_t(dst) * block + i] = float(c.rank() * 1000 + dst * 10 + int(i));
  c.all_to_all(std::span<const float>(send), std::span<float>(recv));
  for (int src = 0; src < n; ++src)
    for (size_t i = 0; i < block; ++i) EXPECT_EQ(recv[size_t(src) * block + i], float(src * 1000 + c.rank() * 10 + int(i)));
}

TEST(Comm, ReduceScatterSumsOwnBlock) {
  Comm& c = world();
  const int n = c.size();
  std::vector<double> send(4 * size_t(n)), recv(4);
  for (size_t i = 0; i < send.size(); ++i) send[i] = double(c.rank() + 1) * double(i);
  c.reduce_scatter(std::span<const double>(send), std::span<double>(recv));
  const double rank_sum = double(n) * double(n + 1) / 2;
  for (size_t i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(recv[i], rank_sum * double(size_t(c.rank()) * 4 + i));
}

TEST(Comm, AllReduceSumMaxMin) {
  Comm& c = world();
  const int n = c.size();
  int64_t s = c.rank() + 1, mx = c.rank(), mn = c.rank();
  c.all_reduce(std::span<int64_t>(&s, 1));
  c.all_reduce(std::span<int64_t>(&mx, 1), ReduceOp::max);
  c.all_reduce(std::span<int64_t>(&mn, 1), ReduceOp::min);
  EXPECT_EQ(s, int64_t(n) * (n + 1) / 2);
  EXPECT_EQ(mx, n - 1);
  EXPECT_EQ(mn, 0);
}

TEST(Comm, BroadcastAndGatherV) {
  Comm& c = world();
  int32_t v = c.rank() == 0 ? 42 : 0;
  c.broadcast(std::span<int32_t>(&v, 1), 0);
  EXPECT_EQ(v, 42);
  // Rank r sends r+1 values equal to r.
  std::vector<int32_t> mine(size_t(c.rank() + 1), c.rank()), all;
  c.gather_v(std::span<const int32_t>(mine), all, 0);
  if (c.rank() == 0) {
    ASSERT_EQ(all.size(), size_t(c.size()) * size_t(c.size() + 1) / 2);
    size_t i = 0;
    for (int q = 0; q < c.size(); ++q)
      for (int k = 0; k <= q; ++k) EXPECT_EQ(all[i++], q);
  }
}

TEST(Comm, AgreeOnErrorTakesLowestRankMessage) {
  Comm& c = world();
  const std::string none = agree_on_error(c, "");
  EXPECT_EQ(none, "");
  const int last = c.size() - 1;
  const std::string got = agree_on_error(c, c.rank() == last ? "bad value on the last rank" : "");
  EXPECT_EQ(got, "bad value on the last rank");
}

TEST(Comm, DtypeSizes) {
  EXPECT_EQ(dtype_bytes(dtype_of<float>()), 4u);
  EXPECT_EQ(dtype_bytes(dtype_of<double>()), 8u);
  EXPECT_EQ(dtype_bytes(dtype_of<int64_t>()), 8u);
  EXPECT_EQ(buf(std::span<const double>((const double*)nullptr, 3)).bytes(), 24u);
}
