// Plain vocabulary types of the verbs API (work requests, completions, access flags),
// shared by the public API and the protocol cores. Names follow libibverbs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

namespace peercm {

// Memory access rights (ibv_access_flags).
enum Access : std::uint32_t {
  kAccessLocalWrite = 1u << 0,
  kAccessRemoteWrite = 1u << 1,
  kAccessRemoteRead = 1u << 2,
};

// A scatter/gather element: `length` bytes at `addr` inside the region of `lkey`.
struct Sge {
  std::uint64_t addr = 0;
  std::uint32_t length = 0;
  std::uint32_t lkey = 0;
};

// A work request's gather or scatter list: a contiguous range of Sge with what callers use
// of std::vector. Up to kInline elements live in the list itself, so posting a work request,
// and the copy its queue keeps, allocate nothing for the usual one to four SGEs; a longer
// list moves to the heap.
class SgeList {
 public:
  static constexpr std::size_t kInline = 4;

  SgeList() = default;
  SgeList(std::initializer_list<Sge> sges) { assign(sges.begin(), sges.end()); }
  // Implicit, so that code building a std::vector keeps working.
  SgeList(const std::vector<Sge>& sges) { assign(sges.data(), sges.data() + sges.size()); }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const Sge* data() const { return size_ <= kInline ? inline_.data() : spilled_.data(); }
  Sge* data() { return size_ <= kInline ? inline_.data() : spilled_.data(); }
  const Sge* begin() const { return data(); }
  const Sge* end() const { return data() + size_; }
  Sge* begin() { return data(); }
  Sge* end() { return data() + size_; }
  const Sge& operator[](std::size_t i) const { return data()[i]; }
  Sge& operator[](std::size_t i) { return data()[i]; }
  const Sge& front() const { return data()[0]; }
  Sge& front() { return data()[0]; }

  void clear() {
    size_ = 0;
    spilled_.clear();
  }
  void push_back(const Sge& sge) {
    if (size_ < kInline) {
      inline_[size_] = sge;
    } else {
      if (size_ == kInline) spilled_.assign(inline_.begin(), inline_.end());
      spilled_.push_back(sge);
    }
    ++size_;
  }

 private:
  void assign(const Sge* first, const Sge* last) {
    clear();
    for (; first != last; ++first) push_back(*first);
  }

  std::array<Sge, kInline> inline_{};
  std::vector<Sge> spilled_;  // every element, once there are more than kInline
  std::size_t size_ = 0;
};

// send_with_imm and rdma_write_with_imm (IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM)
// carry SendWr::imm_data to the peer's receive completion. Only the RoCE RC transport has
// immediate data; iWARP (RFC 5040) has none, and post_send refuses them there with EINVAL.
enum class WrOpcode : std::uint8_t {
  send,
  send_with_invalidate,
  rdma_write,
  rdma_read,
  send_with_imm,
  rdma_write_with_imm,
};

// Send flags (ibv_send_flags).
enum SendFlags : std::uint32_t {
  kSendFence = 1u << 0,      // wait for earlier RDMA Reads to complete
  kSendSignaled = 1u << 1,   // generate a completion even when the QP does not signal all
  kSendSolicited = 1u << 2,  // Send with Solicited Event
  kSendInline = 1u << 3,     // the payload is copied at post time; SGE lkeys are ignored
};

struct SendWr {
  std::uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::send;
  std::uint32_t flags = 0;
  SgeList sg_list;
  // RDMA Read: exactly one SGE, the sink; as in every iWARP stack its region needs
  // kAccessRemoteWrite, because the peer's Read Response is a tagged write into it.
  std::uint64_t remote_addr = 0;      // RDMA Write / Read: the peer's tagged offset
  std::uint32_t rkey = 0;             // RDMA Write / Read: the peer's STag
  std::uint32_t invalidate_rkey = 0;  // Send with Invalidate: the peer's STag to invalidate
  // Send / RDMA Write with Immediate: 32 bits for the peer's receive completion, in network
  // byte order as ibv_send_wr's __be32 imm_data (its bytes in memory are the ImmDt bytes on
  // the wire; use htonl on a host value). Delivered unchanged as WorkCompletion::imm_data.
  std::uint32_t imm_data = 0;
};

struct RecvWr {
  std::uint64_t wr_id = 0;
  SgeList sg_list;
};

enum class WcStatus : std::uint8_t {
  success,
  local_length_error,
  local_qp_operation_error,
  local_protection_error,
  wr_flush_error,
  remote_invalid_request_error,
  remote_access_error,
  remote_operation_error,
  fatal_error,
  retry_exceeded,      // RC over RoCE: the peer never acknowledged within retry_cnt retries
  rnr_retry_exceeded,  // RC over RoCE: the peer had no receive posted through rnr_retry tries
};

// recv_rdma_with_imm (IBV_WC_RECV_RDMA_WITH_IMM): the receive consumed by the peer's RDMA
// Write with Immediate; its byte_len is the Write's length, the data went where the Write
// put it, not into the receive's buffers. The sender's completion of either immediate
// opcode is plain send / rdma_write.
enum class WcOpcode : std::uint8_t { send, rdma_write, rdma_read, recv, recv_rdma_with_imm };

enum WcFlags : std::uint32_t {
  kWcWithInvalidate = 1u << 0,  // the peer's Send invalidated `invalidated_rkey`
  kWcSolicited = 1u << 1,       // the Send carried the Solicited Event bit
  kWcWithImm = 1u << 2,         // `imm_data` is valid (IBV_WC_WITH_IMM)
  kWcGrh = 1u << 3,             // UD over RoCE: the receive starts with the 40-byte GRH area (IBV_WC_GRH)
};

struct WorkCompletion {
  std::uint64_t wr_id = 0;
  WcStatus status = WcStatus::success;
  WcOpcode opcode = WcOpcode::send;
  std::uint32_t byte_len = 0;
  std::uint32_t qp_num = 0;
  std::uint32_t wc_flags = 0;
  std::uint32_t invalidated_rkey = 0;
  // With kWcWithImm: the peer's SendWr::imm_data, network byte order as ibv_wc's imm_data.
  std::uint32_t imm_data = 0;
  // UD receives: the sender's QPN (from its DETH), as ibv_wc's src_qp.
  std::uint32_t src_qp = 0;
};

enum class QpState : std::uint8_t { reset, init, rtr, rts, error };

struct QpCaps {
  std::uint32_t max_send_wr = 128;
  std::uint32_t max_recv_wr = 128;
  std::uint32_t max_send_sge = 4;
  std::uint32_t max_recv_sge = 4;
  std::uint32_t max_inline_data = 256;
};

// Shared receive queue attributes (ibv_srq_attr).
struct SrqAttr {
  std::uint32_t max_wr = 128;   // WRs posted and not yet taken by a QP
  std::uint32_t max_sge = 4;    // SGEs per WR
  // The low watermark of verbs' IBV_EVENT_SRQ_LIMIT_REACHED. Kept and reported; no event
  // ever fires, since the stack raises no asynchronous events.
  std::uint32_t srq_limit = 0;
};

std::string_view to_string(WcStatus status);
std::string_view to_string(WcOpcode opcode);
std::string_view to_string(QpState state);

}  // namespace peercm
