// peercm::Mesh: N ranks, all-to-all, connections opened on demand (design.md §1, §2 top layer).
//
// A Mesh is one rank of a job. It owns one Context (with its progress thread), one
// EventChannel, one PD, one CQ (send and receive completions of every connection, woken
// through a CompletionChannel), a listening CmId on the rank's own address, and one peer
// record per other rank. Messages to a rank that has no connection yet are queued on its
// peer record and go out, in order, once a connection is established.
//
// Connection models (MeshOptions::model):
//   p2p     PeerToPeer on (design.md §3). A rank connects to a peer the first time it sends
//           to it; when two ranks do so at once the CM turns the two requests into exactly
//           one connection. A connect that the CM refuses with EALREADY/EISCONN (the peer's
//           request is already the connection) is not an error: the Mesh uses that request.
//   static  PeerToPeer off (plain client/server MPA). Symmetry is broken by rank: only the
//           lower rank of a pair ever connects. A higher rank never connects: what it sends
//           to a lower rank waits on the peer record until the lower rank's request arrives.
//           So that all-to-all traffic works no matter who sends first, a rank connects to
//           EVERY higher rank at its first send(), recv(), flush() or connect_all() call
//           ("start of its first send round"); a rank that never calls any of them is never
//           reachable from higher ranks.
//   naive   PeerToPeer off and no symmetry breaking: a rank connects on first send unless it
//           already has a connection (in any state) to that peer. Simultaneous sends give two
//           connections for the pair; both are kept and counted (MeshStats::duplicates). It is
//           the baseline that shows what the p2p model removes.
// Incoming requests are accepted automatically; the connect private data carries the sender's
// rank (and the mesh size and limits, which must match) so that a request is attached to the
// right peer. It is 24 bytes: within what a RoCE p2p REQ leaves the application (36).
//
// Transport (MeshOptions::transport): iwarp (MPA over TCP, the default) or roce (RoCEv2, RC
// over UDP 4791, docs/roce-transport.md); every CmId of the mesh uses it, every model works on
// both. A RoCE node is one IPv4 address (its context binds (address, 4791)), so over RoCE
// every rank needs an address of its own: a rank whose own entry is unset or INADDR_ANY
// takes a random free 127/8 address (loopback: every rank of one host gets its own), which
// listen_address() reports and the bootstrap then publishes. Over iWARP such an entry means
// 127.0.0.1 (unset) or every address (INADDR_ANY), as before.
//
// Data path: Send/Recv. Every connection has recv_depth + 4 receives of 16 + max_message_size
// bytes posted before it connects or accepts. Flow control is by credits: a sender holds
// recv_depth credits per connection, spends one per message, and gets them back piggybacked
// on the peer's messages or, when it has nothing to send, in a credit-only message once half
// of them are owed (the 4 extra receives absorb those). So a Mesh never overruns a peer, for
// any traffic pattern; messages beyond the credits wait on the peer record. send() copies the
// bytes (they are posted inline), so the caller's span may be reused at once.
//
// RDMA Write: expose(id, span) registers a region for remote write; its address/rkey travel to
// each connected peer in a small control message (and to every later connection right after
// its handshake). rdma_write(rank, id, offset, bytes) queues behind earlier sends to that rank
// and goes out once the peer's region `id` is known; it is ordered with the sends around it, so
// a send after a write tells the peer that the write has landed.
//
// Progress and threads: the context's progress thread moves bytes; the Mesh's own state (CM
// events, completions, queues) advances inside its calls (send, recv, flush, progress...). One
// thread at a time may use a Mesh. Blocking calls sleep in poll() on the event channel and
// completion channel fds, and every one of them has a timeout: nothing waits for ever.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <system_error>
#include <vector>

#include "peercm/cm.hpp"
#include "peercm/result.hpp"
#include "peercm/verbs.hpp"

