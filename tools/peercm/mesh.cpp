// `peercm mesh`: N ranks, all-to-all at the same moment, connections on demand (design.md §5).
//
//   peercm mesh --ranks N [--model p2p|static|naive] [--transport iwarp|roce] [--bootstrap local] [--json]
//   peercm mesh --ranks N --bootstrap file --bootstrap-dir DIR --rank I [--bind ADDR] ...
//   mpirun -np N peercm mesh --bootstrap pmix ...      (when built with PMIx)
//
// With `--bootstrap local` (the default) rank 0 is this process: it spawns ranks 1..N-1 (fork
// + exec of /proc/self/exe with the hidden arguments --rank and --bootstrap-fd) and relays the
// bootstrap collectives over socketpairs (src/mesh/local_bootstrap.hpp). With `--bootstrap
// file` every rank is started separately (e.g. one per network namespace, each with its own
// --bind address) and the collectives go through files in a fresh shared directory
// (src/mesh/file_bootstrap.hpp); rank 0 prints the summary. With `--bootstrap pmix` the
// launcher started every rank: rank and size come from PMIx (--ranks is ignored) and the
// collectives are PMIx fences (src/mesh/pmix_bootstrap.hpp). Every rank:
//   1. creates its Mesh, listening on --bind:0, and allgathers the listening addresses
//      (--transport roce: a RoCE node is one address, so without --bind every rank takes a
//      random 127/8 address of its own, which this exchange publishes);
//   2. passes a barrier, then at once sends one message to every other rank (so that the
//      connects of every pair collide), receives and verifies one message from every rank
//      (size --size; bytes 0-7: sender and receiver rank, then a pattern of both), and flushes
//      its sends: time_to_mesh_us is the time from the barrier to here;
//   3. waits for connection setup to settle, passes a second barrier, settles again (late
//      duplicate attempts of slower ranks in naive mode), and sends its statistics and its
//      established connections (TCP 4-tuples) to rank 0, which prints the summary.
// A collective keeps the rank's Mesh progressing meanwhile (requests are accepted, credits
// returned), so that no rank waits for one that is sitting in a barrier.
//
// Summary fields: connections = distinct established connections (iWARP: a TCP 4-tuple, RoCE:
// the two ends' addresses and wire QPNs; seen at either end counts once); expected_connections = N(N-1)/2; pairs_connected = pairs with at least one;
// duplicates = connections beyond the first of a pair; asymmetric_connections = connections
// only one end reports as established; collisions = p2p collisions the CM resolved (the losing
// side's count: cm_stats collisions_lost, summed); rejects = CM rejects by reason, counted once
// each (by the side that decided them; refused/timeout by the side that saw them);
// time_to_mesh_us = max over ranks; messages_verified over messages_expected = N(N-1).
// Exit status 1 when any rank fails or times out, a message fails verification, or a pair has
// no connection; with p2p or static also when connections != expected or duplicates != 0.
// A global --timeout (default 30 s) bounds everything: then rank 0 kills the children.
#include <arpa/inet.h>
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <future>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "endpoint.hpp"
#include "mesh/file_bootstrap.hpp"
#include "mesh/local_bootstrap.hpp"
#ifdef PEERCM_HAVE_PMIX
#include "mesh/pmix_bootstrap.hpp"
#endif
#include "peercm/mesh.hpp"
#include "subcommands.hpp"

