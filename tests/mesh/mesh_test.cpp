// peercm::Mesh in one process: every rank is a Mesh with its own Context (its own node), used
// by its own thread, over 127.0.0.1 (iWARP) or over a random 127/8 address per rank (RoCE).
#include "peercm/mesh.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>

namespace peercm {
namespace {

using namespace std::chrono_literals;

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// N meshes that know each other's addresses.
std::vector<std::unique_ptr<Mesh>> make_meshes(int n, const MeshOptions& options) {
  std::vector<std::unique_ptr<Mesh>> meshes;
  std::vector<sockaddr_in> addresses(static_cast<std::size_t>(n), sockaddr_in{});
  for (int r = 0; r < n; ++r) {
    std::vector<sockaddr_in> mine(static_cast<std::size_t>(n), sockaddr_in{});
    // RoCE: a rank is an address of its own; left unset, the Mesh takes a random 127/8 one.
    mine[static_cast<std::size_t>(r)] = options.transport == Transport::roce ? sockaddr_in{} : loopback(0);
    auto mesh = Mesh::create(r, mine, options);
    EXPECT_TRUE(mesh.has_value());
    if (!mesh) return {};
    addresses[static_cast<std::size_t>(r)] = (*mesh)->listen_address();
    EXPECT_NE((*mesh)->listen_address().sin_port, 0);
    meshes.push_back(std::move(*mesh));
  }
  for (auto& mesh : meshes) EXPECT_TRUE(mesh->set_addresses(addresses));
  return meshes;
}

std::vector<std::uint8_t> pattern(int from, int to, std::size_t index, std::size_t size) {
  std::vector<std::uint8_t> bytes(size);
  for (std::size_t i = 0; i < size; ++i)
    bytes[i] = static_cast<std::uint8_t>(static_cast<std::size_t>(from * 31 + to * 7) + index * 13 + i * 5 + (i >> 8));
  return bytes;
}

// Distinct established connections (by TCP 4-tuple, RoCE: addresses and wire QPNs; both
// ends) per unordered pair of ranks.
std::map<std::pair<int, int>, std::set<std::string>> connections_by_pair(
    const std::vector<std::vector<MeshConnection>>& per_rank) {
  auto endpoint = [](const sockaddr_in& a, std::uint32_t qpn) {
    return std::to_string(ntohl(a.sin_addr.s_addr)) + ":" +
           (qpn != 0 ? "qp" + std::to_string(qpn) : std::to_string(ntohs(a.sin_port)));
  };
  std::map<std::pair<int, int>, std::set<std::string>> pairs;
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    for (const auto& c : per_rank[r]) {
      const int self = static_cast<int>(r);
      std::string a = endpoint(c.local, c.local_qpn), b = endpoint(c.remote, c.remote_qpn);
      if (b < a) std::swap(a, b);
      pairs[{std::min(self, c.rank), std::max(self, c.rank)}].insert(a + "-" + b);
    }
  }
  return pairs;
}

struct RankResult {
  int verified = 0;
  int errors = 0;
  std::string error;
  MeshStats stats;
  std::vector<MeshConnection> connections;
};

// Every rank sends `count` messages to every other rank at once, then receives and checks
// them (order per sender included), then flushes, then settles.
std::vector<RankResult> all_to_all(MeshModel model, int n, int count, std::size_t size,
                                   Transport transport = Transport::iwarp) {
  MeshOptions options;
  options.model = model;
  options.transport = transport;
  options.connect_timeout = 5000ms;
  auto meshes = make_meshes(n, options);
  if (meshes.size() != static_cast<std::size_t>(n)) return {};
  std::vector<RankResult> results(static_cast<std::size_t>(n));
  std::barrier sync(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Mesh& mesh = *meshes[static_cast<std::size_t>(r)];
      RankResult& out = results[static_cast<std::size_t>(r)];
      sync.arrive_and_wait();
      for (int i = 0; i < count; ++i)
        for (int k = 1; k < n; ++k) {
          const int to = (r + k) % n;
          if (!mesh.send(to, pattern(r, to, static_cast<std::size_t>(i), size))) ++out.errors;
        }
      std::vector<int> next(static_cast<std::size_t>(n), 0);
      const auto deadline = std::chrono::steady_clock::now() + 8s;
      while (out.verified + out.errors < (n - 1) * count && std::chrono::steady_clock::now() < deadline) {
        auto message = mesh.recv(100ms);
        if (!message) continue;
        const int from = message->rank;
        const auto expected = pattern(from, r, static_cast<std::size_t>(next[static_cast<std::size_t>(from)]++), size);
        if (message->bytes == expected) {
          ++out.verified;
        } else {
          ++out.errors;
        }
      }
      if (!mesh.flush(5s)) out.error = "flush timed out";
      if (!mesh.settle(3s)) out.error = "settle timed out";
      sync.arrive_and_wait();  // nobody tears down before everyone is done
      [[maybe_unused]] auto late = mesh.settle(1s);
      out.stats = mesh.stats();
      out.connections = mesh.connections();
      sync.arrive_and_wait();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

void check_all_to_all(const std::vector<RankResult>& results, int n, int count) {
  ASSERT_EQ(results.size(), static_cast<std::size_t>(n));
  for (std::size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].verified, (n - 1) * count) << "rank " << r;
    EXPECT_EQ(results[r].errors, 0) << "rank " << r;
    EXPECT_EQ(results[r].error, "") << "rank " << r;
    EXPECT_EQ(results[r].stats.out_of_order, 0u) << "rank " << r;
    EXPECT_EQ(results[r].stats.messages_dropped, 0u) << "rank " << r;
    EXPECT_EQ(results[r].stats.completion_errors, 0u) << "rank " << r;
  }
}

std::vector<std::vector<MeshConnection>> all_connections(const std::vector<RankResult>& results) {
  std::vector<std::vector<MeshConnection>> out;
  for (const auto& r : results) out.push_back(r.connections);
  return out;
}

// A naive all-to-all of `n` ranks, two messages each way: everything delivered, one or two
// connections per pair, and each extra connection counted as a duplicate at both its ends.
void check_naive_all_to_all(const std::vector<RankResult>& results, int n) {
  check_all_to_all(results, n, 2);
  const auto pairs = connections_by_pair(all_connections(results));
  const auto expected_pairs = static_cast<std::uint64_t>(n * (n - 1) / 2);
  EXPECT_EQ(pairs.size(), expected_pairs);
  std::uint64_t distinct = 0, duplicates = 0;
  for (const auto& [pair, conns] : pairs) {
    EXPECT_GE(conns.size(), 1u);
    EXPECT_LE(conns.size(), 2u);
    distinct += conns.size();
  }
  for (const auto& r : results) duplicates += r.stats.duplicates;
  EXPECT_EQ(duplicates, 2 * (distinct - expected_pairs));
}

TEST(Mesh, ModelNames) {
  for (MeshModel m : {MeshModel::p2p, MeshModel::static_order, MeshModel::naive})
    EXPECT_EQ(parse_mesh_model(to_string(m)), m);
  EXPECT_FALSE(parse_mesh_model("mpi"));
}

TEST(Mesh, RejectsBadArguments) {
  EXPECT_FALSE(Mesh::create(0, {}, {}));
  EXPECT_FALSE(Mesh::create(2, {loopback(0), loopback(0)}, {}));
  MeshOptions small;
  small.recv_depth = 1;
  EXPECT_FALSE(Mesh::create(0, {loopback(0)}, small));
  auto meshes = make_meshes(2, {});
  ASSERT_EQ(meshes.size(), 2u);
  EXPECT_EQ(meshes[0]->send(2, std::vector<std::uint8_t>(1)).error(), std::errc::invalid_argument);
  EXPECT_EQ(meshes[0]->send(1, std::vector<std::uint8_t>(64 * 1024 + 1)).error(), std::errc::message_size);
}

TEST(Mesh, SendToSelf) {
  auto meshes = make_meshes(1, {});
  ASSERT_EQ(meshes.size(), 1u);
  const std::vector<std::uint8_t> hello{1, 2, 3};
  ASSERT_TRUE(meshes[0]->send(0, hello));
  auto message = meshes[0]->recv(100ms);
  ASSERT_TRUE(message);
  EXPECT_EQ(message->rank, 0);
  EXPECT_EQ(message->bytes, hello);
}

TEST(Mesh, StaticAllToAll) {
  const int n = 4;
  auto results = all_to_all(MeshModel::static_order, n, 3, 1000);
  check_all_to_all(results, n, 3);
  const auto pairs = connections_by_pair(all_connections(results));
  EXPECT_EQ(pairs.size(), 6u);
  for (const auto& [pair, conns] : pairs) EXPECT_EQ(conns.size(), 1u) << pair.first << "-" << pair.second;
  for (std::size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].stats.duplicates, 0u);
    EXPECT_EQ(results[r].stats.connections_established, 3u);
    // Only lower ranks connect.
    EXPECT_EQ(results[r].stats.connects_started, static_cast<std::uint64_t>(n - 1 - static_cast<int>(r)));
    for (const auto& c : results[r].connections) EXPECT_EQ(c.initiated, static_cast<int>(r) < c.rank);
  }
}