namespace peercm {

enum class MeshModel : std::uint8_t { p2p, static_order, naive };
std::string_view to_string(MeshModel model);  // "p2p", "static", "naive"
std::optional<MeshModel> parse_mesh_model(std::string_view name);

struct MeshOptions {
  MeshModel model = MeshModel::p2p;
  // The wire of every connection (and of the listener). Every rank of a mesh must use the same.
  Transport transport = Transport::iwarp;
  ContextOptions context{};
  // Bounds every connection attempt (CmOption::connect_timeout) and, from a peer's first
  // attempt on, the retries after refused/unreachable attempts: then the peer is failed.
  std::chrono::milliseconds connect_timeout{10000};
  // Largest message (and largest piece of an RDMA Write; bigger writes are split). At most
  // kMeshMaxMessageSize. Every rank of a mesh must use the same value.
  std::uint32_t max_message_size = 64 * 1024;
  // Credits per connection and direction (receives posted per connection: recv_depth + 4).
  // At least 2. Every rank of a mesh must use the same value.
  std::uint32_t recv_depth = 16;
  // CmOption::crc for every id; negative: the library default.
  std::int64_t crc = -1;
  // Every peer listens before this rank learns its address (a job that exchanges listening
  // addresses, as `peercm mesh` does). An attempt that finds nobody listening at a peer's
  // address (REJECTED refused, UNREACHABLE) then means that the peer is gone: it is failed at
  // once (failed()) instead of retried until connect_timeout. Off: such attempts are retried, for
  // peers that may not listen yet.
  bool peers_listen_first = false;
};

inline constexpr std::uint32_t kMeshMaxMessageSize = 1u << 24;

struct MeshMessage {
  int rank = -1;  // the sender
  std::vector<std::uint8_t> bytes;
};

// One established connection as this rank sees it.
struct MeshConnection {
  int rank = -1;           // the peer
  bool initiated = false;  // this rank's connect() ended on it (p2p: even when bound to the peer's request)
  bool active = false;     // the connection this rank sends on to that peer
  sockaddr_in local{};
  sockaddr_in remote{};
  // RoCE: the wire QPNs of the two ends (this rank's QP, the peer's). Several connections
  // between two RoCE nodes share their addresses, so these tell them apart. 0 over iWARP,
  // where local/remote are the TCP 4-tuple.
  std::uint32_t local_qpn = 0;
  std::uint32_t remote_qpn = 0;
};

struct MeshStats {
  std::uint64_t connects_started = 0;        // connect attempts begun (resolve + connect)
  std::uint64_t connects_refused_by_cm = 0;  // connect() failed with EALREADY / EISCONN (p2p rule 5)
  std::uint64_t connect_failures = 0;        // REJECTED / UNREACHABLE / CONNECT_ERROR on an attempt
  std::uint64_t connect_retries = 0;         // attempts begun again after a failure
  std::uint64_t requests_accepted = 0;       // CONNECT_REQUESTs accepted on the listener
  std::uint64_t requests_rejected = 0;       // CONNECT_REQUESTs rejected (malformed / wrong mesh)
  std::uint64_t connections_established = 0;  // ESTABLISHED events
  std::uint64_t duplicates = 0;  // ESTABLISHED for a peer that already had an established connection
  std::uint64_t disconnects = 0;
  std::uint64_t peers_failed = 0;  // peers given up on (connect timeout)
  std::uint64_t rejects_received[8] = {};  // REJECTED events on our attempts, by RejectReason
  std::uint64_t messages_sent = 0;      // application messages posted (not control messages)
  std::uint64_t messages_received = 0;  // application messages received
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t messages_dropped = 0;  // queued for a failed peer, or lost with a connection
  std::uint64_t out_of_order = 0;      // a message whose per-sender sequence number was not the next
  std::uint64_t control_sent = 0;      // hello, region and credit-only messages
  std::uint64_t rdma_writes = 0;       // RDMA Write work requests posted
  std::uint64_t write_errors = 0;      // writes dropped: region too small, or failed completion
  std::uint64_t completion_errors = 0;  // completions with an error other than a flush
  CmStats cm{};                         // cm_stats() of the mesh's context
};

class Mesh {
 public:
  // `addresses[r]` is rank r's listening address. This rank's entry may have port 0 (an
  // ephemeral port is chosen: see listen_address()); other entries may be left empty (port 0)
  // and filled in with set_addresses() before any traffic, once a bootstrap has exchanged them.
  static Result<std::unique_ptr<Mesh>, std::errc> create(int rank, std::vector<sockaddr_in> addresses,
                                                         const MeshOptions& options = {});
  ~Mesh();  // aborts every connection
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const;
  int size() const;
  MeshModel model() const;
  Transport transport() const;
  sockaddr_in listen_address() const;
  // Replaces the address table (same size; this rank's entry is ignored).
  Status<std::errc> set_addresses(std::span<const sockaddr_in> addresses);

  // Queues `bytes` for `rank` (opens the connection on first use). EINVAL: bad rank;
  // EMSGSIZE: bigger than max_message_size; the peer's failure (ETIMEDOUT, ECONNREFUSED...)
  // once it has been given up on. Sending to oneself delivers locally.
  Status<std::errc> send(int rank, std::span<const std::uint8_t> bytes);
  // The next message from any rank, or nullopt after `timeout`.
  std::optional<MeshMessage> recv(std::chrono::milliseconds timeout);

  // Registers `memory` (which must outlive the Mesh) for remote writes as region `region_id`
  // and announces it to the peers. EEXIST when the id is taken.
  Status<std::errc> expose(int region_id, std::span<std::uint8_t> memory);
  // Queues an RDMA Write of `bytes` at `offset` of `rank`'s region `region_id`. EINVAL when
  // the region is known and too small (a region learnt later and too small drops the write
  // and counts it in write_errors).
  Status<std::errc> rdma_write(int rank, int region_id, std::uint64_t offset, std::span<const std::uint8_t> bytes);

  // Opens connections now: p2p/naive to every peer without one, static to every higher rank.
  void connect_all();
  // Runs pending CM events and completions; waits up to `timeout` for something to happen.
  void progress(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // Waits until every queued message and write has been posted and completed locally.
  // ETIMEDOUT otherwise (also when a peer is unreachable or, in static mode, never connects).
  Status<std::errc> flush(std::chrono::milliseconds timeout);
  // Waits until no connection is being resolved, connected or accepted. ETIMEDOUT otherwise.
  Status<std::errc> settle(std::chrono::milliseconds timeout);
  // Waits until `rank` has an established connection.
  Status<std::errc> wait_connected(int rank, std::chrono::milliseconds timeout);

  bool connected(int rank) const;
  // Why `rank` was given up on (no connection within connect_timeout, or gone: see
  // MeshOptions::peers_listen_first); nothing while it is not.
  std::optional<std::errc> failed(int rank) const;
  std::vector<MeshConnection> connections() const;
  MeshStats stats() const;
  Context& context();

 private:
  struct Impl;
  explicit Mesh(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace peercm
