// peercm::Mesh (see include/peercm/mesh.hpp for the model, flow control and limits).
#include "peercm/mesh.hpp"

#include <arpa/inet.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <unordered_map>

#include "mesh/mesh_wire.hpp"

namespace peercm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
namespace wire = mesh_wire;

constexpr std::uint32_t kExtraRecvs = 4;     // receives beyond the credits: credit-only messages
constexpr std::uint32_t kSendWr = 64;        // send queue depth per connection
constexpr std::uint32_t kCreditReserve = 2;  // send WRs kept free for credit-only messages
constexpr milliseconds kRefusedByCmPause{20};  // after EALREADY/EISCONN: let the request's events arrive
constexpr milliseconds kMaxBackoff{500};
constexpr int kRoceAddressAttempts = 32;  // random 127/8 addresses tried for a RoCE rank

enum class WrKind : std::uint8_t { recv = 1, message = 2, control = 3, write = 4 };

std::uint64_t make_wr_id(std::uint32_t serial, WrKind kind, std::uint32_t slot) {
  return (std::uint64_t{serial} << 32) | (std::uint64_t{static_cast<std::uint8_t>(kind)} << 24) |
         (slot & 0xFFFFFFu);
}

std::uint64_t address_of(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

milliseconds backoff(unsigned failures) {
  const auto shift = std::min(failures, 5u);
  return std::min(milliseconds(25 << shift), kMaxBackoff);
}

}  // namespace

std::string_view to_string(MeshModel model) {
  switch (model) {
    case MeshModel::p2p: return "p2p";
    case MeshModel::static_order: return "static";
    case MeshModel::naive: return "naive";
  }
  return "?";
}

std::optional<MeshModel> parse_mesh_model(std::string_view name) {
  if (name == "p2p") return MeshModel::p2p;
  if (name == "static") return MeshModel::static_order;
  if (name == "naive") return MeshModel::naive;
  return std::nullopt;
}

struct Mesh::Impl {
  // One operation queued for a peer: a message (header space in front of the payload, the
  // header is written at post time), or a piece of an RDMA Write.
  struct Op {
    wire::Type type = wire::Type::data;
    bool write = false;
    std::uint32_t sequence = 0;
    int region_id = 0;
    std::uint64_t offset = 0;
    std::vector<std::uint8_t> bytes;
  };

  struct Conn {
    enum class State : std::uint8_t { resolving_addr, resolving_route, connecting, accepting, established };
    // Declaration order is destruction order reversed: the CmId (and its QP) goes first,
    // then the registration, then the memory the QP received into.
    std::unique_ptr<std::uint8_t[]> slab;
    std::unique_ptr<MemoryRegion> mr;
    std::unique_ptr<CmId> id;
    QueuePair* qp = nullptr;
    std::uint32_t serial = 0;
    int rank = -1;
    bool initiated = false;
    State state = State::resolving_addr;
    std::uint32_t credits = 0;      // messages we may still send on it
    std::uint32_t to_return = 0;    // credits we owe the peer
    std::uint32_t outstanding = 0;  // send WRs posted, not completed
    sockaddr_in local{};
    sockaddr_in remote{};
    std::uint32_t local_qpn = 0;   // RoCE wire QPNs
    std::uint32_t remote_qpn = 0;
  };

  struct RemoteRegion {
    std::uint64_t address = 0;
    std::uint64_t length = 0;
    std::uint32_t rkey = 0;
  };

  struct LocalRegion {
    std::span<std::uint8_t> memory;
    std::unique_ptr<MemoryRegion> mr;
  };

  struct Peer {
    int rank = -1;
    std::vector<std::unique_ptr<Conn>> conns;
    Conn* active = nullptr;  // the connection we send on
    std::deque<Op> queue;
    bool wanted = false;  // connect_all() / wait_connected() asked for a connection
    std::optional<Clock::time_point> first_attempt;  // of the current effort to connect
    std::optional<Clock::time_point> retry_at;
    unsigned failures = 0;
    std::optional<std::errc> failed;
    std::map<int, RemoteRegion> regions;
    std::uint32_t send_sequence = 0;
    std::uint32_t recv_sequence = 0;
  };

  int rank = 0;
  int size = 0;
  MeshOptions options;
  std::size_t slot_size = 0;
  std::uint32_t recv_slots = 0;
  std::uint32_t credit_threshold = 1;
  std::vector<sockaddr_in> addresses;

  std::unique_ptr<Context> context;
  std::unique_ptr<EventChannel> channel;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionChannel> completion_channel;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<CmId> listener;
  std::map<int, LocalRegion> regions;
  std::vector<Peer> peers;

  std::unordered_map<const CmId*, Conn*> by_id;
  std::unordered_map<std::uint32_t, Conn*> by_serial;
  std::uint32_t next_serial = 0;
  std::deque<CmEvent> backlog;  // events taken off the channel by purge_stale_events()
  std::deque<MeshMessage> inbox;
  MeshStats stats;
  bool static_round_started = false;