// With the p2p resolver in the CM: exactly one connection per pair, every rank sees
// ESTABLISHED on the id it connected with, and no CONNECT_REQUEST for a losing request.
TEST(Mesh, P2pAllToAllExactlyOneConnectionPerPair) {
  const int n = 4;
  auto results = all_to_all(MeshModel::p2p, n, 3, 1000);
  check_all_to_all(results, n, 3);
  const auto pairs = connections_by_pair(all_connections(results));
  EXPECT_EQ(pairs.size(), 6u);
  for (const auto& [pair, conns] : pairs) EXPECT_EQ(conns.size(), 1u) << pair.first << "-" << pair.second;
  for (std::size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].stats.duplicates, 0u) << "rank " << r;
    EXPECT_EQ(results[r].stats.connections_established, 3u) << "rank " << r;
    for (const auto& c : results[r].connections) EXPECT_EQ(ntohl(c.local.sin_addr.s_addr), INADDR_LOOPBACK);
  }
}

// The same over RoCEv2: every rank on its own 127/8 address, connections told apart by their
// QPNs, and the CM's p2p resolution (IB CM, docs/roce-transport.md) makes one per pair.
TEST(Mesh, RoceP2pAllToAllExactlyOneConnectionPerPair) {
  const int n = 4;
  auto results = all_to_all(MeshModel::p2p, n, 3, 1000, Transport::roce);
  check_all_to_all(results, n, 3);
  const auto pairs = connections_by_pair(all_connections(results));
  EXPECT_EQ(pairs.size(), 6u);
  for (const auto& [pair, conns] : pairs) EXPECT_EQ(conns.size(), 1u) << pair.first << "-" << pair.second;
  std::set<std::uint32_t> addresses;
  for (std::size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].stats.duplicates, 0u) << "rank " << r;
    EXPECT_EQ(results[r].stats.connections_established, 3u) << "rank " << r;
    EXPECT_EQ(results[r].stats.requests_rejected, 0u) << "rank " << r;
    ASSERT_EQ(results[r].connections.size(), 3u) << "rank " << r;
    const std::uint32_t own = ntohl(results[r].connections.front().local.sin_addr.s_addr);
    EXPECT_EQ(own >> 24, 127u) << "rank " << r;
    addresses.insert(own);
    for (const auto& c : results[r].connections) {
      EXPECT_EQ(ntohl(c.local.sin_addr.s_addr), own) << "rank " << r;  // one address per rank
      EXPECT_NE(c.local_qpn, 0u);
      EXPECT_NE(c.remote_qpn, 0u);
    }
  }
  EXPECT_EQ(addresses.size(), static_cast<std::size_t>(n));  // a distinct address per rank
}