namespace peercm::tool {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

struct MeshToolOptions {
  int ranks = 4;
  std::string model = "p2p";
  std::string bootstrap = "local";
  std::string transport = "iwarp";
  bool json = false;
  double timeout = 30.0;
  std::size_t size = 1024;
  std::string bind;  // empty: 127.0.0.1 over iWARP, a random 127/8 address per rank over RoCE
  std::string crc;
  std::string progress = "thread";
  bool verbose = false;
  std::string bootstrap_dir;  // --bootstrap file
  // --bootstrap file: this process's rank. --bootstrap local: hidden, set by rank 0 for the
  // ranks it spawns (with the descriptor of their socketpair).
  int rank = -1;
  int bootstrap_fd = -1;
  int crash_rank = -1;  // testing: this rank exits abruptly after the start barrier
};

constexpr std::size_t kMinSize = 8;
constexpr std::size_t kMaxSize = 64 * 1024;
constexpr int kMaxRanks = 256;

// A collective failed (a rank died, or the global deadline passed): the job is over.
struct BootstrapFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<pid_t> g_children;  // rank 0: the spawned ranks, for the watchdog
std::atomic<bool> g_finished{false};

std::uint8_t message_byte(int from, int to, std::size_t i) {
  return static_cast<std::uint8_t>(static_cast<std::size_t>(from * 29 + to * 11) + i * 7 + (i >> 8) + 1);
}

std::vector<std::uint8_t> make_message(int from, int to, std::size_t size) {
  std::vector<std::uint8_t> bytes(size);
  ByteWriter w;
  w.u32(static_cast<std::uint32_t>(from)).u32(static_cast<std::uint32_t>(to));
  std::copy(w.bytes().begin(), w.bytes().end(), bytes.begin());
  for (std::size_t i = kMinSize; i < size; ++i) bytes[i] = message_byte(from, to, i);
  return bytes;
}

// Empty when the message is the one `from` owes `to`; the reason otherwise.
std::string check_message(const MeshMessage& m, int to, std::size_t size) {
  if (m.bytes.size() != size) return fmt::format("{} bytes, expected {}", m.bytes.size(), size);
  ByteReader r(m.bytes);
  const auto from = static_cast<int>(r.u32());
  const auto dest = static_cast<int>(r.u32());
  if (from != m.rank || dest != to) return fmt::format("header says {} -> {}", from, dest);
  for (std::size_t i = kMinSize; i < size; ++i)
    if (m.bytes[i] != message_byte(from, to, i)) return fmt::format("byte {} differs", i);
  return {};
}

// One end of a connection: iWARP "address:port" (TCP); RoCE "address/qpN": the connections
// between two RoCE ranks share their addresses (and the ports a RoCE id reports are CM service
// ports), the end's wire QPN tells them apart.
std::string endpoint_text(const sockaddr_in& a, std::uint32_t qpn) {
  if (qpn == 0) return format_address(a);
  char host[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
  return fmt::format("{}/qp{}", host, qpn);
}

// Runs a bootstrap collective on another thread while this one keeps the Mesh progressing.
template <class F>
auto with_progress(Mesh* mesh, F&& f) -> decltype(f()) {
  if (!mesh) return f();
  auto done = std::async(std::launch::async, std::forward<F>(f));
  while (done.wait_for(milliseconds(0)) != std::future_status::ready) mesh->progress(milliseconds(2));
  return done.get();
}

milliseconds left_until(Clock::time_point deadline) {
  return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
}

std::vector<std::vector<std::uint8_t>> collective(mesh::Bootstrap& boot, Mesh* mesh, std::span<const std::uint8_t> bytes,
                                                  Clock::time_point deadline, std::string_view what) {
  auto all = with_progress(mesh, [&] { return boot.allgather(bytes, left_until(deadline)); });
  if (!all) {
    const int gone = boot.failed_rank();
    throw BootstrapFailure(gone >= 0 ? fmt::format("{}: rank {}: {}", what, gone, errc_text(all.error()))
                                     : fmt::format("{}: {}", what, errc_text(all.error())));
  }
  return std::move(*all);
}

json stats_json(const MeshStats& s) {
  json rejects_received = json::object();
  json rejects_sent = json::object();
  for (int reason = 1; reason < 8; ++reason) {
    const auto name = std::string(to_string(static_cast<RejectReason>(reason)));
    rejects_received[name] = s.cm.rejects_received[reason];
    rejects_sent[name] = s.cm.rejects_sent[reason];
  }
  return json{{"connects_started", s.connects_started},
              {"connects_refused_by_cm", s.connects_refused_by_cm},
              {"connect_failures", s.connect_failures},
              {"connect_retries", s.connect_retries},
              {"requests_accepted", s.requests_accepted},
              {"requests_rejected", s.requests_rejected},
              {"connections_established", s.connections_established},
              {"duplicates", s.duplicates},
              {"disconnects", s.disconnects},
              {"peers_failed", s.peers_failed},
              {"messages_sent", s.messages_sent},
              {"messages_received", s.messages_received},
              {"messages_dropped", s.messages_dropped},
              {"out_of_order", s.out_of_order},
              {"control_sent", s.control_sent},
              {"completion_errors", s.completion_errors},
              {"collisions_won", s.cm.collisions_won},
              {"collisions_lost", s.cm.collisions_lost},
              {"cm_rejects_sent", rejects_sent},
              {"cm_rejects_received", rejects_received}};
}

// One rank's part of the run; returns the table of every rank's report (JSON text).
std::vector<std::vector<std::uint8_t>> run_rank(mesh::Bootstrap& boot, const MeshToolOptions& o,
                                                Clock::time_point deadline) {
  const int rank = boot.rank();
  const int n = boot.size();
  const auto data_deadline = std::max(Clock::now() + milliseconds(1000), deadline - milliseconds(4000));
  json report{{"rank", rank}, {"pid", ::getpid()}};
  std::vector<std::string> errors;
  auto error = [&](std::string what) {
    if (o.verbose) fmt::print(stderr, "peercm mesh rank {}: {}\n", rank, what);
    errors.push_back(std::move(what));
  };

  // 1. The Mesh and its listening address.
  MeshOptions options;
  options.model = *parse_mesh_model(o.model);
  options.transport = transport_option(o.transport);
  options.context.progress = progress_option(o.progress);
  options.crc = crc_option(o.crc).value_or(-1);
  options.connect_timeout = std::clamp(std::chrono::duration_cast<milliseconds>(left_until(data_deadline) / 2),
                                       milliseconds(500), milliseconds(10000));
  // Every rank listens before the address exchange: an attempt that finds nobody listening
  // means that rank died, and the job ends instead of waiting out its deadline. Over RoCE a
  // dead rank is heard of within 1 s (docs/reliability.md, "Dead peers"): a REQ to it bounces
  // at once, a REQ it took with it is resent after 0.67 s (packet lifetime 67 ms, response
  // timeout 537 ms) and bounces then, and an idle connection is probed after 200 ms.
  options.peers_listen_first = true;
  options.context.roce.cm_packet_lifetime = 14;
  options.context.roce.cm_response_timeout = 17;
  options.context.roce.keepalive_interval = milliseconds(200);
  std::unique_ptr<Mesh> mesh;
  std::vector<sockaddr_in> addresses(static_cast<std::size_t>(n), sockaddr_in{});
  // No --bind: the Mesh chooses (127.0.0.1 over iWARP, a random 127/8 address over RoCE).
  if (auto bind = o.bind.empty() ? std::optional<sockaddr_in>(sockaddr_in{}) : parse_address(o.bind, 0)) {
    addresses[static_cast<std::size_t>(rank)] = *bind;
    auto created = Mesh::create(rank, addresses, options);
    if (created) {
      mesh = std::move(*created);
    } else {
      error(fmt::format("cannot create the mesh: {}", errc_text(created.error())));
    }
  } else {
    error(fmt::format("cannot resolve --bind {}", o.bind));
  }
  std::vector<std::uint8_t> mine(6, 0);
  if (mesh) {
    const sockaddr_in a = mesh->listen_address();
    std::memcpy(mine.data(), &a.sin_addr.s_addr, 4);
    std::memcpy(mine.data() + 4, &a.sin_port, 2);
  }
  const auto table = collective(boot, mesh.get(), mine, deadline, "address exchange");
  for (int r = 0; r < n; ++r) {
    const auto& blob = table[static_cast<std::size_t>(r)];
    sockaddr_in& a = addresses[static_cast<std::size_t>(r)];
    a.sin_family = AF_INET;
    if (blob.size() == 6) {
      std::memcpy(&a.sin_addr.s_addr, blob.data(), 4);
      std::memcpy(&a.sin_port, blob.data() + 4, 2);
    }
    if (a.sin_port == 0 && mesh) error(fmt::format("rank {} has no listening address", r));
  }
  if (mesh && errors.empty()) {
    if (auto ok = mesh->set_addresses(addresses); !ok) error("set_addresses failed");
  }

  // 2. All sends at the same moment, then receive, verify and flush.
  collective(boot, mesh.get(), {}, deadline, "start barrier");
  if (rank == o.crash_rank) {
    // Tests measure how long the others take to notice, from this clock reading
    // (CLOCK_MONOTONIC, which every process of the host shares).
    const auto at = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    fmt::print(stderr, "peercm mesh rank {}: crashing at monotonic {:.6f}\n", rank, at);
    std::fflush(stderr);
    ::_exit(9);
  }
  const auto start = Clock::now();
  std::uint32_t verified = 0;
  std::optional<std::int64_t> time_to_mesh_us;
  if (mesh && errors.empty()) {
    for (int k = 1; k < n; ++k) {
      const int to = (rank + k) % n;
      if (auto ok = mesh->send(to, make_message(rank, to, o.size)); !ok)
        error(fmt::format("send to rank {}: {}", to, errc_text(ok.error())));
    }
    std::vector<bool> got(static_cast<std::size_t>(n), false);
    got[static_cast<std::size_t>(rank)] = true;
    int missing = n - 1;
    // A rank the mesh gave up on sends nothing more: the wait ends once every rank still
    // missing is one of those.
    auto all_missing_failed = [&] {
      for (int r = 0; r < n; ++r)
        if (!got[static_cast<std::size_t>(r)] && !mesh->failed(r)) return false;
      return true;
    };
    while (missing > 0 && Clock::now() < data_deadline && !all_missing_failed()) {
      // A missing rank must have a connection (or an attempt) to send on: one whose
      // connection ended (its QP failed: the rank may have died) is connected to again,
      // which a dead rank refuses at once (MeshOptions::peers_listen_first).
      for (int r = 0; r < n; ++r)
        if (!got[static_cast<std::size_t>(r)] && !mesh->connected(r) && !mesh->failed(r))
          (void)mesh->wait_connected(r, milliseconds(0));
      auto message = mesh->recv(std::min(milliseconds(20), left_until(data_deadline)));
      if (!message) continue;
      const auto from = static_cast<std::size_t>(message->rank);
      if (message->rank < 0 || message->rank >= n || got[from]) {
        error(fmt::format("unexpected message from rank {}", message->rank));
        continue;
      }
      got[from] = true;
      --missing;
      if (auto why = check_message(*message, rank, o.size); why.empty()) {
        ++verified;
      } else {
        error(fmt::format("message from rank {} failed verification: {}", message->rank, why));
      }
    }
    for (int r = 0; r < n; ++r) {
      if (got[static_cast<std::size_t>(r)]) continue;
      const auto why = mesh->failed(r);
      error(why ? fmt::format("no message from rank {}: gave up on it: {}", r, errc_text(*why))
                : fmt::format("no message from rank {}", r));
    }
    if (auto ok = mesh->flush(left_until(data_deadline)); !ok)
      error(fmt::format("flush: {}", errc_text(ok.error())));
    for (int r = 0; r < n; ++r)
      if (!mesh->connected(r)) error(fmt::format("not connected to rank {}", r));
    if (errors.empty())
      time_to_mesh_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
    [[maybe_unused]] auto settled = mesh->settle(std::min(milliseconds(3000), left_until(data_deadline)));
  }

  // 3. Everyone is done with traffic; late connection setups finish; statistics to rank 0.
  collective(boot, mesh.get(), {}, deadline, "end barrier");
  if (mesh) {
    [[maybe_unused]] auto settled = mesh->settle(std::min(milliseconds(1000), left_until(data_deadline)));
    json connections = json::array();
    for (const auto& c : mesh->connections())
      connections.push_back(json{{"peer", c.rank},
                                 {"initiated", c.initiated},
                                 {"active", c.active},
                                 {"local", endpoint_text(c.local, c.local_qpn)},
                                 {"remote", endpoint_text(c.remote, c.remote_qpn)}});
    report["connections"] = connections;
    report["stats"] = stats_json(mesh->stats());
  }
  report["verified"] = verified;
  report["time_to_mesh_us"] = time_to_mesh_us ? json(*time_to_mesh_us) : json(nullptr);
  report["errors"] = errors;
  const std::string text = report.dump();
  const std::vector<std::uint8_t> bytes(text.begin(), text.end());
  auto all = collective(boot, mesh.get(), bytes, deadline, "statistics gather");
  // Nobody tears its connections down while another rank may still be reading them.
  collective(boot, mesh.get(), {}, deadline, "final barrier");
  return all;
}

std::uint64_t sum(const std::vector<json>& reports, const char* field) {
  std::uint64_t total = 0;
  for (const auto& r : reports)
    if (r.contains("stats")) total += r["stats"].value(field, std::uint64_t{0});
  return total;
}

// Rank 0: the summary of every rank's report.
json summarize_job(const MeshToolOptions& o, const std::vector<std::vector<std::uint8_t>>& table,
                   const std::vector<int>& child_status) {
  const int n = o.ranks;
  std::vector<json> reports;
  std::vector<std::string> errors;
  for (int r = 0; r < n; ++r) {
    const auto& blob = table[static_cast<std::size_t>(r)];
    json report = json::parse(blob.begin(), blob.end(), nullptr, false);
    if (report.is_discarded() || !report.is_object()) {
      errors.push_back(fmt::format("rank {}: no report", r));
      report = json::object();
    }
    for (const auto& e : report.value("errors", json::array())) errors.push_back(fmt::format("rank {}: {}", r, e.get<std::string>()));
    reports.push_back(std::move(report));
  }
  for (std::size_t r = 1; r < child_status.size(); ++r)
    if (child_status[r] != 0) errors.push_back(fmt::format("rank {}: exit status {}", r, child_status[r]));

  // Connections by their TCP 4-tuple (RoCE: addresses and QPNs): each is normally reported by
  // both of its ends.
  std::map<std::string, int> ends;
  std::map<std::pair<int, int>, std::set<std::string>> pairs;
  for (int r = 0; r < n; ++r) {
    for (const auto& c : reports[static_cast<std::size_t>(r)].value("connections", json::array())) {
      std::string a = c.value("local", ""), b = c.value("remote", "");
      if (b < a) std::swap(a, b);
      const std::string key = a + " " + b;
      const int peer = c.value("peer", -1);
      ++ends[key];
      pairs[{std::min(r, peer), std::max(r, peer)}].insert(key);
    }
  }
  std::uint64_t duplicates = 0;
  for (const auto& [pair, keys] : pairs) duplicates += keys.size() - 1;
  std::uint64_t asymmetric = 0;
  for (const auto& [key, count] : ends)
    if (count != 2) ++asymmetric;

  json rejects = json::object();
  for (int reason = 1; reason < 8; ++reason) {
    const auto value = static_cast<RejectReason>(reason);
    const std::string name(to_string(value));
    // refused and timeout are not decided by a responder: count them where they are seen.
    const bool seen_by_initiator = value == RejectReason::refused || value == RejectReason::timeout;
    std::uint64_t total = 0;
    for (const auto& r : reports)
      if (r.contains("stats"))
        total += r["stats"][seen_by_initiator ? "cm_rejects_received" : "cm_rejects_sent"].value(name, std::uint64_t{0});
    rejects[name == "p2p collision" ? "collision" : name] = total;
  }

  std::uint64_t verified = 0;
  std::optional<std::int64_t> time_to_mesh;
  bool all_timed = true;
  for (const auto& r : reports) {
    verified += r.value("verified", std::uint64_t{0});
    if (r.contains("time_to_mesh_us") && r["time_to_mesh_us"].is_number_integer()) {
      time_to_mesh = std::max(time_to_mesh.value_or(0), r["time_to_mesh_us"].get<std::int64_t>());
    } else {
      all_timed = false;
    }
  }
  const std::uint64_t expected = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n - 1) / 2;
  const std::uint64_t expected_messages = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n - 1);
  const std::uint64_t connections = ends.size();
  if (verified != expected_messages)
    errors.push_back(fmt::format("{} of {} messages verified", verified, expected_messages));
  if (pairs.size() != expected)
    errors.push_back(fmt::format("{} of {} pairs connected", pairs.size(), expected));
  if (o.model != "naive" && (connections != expected || duplicates != 0))
    errors.push_back(fmt::format("{} model: {} connections ({} duplicates), expected exactly {}", o.model, connections,
                                 duplicates, expected));