  ~Impl() {
    // Connections first (they reference the CQ, the PD and the regions), the context last.
    peers.clear();
    listener.reset();
    backlog.clear();
    regions.clear();
    cq.reset();
    completion_channel.reset();
    pd.reset();
    channel.reset();
    context.reset();
  }

  // ------------------------------------------------------------------ helpers

  bool may_connect(int peer) const { return options.model != MeshModel::static_order || rank < peer; }

  static bool live(const Peer& p) { return !p.conns.empty(); }

  bool needs_connection(const Peer& p) const { return !p.failed && (p.wanted || !p.queue.empty()); }

  std::vector<std::uint8_t> hello_private_data() const {
    return wire::encode_hello(wire::Hello{.model = static_cast<std::uint8_t>(options.model),
                                          .rank = static_cast<std::uint32_t>(rank),
                                          .size = static_cast<std::uint32_t>(size),
                                          .max_message_size = options.max_message_size,
                                          .recv_depth = options.recv_depth});
  }

  Status<std::errc> configure(CmId& id) const {
    if (auto ok = id.set_option(CmOption::peer_to_peer, options.model == MeshModel::p2p ? 1 : 0); !ok) return ok;
    if (auto ok = id.set_option(CmOption::connect_timeout, std::max<std::int64_t>(1, options.connect_timeout.count()));
        !ok)
      return ok;
    if (options.crc >= 0) {
      if (auto ok = id.set_option(CmOption::crc, options.crc); !ok) return ok;
    }
    return {};
  }

  Conn& add_conn(Peer& p, std::unique_ptr<CmId> id, bool initiated, Conn::State state) {
    auto conn = std::make_unique<Conn>();
    conn->serial = ++next_serial;
    conn->rank = p.rank;
    conn->initiated = initiated;
    conn->state = state;
    conn->id = std::move(id);
    Conn& c = *conn;
    by_id[c.id.get()] = &c;
    by_serial[c.serial] = &c;
    p.conns.push_back(std::move(conn));
    return c;
  }

  // Destroys a connection (its CmId aborts the TCP connection) and forgets it. Events already
  // queued for its CmId are dropped, so that a CmId created later at the same address is never
  // mistaken for it.
  void destroy_conn(Conn& c) {
    Peer& p = peers[static_cast<std::size_t>(c.rank)];
    const CmId* raw = c.id.get();
    by_id.erase(raw);
    by_serial.erase(c.serial);
    if (p.active == &c) p.active = nullptr;
    auto it = std::find_if(p.conns.begin(), p.conns.end(), [&](const auto& owned) { return owned.get() == &c; });
    if (it != p.conns.end()) {
      std::unique_ptr<Conn> doomed = std::move(*it);
      p.conns.erase(it);
      doomed.reset();
    }
    purge_stale_events(raw);
  }

  void purge_stale_events(const CmId* raw) {
    for (;;) {
      auto event = channel->get_event(milliseconds(0));
      if (!event) break;
      backlog.push_back(std::move(*event));
    }
    bool reused = false;  // a new CmId at the same address: its events are not stale
    for (auto it = backlog.begin(); it != backlog.end();) {
      if (it->new_id && it->new_id.get() == raw) reused = true;
      if (!reused && !it->new_id && it->id == raw) {
        it = backlog.erase(it);
      } else {
        ++it;
      }
    }
  }

  void fail_peer(Peer& p, std::errc error) {
    p.failed = error;
    ++stats.peers_failed;
    for (const Op& op : p.queue)
      if (!op.write && op.type == wire::Type::data) ++stats.messages_dropped;
    p.queue.clear();
    p.wanted = false;
  }

  // ------------------------------------------------------------------ connection setup

  bool setup_qp(Conn& c) {
    QpInitAttr attr;
    attr.send_cq = cq.get();
    attr.recv_cq = cq.get();
    attr.caps.max_send_wr = kSendWr;
    attr.caps.max_recv_wr = recv_slots;
    attr.caps.max_send_sge = 1;
    attr.caps.max_recv_sge = 1;
    attr.caps.max_inline_data = static_cast<std::uint32_t>(slot_size);
    attr.sq_sig_all = true;
    auto qp = c.id->create_qp(*pd, attr);
    if (!qp) return false;
    c.qp = *qp;
    // Uninitialised: pages are committed only as messages arrive into them.
    c.slab = std::make_unique_for_overwrite<std::uint8_t[]>(slot_size * recv_slots);
    auto mr = MemoryRegion::register_memory(*pd, c.slab.get(), slot_size * recv_slots, kAccessLocalWrite);
    if (!mr) return false;
    c.mr = std::move(*mr);
    for (std::uint32_t slot = 0; slot < recv_slots; ++slot)
      if (!post_recv(c, slot)) return false;
    c.credits = options.recv_depth;
    return true;
  }