TEST(Mesh, RoceStaticAndNaiveAllToAll) {
  const int n = 4;
  auto results = all_to_all(MeshModel::static_order, n, 2, 1000, Transport::roce);
  check_all_to_all(results, n, 2);
  auto pairs = connections_by_pair(all_connections(results));
  EXPECT_EQ(pairs.size(), 6u);
  for (const auto& [pair, conns] : pairs) EXPECT_EQ(conns.size(), 1u) << pair.first << "-" << pair.second;
  for (const auto& r : results) EXPECT_EQ(r.stats.duplicates, 0u);

  check_naive_all_to_all(all_to_all(MeshModel::naive, n, 2, 100, Transport::roce), n);
}

TEST(Mesh, NaiveAllToAllDeliversEverythingAndCountsDuplicates) {
  const int n = 4;
  check_naive_all_to_all(all_to_all(MeshModel::naive, n, 2, 100), n);
}

// Sends queued before the connection exists go out in order once it is established, beyond
// the credits of one connection (flow control), in both directions at once.
TEST(Mesh, QueuedSendsKeepTheirOrder) {
  for (MeshModel model : {MeshModel::p2p, MeshModel::static_order}) {
    SCOPED_TRACE(std::string(to_string(model)));
    MeshOptions options;
    options.model = model;
    options.recv_depth = 4;
    auto meshes = make_meshes(2, options);
    ASSERT_EQ(meshes.size(), 2u);
    const int count = 300;
    // Rank 1 first: in static mode it may not connect, so all of these wait for rank 0.
    for (int i = 0; i < count; ++i)
      ASSERT_TRUE(meshes[1]->send(0, pattern(1, 0, static_cast<std::size_t>(i), 1 + static_cast<std::size_t>(i) * 37)));
    EXPECT_FALSE(meshes[1]->connected(0));
    for (int i = 0; i < count; ++i)
      ASSERT_TRUE(meshes[0]->send(1, pattern(0, 1, static_cast<std::size_t>(i), 1 + static_cast<std::size_t>(i) * 41)));
    int got[2] = {0, 0};
    const auto deadline = std::chrono::steady_clock::now() + 8s;
    while ((got[0] < count || got[1] < count) && std::chrono::steady_clock::now() < deadline) {
      for (int r = 0; r < 2; ++r) {
        auto message = meshes[static_cast<std::size_t>(r)]->recv(1ms);
        if (!message) continue;
        const int from = 1 - r;
        ASSERT_EQ(message->rank, from);
        const std::size_t i = static_cast<std::size_t>(got[r]);
        ASSERT_EQ(message->bytes, pattern(from, r, i, 1 + i * static_cast<std::size_t>(from == 1 ? 37 : 41)))
            << "message " << i << " to rank " << r;
        ++got[r];
      }
    }
    EXPECT_EQ(got[0], count);
    EXPECT_EQ(got[1], count);
    for (auto& mesh : meshes) {
      const auto stats = mesh->stats();
      EXPECT_EQ(stats.out_of_order, 0u);
      EXPECT_EQ(stats.messages_sent, static_cast<std::uint64_t>(count));
      EXPECT_GT(stats.control_sent, 0u);  // hello at least
    }
  }
}