  return json{{"ranks", n},
              {"model", o.model},
              {"transport", o.transport},
              {"bootstrap", o.bootstrap},
              {"message_size", o.size},
              {"connections", connections},
              {"expected_connections", expected},
              {"pairs_connected", pairs.size()},
              {"duplicates", duplicates},
              {"asymmetric_connections", asymmetric},
              {"collisions", sum(reports, "collisions_lost")},
              {"collisions_won", sum(reports, "collisions_won")},
              {"collisions_lost", sum(reports, "collisions_lost")},
              {"rejects", rejects},
              {"time_to_mesh_us", all_timed && time_to_mesh ? json(*time_to_mesh) : json(nullptr)},
              {"messages_verified", verified},
              {"messages_expected", expected_messages},
              {"connects_started", sum(reports, "connects_started")},
              {"connects_refused_by_cm", sum(reports, "connects_refused_by_cm")},
              {"requests_accepted", sum(reports, "requests_accepted")},
              {"connect_failures", sum(reports, "connect_failures")},
              {"ok", errors.empty()},
              {"errors", errors}};
}

void print_summary(const MeshToolOptions& o, const json& s) {
  if (o.json) {
    fmt::print("{}\n", s.dump());
  } else {
    fmt::print("mesh: {} ranks, model {}, {}: {} connections for {} pairs ({} duplicates), {} collisions resolved\n",
               s["ranks"].get<int>(), o.model, o.transport, s["connections"].get<std::uint64_t>(),
               s["expected_connections"].get<std::uint64_t>(), s["duplicates"].get<std::uint64_t>(),
               s["collisions"].get<std::uint64_t>());
    fmt::print("mesh: {} of {} messages verified, time to mesh {} us\n", s["messages_verified"].get<std::uint64_t>(),
               s["messages_expected"].get<std::uint64_t>(),
               s["time_to_mesh_us"].is_null() ? std::string("-") : std::to_string(s["time_to_mesh_us"].get<std::int64_t>()));
    for (const auto& e : s["errors"]) fmt::print("mesh: error: {}\n", e.get<std::string>());
  }
  std::fflush(stdout);
}