  bool post_recv(Conn& c, std::uint32_t slot) {
    RecvWr wr;
    wr.wr_id = make_wr_id(c.serial, WrKind::recv, slot);
    wr.sg_list.push_back(c.mr->sge(slot * slot_size, slot_size));
    return c.qp->post_recv(wr).has_value();
  }

  void start_connect(Peer& p) {
    const auto now = Clock::now();
    if (!p.first_attempt) p.first_attempt = now;
    auto id = CmId::create(*context, *channel, nullptr, options.transport);
    if (!id || !configure(**id) || !(*id)->bind(addresses[static_cast<std::size_t>(rank)])) {
      attempt_failed(p);
      return;
    }
    ++stats.connects_started;
    if (p.failures > 0) ++stats.connect_retries;
    Conn& c = add_conn(p, std::move(*id), true, Conn::State::resolving_addr);
    if (!c.id->resolve_addr(addresses[static_cast<std::size_t>(p.rank)], options.connect_timeout)) {
      destroy_conn(c);
      attempt_failed(p);
    }
  }

  void attempt_failed(Peer& p) {
    ++stats.connect_failures;
    ++p.failures;
    p.retry_at = Clock::now() + backoff(p.failures);
  }

  void ensure_connection(Peer& p) {
    if (!needs_connection(p) || live(p) || !may_connect(p.rank)) return;
    if (addresses[static_cast<std::size_t>(p.rank)].sin_port == 0) return;  // not known yet
    const auto now = Clock::now();
    if (p.retry_at && now < *p.retry_at) return;
    if (p.first_attempt && now - *p.first_attempt >= options.connect_timeout) {
      fail_peer(p, p.failures > 0 ? std::errc::timed_out : std::errc::connection_refused);
      return;
    }
    start_connect(p);
  }

  void on_route_resolved(Conn& c) {
    Peer& p = peers[static_cast<std::size_t>(c.rank)];
    if (!setup_qp(c)) {
      destroy_conn(c);
      attempt_failed(p);
      return;
    }
    ConnParam param;
    param.private_data = hello_private_data();
    auto connected = c.id->connect(param);
    if (!connected) {
      const std::errc error = connected.error();
      destroy_conn(c);
      if (error == std::errc::connection_already_in_progress || error == std::errc::already_connected) {
        // design.md §3 rule 5: the peer's request is (or is becoming) the connection; its
        // CONNECT_REQUEST / ESTABLISHED is on its way to us.
        ++stats.connects_refused_by_cm;
        p.retry_at = Clock::now() + kRefusedByCmPause;
      } else {
        attempt_failed(p);
      }
      return;
    }
    c.state = Conn::State::connecting;
  }

  void on_request(CmEvent& event) {
    std::unique_ptr<CmId> id = std::move(event.new_id);
    if (!id) return;
    const auto hello = wire::decode_hello(event.param.private_data);
    const bool valid = hello && hello->rank < static_cast<std::uint32_t>(size) &&
                       hello->rank != static_cast<std::uint32_t>(rank) &&
                       hello->size == static_cast<std::uint32_t>(size) &&
                       hello->max_message_size == options.max_message_size && hello->recv_depth == options.recv_depth;
    if (!valid) {
      [[maybe_unused]] auto rejected = id->reject();
      ++stats.requests_rejected;
      return;
    }
    Peer& p = peers[hello->rank];
    Conn& c = add_conn(p, std::move(id), false, Conn::State::accepting);
    ConnParam param;
    param.private_data = hello_private_data();
    if (!setup_qp(c) || !c.id->accept(param)) {
      destroy_conn(c);
      return;
    }
    ++stats.requests_accepted;
    // The peer is alive: whatever we concluded from our own attempts no longer holds.
    p.failed.reset();
    p.failures = 0;
    p.first_attempt.reset();
    p.retry_at.reset();
  }

  void on_established(Conn& c, const ConnParam& param) {
    Peer& p = peers[static_cast<std::size_t>(c.rank)];
    c.state = Conn::State::established;
    c.local = c.id->local_address();
    c.remote = c.id->peer_address();
    if (options.transport == Transport::roce) {
      c.local_qpn = c.qp->qp_num();  // the wire QPN (docs/roce-transport.md, "QPNs")
      c.remote_qpn = param.qp_num;
    }
    ++stats.connections_established;
    for (const auto& other : p.conns)
      if (other.get() != &c && other->state == Conn::State::established) {
        ++stats.duplicates;
        break;
      }
    p.failed.reset();
    p.failures = 0;
    p.first_attempt.reset();
    p.retry_at.reset();
    // Both sides speak first on every connection: this releases the hold of an MPA responder
    // in client/server mode, which may not send before the initiator's first FPDU.
    post_control(c, wire::Type::hello, {});
    if (!p.active) make_active(p, c);
    drain(p);
  }

  void make_active(Peer& p, Conn& c) {
    p.active = &c;
    // The peer learns our regions on the connection it will hear the rest from.
    for (auto it = regions.rbegin(); it != regions.rend(); ++it) p.queue.push_front(region_op(it->first, it->second));
  }