void rdma_write_into_exposed_region(const MeshOptions& options) {
  auto meshes = make_meshes(2, options);
  ASSERT_EQ(meshes.size(), 2u);
  std::vector<std::uint8_t> region(300 * 1024, 0);  // bigger than a message: the write is split
  const std::size_t offset = 1000;
  const auto data = pattern(0, 1, 99, 200 * 1024);
  // The write is queued before rank 1 has exposed anything: it waits for the announcement.
  ASSERT_TRUE(meshes[0]->rdma_write(1, 7, offset, data));
  const std::vector<std::uint8_t> done{'d', 'o', 'n', 'e'};
  ASSERT_TRUE(meshes[0]->send(1, done));
  // Rank 1 exposes after a while; the connection is up by then.
  std::optional<MeshMessage> message;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!meshes[1]->connected(0) && std::chrono::steady_clock::now() < deadline) {
    meshes[0]->progress(1ms);
    meshes[1]->progress(1ms);
  }
  ASSERT_TRUE(meshes[1]->connected(0));
  ASSERT_TRUE(meshes[1]->expose(7, region));
  EXPECT_EQ(meshes[1]->expose(7, region).error(), std::errc::file_exists);
  while (!message && std::chrono::steady_clock::now() < deadline) {
    meshes[0]->progress(1ms);
    message = meshes[1]->recv(1ms);
  }
  ASSERT_TRUE(message);
  EXPECT_EQ(message->bytes, done);
  // The Send behind the write on the same connection says the write has landed.
  EXPECT_TRUE(std::equal(data.begin(), data.end(), region.begin() + offset));
  EXPECT_EQ(region[offset - 1], 0);
  EXPECT_EQ(region[offset + data.size()], 0);
  EXPECT_EQ(meshes[0]->stats().rdma_writes, 4u);  // 200 KiB in 64 KiB pieces
  EXPECT_EQ(meshes[0]->stats().write_errors, 0u);
  // Known region, out of bounds: refused at once.
  EXPECT_EQ(meshes[0]->rdma_write(1, 7, region.size() - 10, data).error(), std::errc::invalid_argument);
  // A region exposed after connecting is announced over the live connection.
  std::vector<std::uint8_t> second(64, 0);
  ASSERT_TRUE(meshes[0]->expose(8, second));
  ASSERT_TRUE(meshes[1]->rdma_write(0, 8, 60, std::vector<std::uint8_t>{9, 8, 7, 6}));
  ASSERT_TRUE(meshes[1]->send(0, done));
  message.reset();
  while (!message && std::chrono::steady_clock::now() < deadline) {
    meshes[1]->progress(1ms);
    message = meshes[0]->recv(1ms);
  }
  ASSERT_TRUE(message);
  EXPECT_EQ(second[60], 9);
  EXPECT_EQ(second[63], 6);
}

