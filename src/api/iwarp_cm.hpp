// The iWARP CM of one context: the I/O around core/iwarp_cm's agent. It owns the sockets (the
// listeners' and one Connection per stream), hands the agent their bytes and events and the
// reactor's time, carries out the agent's actions, and turns the agent's events into CmEvents.
// It decides nothing of the CM itself: backlog, MPA, p2p and rejects are the agent's.
#pragma once

#include <netinet/in.h>

#include <memory>
#include <optional>
#include <unordered_map>

#include "api/connection.hpp"
#include "api/transport_cm.hpp"
#include "core/iwarp_cm/iwarp_cm_agent.hpp"
#include "engine/reactor.hpp"

namespace peercm::detail {

// What the iWARP CM keeps per CmId.
struct IwarpIdState final : TransportIdState {
  ~IwarpIdState() override;
  core::iwarp::IwarpCmId agent_id = 0;  // 0: none (yet, or any more)
  int listen_fd = -1;
  // The port rdma_bind_addr took (api/port_reservation.hpp): a TCP socket bound to the id's
  // address, which listen() listens on and connect() connects from.
  int reserved_fd = -1;
};

class IwarpCm final : public TransportCm {
 public:
  explicit IwarpCm(ContextImpl& ctx);
  ~IwarpCm() override;

  Transport transport() const override { return Transport::iwarp; }
  std::unique_ptr<TransportIdState> new_id_state() const override { return std::make_unique<IwarpIdState>(); }
  bool binds_route_source() const override { return true; }
  bool supports_datagram() const override { return false; }
  Status<std::errc> reserve_port(CmIdImpl& id, sockaddr_in& address) override;
  Status<std::errc> listen(CmIdImpl& id, int backlog) override;
  void resolve_addr(CmIdImpl& id, const sockaddr_in& destination) override;
  void before_connect(CmIdImpl& id, std::unique_lock<std::mutex>& lock) override;
  Status<std::errc> connect(CmIdImpl& id, const ConnParam& param, std::optional<CmEvent>& retracted) override;
  Status<std::errc> accept(CmIdImpl& id, const ConnParam& param) override;
  Status<std::errc> reject(CmIdImpl& id, std::span<const std::uint8_t> private_data) override;
  Status<std::errc> disconnect(CmIdImpl& id) override;
  Result<std::shared_ptr<QueuePairImpl>, std::errc> create_qp(CmIdImpl& id, std::uint32_t pd,
                                                               const QpInitAttr& attr) override;
  Status<std::errc> attach_qp(CmIdImpl& id, const std::shared_ptr<QueuePairImpl>& qp) override;
  void release(CmIdImpl& id) override;
  sockaddr_in local_address(CmIdImpl& id) override;
  void add_stats(CmStats& stats) override;

  const core::iwarp::IwarpCmAgent& agent() const { return agent_; }

 private:
  using StreamId = core::iwarp::StreamId;

  void on_listen_readable(const std::weak_ptr<CmIdImpl>& weak);
  Connection::Callbacks stream_callbacks(StreamId stream);
  // Carries out the agent's actions and delivers its events until it has none, then re-arms
  // the deadline timer. Calls from inside (a callback of an action) return at once.
  void pump();
  void execute(core::iwarp::IwarpCmAction& action);
  void deliver(core::iwarp::IwarpCmEvent& event);
  void on_connect_request(core::iwarp::IwarpCmEvent& event);
  void arm_timer();
  std::shared_ptr<CmIdImpl> find(core::iwarp::IwarpCmId id) const;
  std::shared_ptr<Connection> connection_of(core::iwarp::IwarpCmId id) const;
  void end_agent_id(CmIdImpl& id);

  ContextImpl& ctx_;
  core::iwarp::IwarpCmAgent agent_;
  std::unordered_map<StreamId, std::shared_ptr<Connection>> streams_;
  std::unordered_map<core::iwarp::IwarpCmId, std::weak_ptr<CmIdImpl>> ids_;
  std::optional<engine::Reactor::TimerId> timer_;
  std::optional<core::Time> timer_deadline_;
  bool pumping_ = false;
  // connect(): an open_stream whose socket could not even be made (the call fails).
  std::optional<std::pair<StreamId, std::errc>> failed_open_;
};

// The iWARP backlog of a listening id (tests): handshakes and undecided requests it counts.
core::iwarp::IwarpCmAgent::Backlog iwarp_backlog(CmId& listener);

}  // namespace peercm::detail