  void on_connection_ended(Conn& c) {
    Peer& p = peers[static_cast<std::size_t>(c.rank)];
    const bool was_attempt = c.state != Conn::State::established && c.initiated;
    const bool was_active = p.active == &c;
    if (c.state == Conn::State::established) ++stats.disconnects;
    destroy_conn(c);
    if (was_attempt) attempt_failed(p);
    if (was_active) {
      for (const auto& other : p.conns)
        if (other->state == Conn::State::established) {
          make_active(p, *other);
          break;
        }
    }
  }

  // MeshOptions::peers_listen_first: our attempt found nobody listening at the peer's address,
  // where the peer listened before we learnt it: the peer is gone, and retrying cannot help.
  bool peer_gone(Conn& c, std::errc error) {
    if (!options.peers_listen_first || !c.initiated || c.state == Conn::State::established) return false;
    Peer& p = peers[static_cast<std::size_t>(c.rank)];
    on_connection_ended(c);
    fail_peer(p, error);
    return true;
  }

  // ------------------------------------------------------------------ events

  void handle_event(CmEvent& event) {
    if (event.type == CmEventType::connect_request) {
      on_request(event);
      return;
    }
    auto found = by_id.find(event.id);
    if (found == by_id.end()) return;
    Conn& c = *found->second;
    switch (event.type) {
      case CmEventType::addr_resolved:
        if (c.state != Conn::State::resolving_addr) return;
        c.state = Conn::State::resolving_route;
        if (!c.id->resolve_route(options.connect_timeout)) on_connection_ended(c);
        return;
      case CmEventType::route_resolved:
        if (c.state == Conn::State::resolving_route) on_route_resolved(c);
        return;
      case CmEventType::established:
        if (c.state != Conn::State::established) on_established(c, event.param);
        return;
      case CmEventType::rejected:
        ++stats.rejects_received[static_cast<std::size_t>(event.reject_reason) & 7u];
        if (event.reject_reason == RejectReason::refused && peer_gone(c, std::errc::connection_refused)) return;
        on_connection_ended(c);
        return;
      case CmEventType::unreachable:
        if (peer_gone(c, std::errc::host_unreachable)) return;
        on_connection_ended(c);
        return;
      case CmEventType::connect_error:
        if (event.status == EISCONN && c.initiated && c.state != Conn::State::established) {
          // docs/p2p.md R5b: over RoCE the key's connection was checked and answered: the
          // connect's EISCONN, reported late. The connection we have is the one we want.
          destroy_conn(c);
          ++stats.connects_refused_by_cm;
          return;
        }
        on_connection_ended(c);
        return;
      case CmEventType::addr_error:
      case CmEventType::route_error:
      case CmEventType::disconnected:
        on_connection_ended(c);
        return;
      case CmEventType::connect_request:
      case CmEventType::connect_response:
      case CmEventType::timewait_exit:
        return;
    }
  }

  bool process_events() {
    bool any = false;
    for (;;) {
      CmEvent event;
      if (!backlog.empty()) {
        event = std::move(backlog.front());
        backlog.pop_front();
      } else {
        auto next = channel->get_event(milliseconds(0));
        if (!next) break;
        event = std::move(*next);
      }
      any = true;
      handle_event(event);
    }
    return any;
  }

  // ------------------------------------------------------------------ data path

  Op region_op(int id, const LocalRegion& region) const {
    Op op;
    op.type = wire::Type::region;
    op.bytes.resize(wire::kHeaderSize + wire::kRegionSize);
    wire::encode_region(wire::Region{.id = static_cast<std::uint32_t>(id),
                                     .rkey = region.mr->rkey(),
                                     .address = address_of(region.memory.data()),
                                     .length = region.memory.size()},
                        std::span(op.bytes).subspan(wire::kHeaderSize));
    return op;
  }

  std::uint16_t take_credits_to_return(Conn& c) {
    const auto n = static_cast<std::uint16_t>(std::min<std::uint32_t>(c.to_return, 0xFFFF));
    c.to_return -= n;
    return n;
  }

  Status<std::errc> post_inline(Conn& c, WrKind kind, std::span<const std::uint8_t> bytes, WrOpcode opcode,
                                std::uint64_t remote_addr = 0, std::uint32_t rkey = 0) {
    SendWr wr;
    wr.wr_id = make_wr_id(c.serial, kind, 0);
    wr.opcode = opcode;
    wr.flags = kSendInline;
    wr.sg_list.push_back(Sge{.addr = address_of(bytes.data()), .length = static_cast<std::uint32_t>(bytes.size())});
    wr.remote_addr = remote_addr;
    wr.rkey = rkey;
    auto posted = c.qp->post_send(wr);
    if (posted) ++c.outstanding;
    return posted;
  }