// Kills the job when the global deadline passed and the run is still going.
void start_watchdog(Clock::time_point deadline, bool is_root) {
  std::thread([deadline, is_root] {
    std::this_thread::sleep_until(deadline);
    if (g_finished.load()) return;
    if (is_root) {
      for (pid_t pid : g_children) ::kill(pid, SIGKILL);
      std::fputs("peercm mesh: global timeout: killed the ranks\n", stderr);
    } else {
      std::fputs("peercm mesh: global timeout\n", stderr);
    }
    std::fflush(stderr);
    ::_exit(3);
  }).detach();
}

int run_mesh(const MeshToolOptions& options) {
  MeshToolOptions o = options;
  const auto start = Clock::now();
  const auto timeout = std::chrono::duration_cast<milliseconds>(std::chrono::duration<double>(o.timeout));
  const auto deadline = start + timeout;
  const bool file = o.bootstrap == "file";
  std::unique_ptr<mesh::Bootstrap> boot;
  mesh::LocalBootstrap* local = nullptr;  // --bootstrap local: rank 0 owns the children
  if (o.bootstrap == "pmix") {
#ifdef PEERCM_HAVE_PMIX
    std::string why;
    auto created = mesh::PmixBootstrap::create(&why);
    if (!created) throw ToolError(fmt::format("PMIx: {} (not started by a PMIx launcher?)", why));
    o.rank = (*created)->rank();
    o.ranks = (*created)->size();
    boot = std::move(*created);
#else
    throw ToolError("this peercm was built without PMIx");
#endif
  }
  const bool is_root = (file || boot != nullptr) ? o.rank == 0 : o.rank < 0;
  if (boot) {
    // PMIx: done above.
  } else if (file) {
    auto created = mesh::FileBootstrap::create(o.rank, o.ranks, o.bootstrap_dir);
    if (!created)
      throw ToolError(fmt::format("rank {}: bootstrap directory {}: {}", o.rank, o.bootstrap_dir,
                                  created.error() == std::errc::file_exists ? "used by an earlier job (not fresh)"
                                                                            : errc_text(created.error())));
    boot = std::move(*created);
  } else if (is_root) {
    auto spawned = mesh::LocalBootstrap::spawn(o.ranks, "/proc/self/exe", [&](int rank, int fd) {
      std::vector<std::string> args{"peercm", "mesh", "--ranks", std::to_string(o.ranks), "--model", o.model,
                                    "--transport", o.transport, "--bootstrap", o.bootstrap, "--timeout",
                                    fmt::format("{}", o.timeout), "--size", std::to_string(o.size), "--progress",
                                    o.progress, "--rank", std::to_string(rank), "--bootstrap-fd", std::to_string(fd)};
      if (!o.bind.empty()) args.insert(args.end(), {"--bind", o.bind});
      if (!o.crc.empty()) args.insert(args.end(), {"--crc", o.crc});
      if (o.verbose) args.push_back("--verbose");
      if (o.crash_rank >= 0) args.insert(args.end(), {"--crash-rank", std::to_string(o.crash_rank)});
      return args;
    });
    if (!spawned) throw ToolError(fmt::format("cannot start the ranks: {}", errc_text(spawned.error())));
    local = spawned->get();
    boot = std::move(*spawned);
    g_children = local->children();
    std::erase(g_children, 0);
  } else {
    auto attached = mesh::LocalBootstrap::attach(o.rank, o.ranks, o.bootstrap_fd);
    if (!attached) throw ToolError(fmt::format("rank {}: bad bootstrap descriptor", o.rank));
    boot = std::move(*attached);
  }
  // The watchdog fires a little after the deadline the ranks' own waits respect.
  start_watchdog(deadline + milliseconds(is_root ? 1500 : 3000), is_root);

  std::vector<std::vector<std::uint8_t>> table;
  try {
    table = run_rank(*boot, o, deadline);
  } catch (const BootstrapFailure& e) {
    g_finished = true;
    if (!is_root) {
      fmt::print(stderr, "peercm mesh rank {}: {}\n", o.rank, e.what());
      return 1;
    }
    if (local) local->kill_children();
    const json failed{{"ranks", o.ranks}, {"model", o.model}, {"transport", o.transport}, {"ok", false},
                      {"errors", {fmt::format("bootstrap: {}", e.what())}}};
    if (o.json) {
      fmt::print("{}\n", failed.dump());
    } else {
      fmt::print(stderr, "peercm mesh: error: bootstrap: {}\n", e.what());
    }
    return 1;
  }
  if (!is_root) {
    g_finished = true;
    return 0;
  }
  const auto statuses =
      local ? local->wait_children(std::min(milliseconds(5000), left_until(deadline + milliseconds(1000))))
            : std::vector<int>{};
  g_finished = true;
  const json summary = summarize_job(o, table, statuses);
  print_summary(o, summary);
  return summary["ok"].get<bool>() ? 0 : 1;
}

}  // namespace

