// The RoCE half of a queue pair: the RC core, its wire QPN, and the UDP socket its packets
// leave from. The socket exists for its source port alone: one per QP for its lifetime,
// the flow entropy of roce-ibcm-wire.md §1 that the ICRC covers. Peers send to port 4791,
// never back to it.
#pragma once

#include <cstdint>
#include <memory>
#include <system_error>

#include "core/roce/rc_queue_pair.hpp"
#include "core/roce/uc_queue_pair.hpp"
#include "core/roce/ud_queue_pair.hpp"
#include "peercm/result.hpp"

namespace peercm::detail {
struct CmIdImpl;
}

namespace peercm::detail::roce {

struct RoceQp {
  // `local_address` (host order) is where the CM runs for this QP: its packets leave from it.
  static Result<std::unique_ptr<RoceQp>, std::errc> open(const core::roce::RcQpConfig& config,
                                                         core::MemoryTable& memory, core::CompletionSink& send_cq,
                                                         core::CompletionSink& recv_cq, std::uint32_t qpn,
                                                         std::uint32_t local_address);
  RoceQp(const core::roce::RcQpConfig& config, core::MemoryTable& memory, core::CompletionSink& send_cq,
         core::CompletionSink& recv_cq);
  ~RoceQp();
  RoceQp(const RoceQp&) = delete;
  RoceQp& operator=(const RoceQp&) = delete;

  core::roce::RcQueuePair rc;
  std::uint32_t qpn = 0;
  std::uint32_t local_address = 0;   // host order
  std::uint32_t remote_address = 0;  // host order; set when the CM established it
  int send_fd = -1;
  std::uint16_t source_port = 0;
  // The CmId whose connection this QP carries: told when the QP fails on its own.
  std::weak_ptr<CmIdImpl> owner;
};

// The RoCE half of a UD queue pair (ibv_create_qp IBV_QPT_UD): the UD core and, once its
// first send names the address it leaves from, the socket it sends from (one source port
// for the QP's life, as for RC). Receives arrive on the context's 4791 sockets by QPN.
struct RoceUdQp {
  RoceUdQp(const core::roce::UdQpConfig& config, core::MemoryTable& memory, core::CompletionSink& send_cq,
           core::CompletionSink& recv_cq)
      : ud(config, memory, send_cq, recv_cq) {}
  ~RoceUdQp();
  RoceUdQp(const RoceUdQp&) = delete;
  RoceUdQp& operator=(const RoceUdQp&) = delete;

  // Binds the send socket on `local_address` (host order) on first use; EINVAL when the QP
  // already sends from another address.
  Status<std::errc> send_from(std::uint32_t local_address);

  core::roce::UdQueuePair ud;
  std::uint32_t local_address = 0;  // host order; 0 until the first send
  int send_fd = -1;
};

// The RoCE half of a UC queue pair (ibv_create_qp IBV_QPT_UC): the UC core, and from RTR on
// the socket its packets leave from (one source port for the QP's life, as for RC) and the
// peer's address they go to. Its packets arrive on the context's 4791 sockets by QPN.
struct RoceUcQp {
  RoceUcQp(const core::roce::UcQpConfig& config, core::MemoryTable& memory, core::CompletionSink& send_cq,
           core::CompletionSink& recv_cq)
      : uc(config, memory, send_cq, recv_cq) {}
  ~RoceUcQp();
  RoceUcQp(const RoceUcQp&) = delete;
  RoceUcQp& operator=(const RoceUcQp&) = delete;

  // Binds the send socket on `local_address` (host order); the source port it gets goes
  // into the path's ICRC fields.
  Result<std::uint16_t, std::errc> open_socket(std::uint32_t local_address);

  core::roce::UcQueuePair uc;
  std::uint32_t local_address = 0;   // host order; set at RTR
  std::uint32_t remote_address = 0;  // host order; set at RTR
  int send_fd = -1;
};

}  // namespace peercm::detail::roce