  // hello and credit messages go out at once, outside the peer's queue.
  void post_control(Conn& c, wire::Type type, std::span<const std::uint8_t> payload) {
    if (type != wire::Type::credit) {
      if (c.credits == 0) return;
    }
    std::vector<std::uint8_t> bytes(wire::kHeaderSize + payload.size());
    const std::uint16_t returned = take_credits_to_return(c);
    wire::encode_header(wire::Header{.type = type, .credits = returned, .rank = static_cast<std::uint32_t>(rank)},
                        bytes);
    std::copy(payload.begin(), payload.end(), bytes.begin() + wire::kHeaderSize);
    if (post_inline(c, WrKind::control, bytes, WrOpcode::send)) {
      if (type != wire::Type::credit) --c.credits;
      ++stats.control_sent;
    } else {
      c.to_return += returned;
    }
  }

  void maybe_return_credits(Conn& c) {
    if (c.state == Conn::State::established && c.to_return >= credit_threshold && c.outstanding < kSendWr)
      post_control(c, wire::Type::credit, {});
  }

  // Posts what the peer's queue holds, in order, as far as credits, send queue space and
  // region knowledge allow.
  void drain(Peer& p) {
    Conn* c = p.active;
    if (!c || c->state != Conn::State::established) return;
    while (!p.queue.empty() && c->outstanding < kSendWr - kCreditReserve) {
      Op& op = p.queue.front();
      if (op.write) {
        auto region = p.regions.find(op.region_id);
        if (region == p.regions.end()) break;  // its announcement has not arrived yet
        if (op.offset > region->second.length || op.bytes.size() > region->second.length - op.offset) {
          ++stats.write_errors;
          p.queue.pop_front();
          continue;
        }
        if (!post_inline(*c, WrKind::write, op.bytes, WrOpcode::rdma_write, region->second.address + op.offset,
                         region->second.rkey))
          break;
        ++stats.rdma_writes;
      } else {
        if (c->credits == 0) break;
        const std::uint16_t returned = take_credits_to_return(*c);
        if (!wire::encode_header(wire::Header{.type = op.type,
                                              .credits = returned,
                                              .rank = static_cast<std::uint32_t>(rank),
                                              .sequence = op.sequence},
                                 op.bytes)) {
          c->to_return += returned;
          p.queue.pop_front();  // cannot happen: every message op has room for its header
          continue;
        }
        if (!post_inline(*c, op.type == wire::Type::data ? WrKind::message : WrKind::control, op.bytes,
                         WrOpcode::send)) {
          c->to_return += returned;
          break;
        }
        --c->credits;
        if (op.type == wire::Type::data) {
          ++stats.messages_sent;
          stats.bytes_sent += op.bytes.size() - wire::kHeaderSize;
        } else {
          ++stats.control_sent;
        }
      }
      p.queue.pop_front();
    }
    maybe_return_credits(*c);
  }

  void on_receive(Conn& c, std::uint32_t slot, std::uint32_t length) {
    Peer& p = peers[static_cast<std::size_t>(c.rank)];
    const std::uint8_t* buffer = c.slab.get() + slot * slot_size;
    const std::span<const std::uint8_t> bytes(buffer, std::min<std::size_t>(length, slot_size));
    const auto header = wire::decode_header(bytes);
    bool counts = true;  // took one of the credits we gave
    if (header) {
      c.credits += header->credits;
      switch (header->type) {
        case wire::Type::hello:
          break;
        case wire::Type::data: {
          if (header->sequence != p.recv_sequence + 1) ++stats.out_of_order;
          p.recv_sequence = header->sequence;
          MeshMessage message;
          message.rank = c.rank;
          message.bytes.assign(bytes.begin() + wire::kHeaderSize, bytes.end());
          ++stats.messages_received;
          stats.bytes_received += message.bytes.size();
          inbox.push_back(std::move(message));
          break;
        }
        case wire::Type::region:
          if (auto region = wire::decode_region(bytes.subspan(wire::kHeaderSize)))
            p.regions[static_cast<int>(region->id)] = RemoteRegion{region->address, region->length, region->rkey};
          break;
        case wire::Type::credit:
          counts = false;
          break;
      }
    }
    if (!post_recv(c, slot)) return;  // the QP is going down
    if (counts) ++c.to_return;
  }

  void handle_completion(const WorkCompletion& wc) {
    const auto serial = static_cast<std::uint32_t>(wc.wr_id >> 32);
    const auto kind = static_cast<WrKind>((wc.wr_id >> 24) & 0xFF);
    const auto slot = static_cast<std::uint32_t>(wc.wr_id & 0xFFFFFF);
    auto found = by_serial.find(serial);
    if (found == by_serial.end()) return;  // a connection already gone
    Conn& c = *found->second;
    if (kind == WrKind::recv) {
      if (wc.status == WcStatus::success) {
        on_receive(c, slot, wc.byte_len);
      } else if (wc.status != WcStatus::wr_flush_error) {
        ++stats.completion_errors;
      }
      return;
    }
    if (c.outstanding > 0) --c.outstanding;
    if (wc.status != WcStatus::success && wc.status != WcStatus::wr_flush_error) {
      ++stats.completion_errors;
      if (kind == WrKind::write) ++stats.write_errors;
    }
    if (wc.status == WcStatus::wr_flush_error && kind == WrKind::message) ++stats.messages_dropped;
  }