void add_mesh(CLI::App& app) {
  auto o = std::make_shared<MeshToolOptions>();
  auto* cmd = app.add_subcommand("mesh", "N ranks, all-to-all at once, connections on demand");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--ranks", o->ranks, "Number of ranks (local bootstrap: this process is rank 0)")
      ->check(CLI::Range(1, kMaxRanks));
  cmd->add_option("--model", o->model, "Connection model: p2p (CM resolves collisions), static (lower rank "
                                       "connects), naive (both connect, duplicates kept)")
      ->check(CLI::IsMember({"p2p", "static", "naive"}));
  cmd->add_option("--bootstrap", o->bootstrap,
                  "How ranks find each other: local (rank 0 spawns the others), file (each rank started "
                  "separately with --rank, collectives through files in --bootstrap-dir), pmix (started "
                  "by mpirun/prterun/srun; when built with PMIx)")
      ->check(CLI::IsMember({"local", "file", "pmix"}));
  cmd->add_option("--bootstrap-dir", o->bootstrap_dir,
                  "--bootstrap file: a fresh directory shared by every rank of the job")
      ->type_name("DIR");
  cmd->add_option("--timeout", o->timeout, "Global timeout in seconds (then every rank is killed)")
      ->check(CLI::Range(1.0, 3600.0));
  cmd->add_option("--size", o->size, "Bytes per message")->check(CLI::Range(kMinSize, kMaxSize));
  cmd->add_option("--transport", o->transport,
                  "iwarp (MPA over TCP) or roce (RoCEv2 over UDP 4791)")
      ->check(CLI::IsMember({"iwarp", "roce"}));
  cmd->add_option("--bind", o->bind,
                  "Address the rank listens on (port chosen by the system); local: every rank, which then share "
                  "it. Default: 127.0.0.1 over iwarp, a random 127/8 address per rank over roce")
      ->type_name("ADDR");
  cmd->add_option("--crc", o->crc, "MPA CRC (iwarp): on (required) or off (default: preferred)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--progress", o->progress, "Progress mode")->check(CLI::IsMember({"thread", "inline"}));
  cmd->add_flag("--json", o->json, "Print the summary as JSON");
  cmd->add_flag("-v,--verbose", o->verbose, "Report per-rank errors on stderr as they happen");
  cmd->add_option("--rank", o->rank, "--bootstrap file: this process's rank (0: prints the summary)");
  cmd->add_option("--bootstrap-fd", o->bootstrap_fd, "(internal) bootstrap socket of a spawned process")->group("");
  cmd->add_option("--crash-rank", o->crash_rank, "(testing) this rank exits abruptly after the start barrier")
      ->group("");
  cmd->callback([o] {
    try {
      if (o->bootstrap == "file") {
        if (o->rank < 0 || o->rank >= o->ranks || o->bootstrap_dir.empty() || o->bootstrap_fd >= 0)
          throw CLI::ValidationError("mesh", "--bootstrap file needs --rank 0..N-1 and --bootstrap-dir");
      } else if (o->bootstrap == "pmix") {
        if (o->rank >= 0 || o->bootstrap_fd >= 0 || !o->bootstrap_dir.empty())
          throw CLI::ValidationError("mesh", "--bootstrap pmix takes rank and size from the launcher");
      } else if (!o->bootstrap_dir.empty() ||
                 (o->rank >= 0 && (o->rank == 0 || o->rank >= o->ranks || o->bootstrap_fd < 0))) {
        throw CLI::ValidationError("mesh", "--rank and --bootstrap-fd are for spawned ranks; --bootstrap-dir for file");
      }
      if (o->transport == "roce") {
        if (!o->crc.empty()) throw CLI::ValidationError("mesh", "--crc is MPA's (iwarp only)");
      }
      exit_status = run_mesh(*o);
    } catch (const ToolError& e) {
      fmt::print(stderr, "peercm mesh: error: {}\n", e.what());
      exit_status = 1;
    }
  });
}

}  // namespace peercm::tool