TEST(Mesh, RdmaWriteIntoExposedRegion) { rdma_write_into_exposed_region({}); }

TEST(Mesh, RoceRdmaWriteIntoExposedRegion) {
  MeshOptions options;
  options.transport = Transport::roce;
  rdma_write_into_exposed_region(options);
}

TEST(Mesh, UnreachablePeerFailsWithinTheConnectTimeout) {
  MeshOptions options;
  options.connect_timeout = 400ms;
  auto meshes = make_meshes(2, options);
  ASSERT_EQ(meshes.size(), 2u);
  // Rank 1 goes away: its port is closed.
  std::vector<sockaddr_in> addresses = {meshes[0]->listen_address(), meshes[1]->listen_address()};
  meshes[1].reset();
  ASSERT_TRUE(meshes[0]->set_addresses(addresses));
  ASSERT_TRUE(meshes[0]->send(1, std::vector<std::uint8_t>(10, 1)));
  const auto start = std::chrono::steady_clock::now();
  auto flushed = meshes[0]->flush(3s);
  EXPECT_FALSE(flushed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_FALSE(meshes[0]->send(1, std::vector<std::uint8_t>(10, 1)));
  const auto stats = meshes[0]->stats();
  EXPECT_EQ(stats.peers_failed, 1u);
  EXPECT_GE(stats.connect_failures, 1u);
  EXPECT_GE(stats.rejects_received[static_cast<int>(RejectReason::refused)], 1u);
  EXPECT_EQ(stats.messages_dropped, 1u);
}

TEST(Mesh, WaitConnectedAndConnectAll) {
  for (MeshModel model : {MeshModel::p2p, MeshModel::static_order, MeshModel::naive}) {
    SCOPED_TRACE(std::string(to_string(model)));
    MeshOptions options;
    options.model = model;
    auto meshes = make_meshes(3, options);
    ASSERT_EQ(meshes.size(), 3u);
    meshes[0]->connect_all();
    meshes[1]->connect_all();
    meshes[2]->connect_all();
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    bool all = false;
    while (!all && std::chrono::steady_clock::now() < deadline) {
      all = true;
      for (int r = 0; r < 3; ++r) {
        meshes[static_cast<std::size_t>(r)]->progress(1ms);
        for (int p = 0; p < 3; ++p) all = all && meshes[static_cast<std::size_t>(r)]->connected(p);
      }
    }
    EXPECT_TRUE(all);
    EXPECT_TRUE(meshes[2]->wait_connected(0, 1s));
  }
}

}  // namespace
}  // namespace peercm