  bool process_completions() {
    bool any = false;
    WorkCompletion batch[64];
    for (;;) {
      const std::size_t n = cq->poll(batch);
      if (n == 0) break;
      any = true;
      for (std::size_t i = 0; i < n; ++i) handle_completion(batch[i]);
    }
    return any;
  }

  // ------------------------------------------------------------------ progress

  // Everything that can be done without waiting.
  bool pump() {
    bool any = false;
    for (int round = 0; round < 2; ++round) {
      any = process_events() | any;
      any = process_completions() | any;
      for (Peer& p : peers) {
        if (p.rank == rank) continue;
        ensure_connection(p);
        drain(p);
        for (auto& c : p.conns) maybe_return_credits(*c);
      }
    }
    return any;
  }

  std::optional<Clock::time_point> next_timer() const {
    std::optional<Clock::time_point> next;
    for (const Peer& p : peers)
      if (p.retry_at && needs_connection(p) && !live(p) && (!next || *p.retry_at < *next)) next = p.retry_at;
    return next;
  }

  // Sleeps until a CM event or a completion may be there, a retry is due, or `deadline`.
  void sleep_until(Clock::time_point deadline) {
    auto until = deadline;
    if (auto timer = next_timer(); timer && *timer < until) until = *timer;
    const auto now = Clock::now();
    if (until <= now) return;
    const auto wait = std::chrono::ceil<milliseconds>(until - now);
    if (context->progress_mode() == ProgressMode::inline_) {
      context->progress(std::min(wait, milliseconds(10)));
      return;
    }
    [[maybe_unused]] auto armed = cq->request_notify();
    if (process_completions()) return;  // arrived before the arming: no notification for them
    pollfd fds[2] = {{channel->fd(), POLLIN, 0}, {completion_channel->fd(), POLLIN, 0}};
    ::poll(fds, 2, static_cast<int>(std::min<std::int64_t>(wait.count(), 1000)));
    for (;;) {
      auto woken = completion_channel->get_event(milliseconds(0));
      if (!woken) break;
      completion_channel->ack_events(**woken, 1);
    }
  }

  template <class Pred>
  bool wait_until(Pred&& done, Clock::time_point deadline) {
    for (;;) {
      pump();
      if (done()) return true;
      if (Clock::now() >= deadline) return false;
      sleep_until(deadline);
    }
  }

  void start_static_round() {
    if (options.model != MeshModel::static_order || static_round_started) return;
    static_round_started = true;
    connect_all();
  }

  void connect_all() {
    for (Peer& p : peers)
      if (p.rank != rank && may_connect(p.rank)) p.wanted = true;
  }

  bool all_flushed() const {
    for (const Peer& p : peers) {
      if (!p.queue.empty()) return false;
      for (const auto& c : p.conns)
        if (c->outstanding > 0) return false;
    }
    return true;
  }

  bool all_settled() const {
    for (const Peer& p : peers)
      for (const auto& c : p.conns)
        if (c->state != Conn::State::established) return false;
    return true;
  }
};

// ------------------------------------------------------------------ Mesh

Mesh::Mesh(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Mesh::~Mesh() = default;

Result<std::unique_ptr<Mesh>, std::errc> Mesh::create(int rank, std::vector<sockaddr_in> addresses,
                                                      const MeshOptions& options) {
  if (addresses.empty() || rank < 0 || static_cast<std::size_t>(rank) >= addresses.size() ||
      addresses.size() > 0xFFFFFF)
    return fail(std::errc::invalid_argument);
  if (options.max_message_size == 0 || options.max_message_size > kMeshMaxMessageSize || options.recv_depth < 2 ||
      options.recv_depth > 4096 || options.connect_timeout.count() <= 0)
    return fail(std::errc::invalid_argument);
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->size = static_cast<int>(addresses.size());
  impl->options = options;
  impl->slot_size = mesh_wire::kHeaderSize + options.max_message_size;
  impl->recv_slots = options.recv_depth + kExtraRecvs;
  impl->credit_threshold = (options.recv_depth + 1) / 2;
  impl->addresses = std::move(addresses);

  auto context = Context::open(options.context);
  if (!context) return fail(context.error());
  impl->context = std::move(*context);
  auto channel = EventChannel::create();
  if (!channel) return fail(channel.error());
  impl->channel = std::move(*channel);
  auto pd = ProtectionDomain::allocate(*impl->context);
  if (!pd) return fail(pd.error());
  impl->pd = std::move(*pd);
  auto completion_channel = CompletionChannel::create(*impl->context);
  if (!completion_channel) return fail(completion_channel.error());
  impl->completion_channel = std::move(*completion_channel);
  // Room for every completion of two connections per peer (naive mode), so that the CQ never
  // overruns whatever the traffic.
  const std::uint64_t per_conn = kSendWr + impl->recv_slots;
  const std::uint64_t capacity =
      std::clamp<std::uint64_t>(2 * per_conn * static_cast<std::uint64_t>(impl->size), 256, 1u << 22);
  auto cq = CompletionQueue::create(*impl->context, static_cast<std::uint32_t>(capacity),
                                    impl->completion_channel.get());
  if (!cq) return fail(cq.error());
  impl->cq = std::move(*cq);

  auto& self = impl->addresses[static_cast<std::size_t>(rank)];
  const bool unset = self.sin_family != AF_INET;
  // RoCE: a rank is one address; without one of its own it takes a random free 127/8 one
  // (one whose (address, 4791) another context already holds fails to listen: try another).
  const bool pick_loopback =
      options.transport == Transport::roce && (unset || self.sin_addr.s_addr == htonl(INADDR_ANY));
  if (unset) {
    self.sin_family = AF_INET;
    self.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  std::random_device random;
  for (int attempt = 0;; ++attempt) {
    sockaddr_in address = self;
    if (pick_loopback) {
      std::uint32_t host = 0;
      do {
        host = (127u << 24) | (random() & 0xFFFFFFu);
      } while ((host & 0xFF) == 0 || (host & 0xFF) == 0xFF);
      address.sin_addr.s_addr = htonl(host);
    }
    auto listener = CmId::create(*impl->context, *impl->channel, nullptr, options.transport);
    if (!listener) return fail(listener.error());
    impl->listener = std::move(*listener);
    if (auto ok = impl->configure(*impl->listener); !ok) return fail(ok.error());
    if (auto ok = impl->listener->bind(address); !ok) return fail(ok.error());
    auto listening = impl->listener->listen(std::max(128, 2 * impl->size));
    if (listening) break;
    impl->listener.reset();
    if (!pick_loopback || listening.error() != std::errc::address_in_use || attempt + 1 >= kRoceAddressAttempts)
      return fail(listening.error());
  }
  self = impl->listener->local_address();

  impl->peers = std::vector<Impl::Peer>(impl->addresses.size());
  for (std::size_t r = 0; r < impl->peers.size(); ++r) impl->peers[r].rank = static_cast<int>(r);
  return std::unique_ptr<Mesh>(new Mesh(std::move(impl)));
}

int Mesh::rank() const { return impl_->rank; }
int Mesh::size() const { return impl_->size; }
MeshModel Mesh::model() const { return impl_->options.model; }
Transport Mesh::transport() const { return impl_->options.transport; }
sockaddr_in Mesh::listen_address() const { return impl_->addresses[static_cast<std::size_t>(impl_->rank)]; }
Context& Mesh::context() { return *impl_->context; }

Status<std::errc> Mesh::set_addresses(std::span<const sockaddr_in> addresses) {
  if (addresses.size() != impl_->addresses.size()) return fail(std::errc::invalid_argument);
  for (std::size_t r = 0; r < addresses.size(); ++r)
    if (static_cast<int>(r) != impl_->rank) impl_->addresses[r] = addresses[r];
  impl_->pump();
  return {};
}

Status<std::errc> Mesh::send(int rank, std::span<const std::uint8_t> bytes) {
  auto& m = *impl_;
  if (rank < 0 || rank >= m.size) return fail(std::errc::invalid_argument);
  if (bytes.size() > m.options.max_message_size) return fail(std::errc::message_size);
  m.start_static_round();
  if (rank == m.rank) {
    m.inbox.push_back(MeshMessage{rank, std::vector<std::uint8_t>(bytes.begin(), bytes.end())});
    ++m.stats.messages_sent;
    ++m.stats.messages_received;
    return {};
  }
  auto& p = m.peers[static_cast<std::size_t>(rank)];
  if (p.failed) return fail(*p.failed);
  Impl::Op op;
  op.type = mesh_wire::Type::data;
  op.sequence = ++p.send_sequence;
  op.bytes.resize(mesh_wire::kHeaderSize + bytes.size());
  std::copy(bytes.begin(), bytes.end(), op.bytes.begin() + mesh_wire::kHeaderSize);
  p.queue.push_back(std::move(op));
  m.pump();
  return {};
}

std::optional<MeshMessage> Mesh::recv(std::chrono::milliseconds timeout) {
  auto& m = *impl_;
  m.start_static_round();
  if (!m.wait_until([&] { return !m.inbox.empty(); }, Clock::now() + std::max(timeout, milliseconds(0))))
    return std::nullopt;
  MeshMessage message = std::move(m.inbox.front());
  m.inbox.pop_front();
  return message;
}

Status<std::errc> Mesh::expose(int region_id, std::span<std::uint8_t> memory) {
  auto& m = *impl_;
  if (m.regions.contains(region_id)) return fail(std::errc::file_exists);
  auto mr = MemoryRegion::register_memory(*m.pd, memory.data(), memory.size(),
                                          kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead);
  if (!mr) return fail(mr.error());
  auto& region = m.regions[region_id];
  region.memory = memory;
  region.mr = std::move(*mr);
  // Peers we already send to learn it now; later connections learn it in make_active().
  for (auto& p : m.peers)
    if (p.active) p.queue.push_back(m.region_op(region_id, region));
  m.pump();
  return {};
}

Status<std::errc> Mesh::rdma_write(int rank, int region_id, std::uint64_t offset,
                                   std::span<const std::uint8_t> bytes) {
  auto& m = *impl_;
  if (rank < 0 || rank >= m.size) return fail(std::errc::invalid_argument);
  if (rank == m.rank) {
    auto region = m.regions.find(region_id);
    if (region == m.regions.end() || offset > region->second.memory.size() ||
        bytes.size() > region->second.memory.size() - offset)
      return fail(std::errc::invalid_argument);
    std::copy(bytes.begin(), bytes.end(), region->second.memory.begin() + static_cast<std::ptrdiff_t>(offset));
    return {};
  }
  auto& p = m.peers[static_cast<std::size_t>(rank)];
  if (p.failed) return fail(*p.failed);
  if (auto known = p.regions.find(region_id); known != p.regions.end()) {
    if (offset > known->second.length || bytes.size() > known->second.length - offset)
      return fail(std::errc::invalid_argument);
  }
  m.start_static_round();
  const std::size_t piece = m.options.max_message_size;
  std::size_t done = 0;
  do {
    const std::size_t n = std::min(piece, bytes.size() - done);
    Impl::Op op;
    op.write = true;
    op.region_id = region_id;
    op.offset = offset + done;
    op.bytes.assign(bytes.begin() + static_cast<std::ptrdiff_t>(done),
                    bytes.begin() + static_cast<std::ptrdiff_t>(done + n));
    p.queue.push_back(std::move(op));
    done += n;
  } while (done < bytes.size());
  m.pump();
  return {};
}

void Mesh::connect_all() {
  impl_->static_round_started = true;
  impl_->connect_all();
  impl_->pump();
}

void Mesh::progress(std::chrono::milliseconds timeout) {
  auto& m = *impl_;
  if (m.pump() || timeout.count() <= 0) return;
  m.sleep_until(Clock::now() + timeout);
  m.pump();
}

Status<std::errc> Mesh::flush(std::chrono::milliseconds timeout) {
  auto& m = *impl_;
  m.start_static_round();
  if (!m.wait_until([&] { return m.all_flushed(); }, Clock::now() + std::max(timeout, milliseconds(0))))
    return fail(std::errc::timed_out);
  for (const auto& p : m.peers)
    if (p.failed) return fail(*p.failed);
  return {};
}

Status<std::errc> Mesh::settle(std::chrono::milliseconds timeout) {
  auto& m = *impl_;
  if (!m.wait_until([&] { return m.all_settled(); }, Clock::now() + std::max(timeout, milliseconds(0))))
    return fail(std::errc::timed_out);
  return {};
}

Status<std::errc> Mesh::wait_connected(int rank, std::chrono::milliseconds timeout) {
  auto& m = *impl_;
  if (rank < 0 || rank >= m.size) return fail(std::errc::invalid_argument);
  if (rank == m.rank) return {};
  m.start_static_round();
  auto& p = m.peers[static_cast<std::size_t>(rank)];
  if (m.may_connect(rank) && !p.failed) p.wanted = true;
  if (!m.wait_until([&] { return p.failed || connected(rank); }, Clock::now() + std::max(timeout, milliseconds(0))))
    return fail(std::errc::timed_out);
  if (p.failed) return fail(*p.failed);
  return {};
}

bool Mesh::connected(int rank) const {
  if (rank < 0 || rank >= impl_->size) return false;
  if (rank == impl_->rank) return true;
  const auto& p = impl_->peers[static_cast<std::size_t>(rank)];
  return p.active && p.active->state == Impl::Conn::State::established;
}

std::optional<std::errc> Mesh::failed(int rank) const {
  if (rank < 0 || rank >= impl_->size || rank == impl_->rank) return std::nullopt;
  return impl_->peers[static_cast<std::size_t>(rank)].failed;
}

std::vector<MeshConnection> Mesh::connections() const {
  std::vector<MeshConnection> out;
  for (const auto& p : impl_->peers)
    for (const auto& c : p.conns)
      if (c->state == Impl::Conn::State::established)
        out.push_back(MeshConnection{c->rank, c->initiated, p.active == c.get(), c->local, c->remote, c->local_qpn,
                                     c->remote_qpn});
  return out;
}

MeshStats Mesh::stats() const {
  MeshStats out = impl_->stats;
  out.cm = cm_stats(*impl_->context);
  return out;
}

}  // namespace peercm
