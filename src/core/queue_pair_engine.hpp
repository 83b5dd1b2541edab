// The RDMAP/DDP queue-pair engine (RFC 5040, RFC 5041) over MPA FPDUs, as a sans-IO core:
// work requests and received bytes in; bytes to send (as iovecs over registered memory),
// completions and events out. It never touches a socket, a clock or a lock.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

#include "core/memory_table.hpp"
#include "core/mpa_handshake.hpp"
#include "core/receive_queue.hpp"
#include "core/ring_deque.hpp"
#include "peercm/result.hpp"
#include "peercm/verbs_types.hpp"
#include "wire/ddp_rdmap.hpp"
#include "wire/fpdu.hpp"

namespace peercm::core {

// Where completions go (a completion queue). push() returns false on overrun.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  virtual bool push(const WorkCompletion& completion) = 0;
  // A completion for a receive that carried the Solicited Event bit was pushed.
  virtual void solicited() {}
};

struct QpConfig {
  std::uint32_t qp_num = 0;
  std::uint32_t pd = 0;
  QpCaps caps;
  bool signal_all = true;  // sq_sig_all: every send WR generates a completion
  // A shared receive queue: untagged Sends take their receives from it, in its posting
  // order, and post_recv() is EINVAL. It outlives the engine, or detach_srq() comes first.
  ReceiveQueue* srq = nullptr;
};

// What the MPA exchange decided, handed over when the connection enters full operation.
struct StreamParams {
  bool crc = true;
  std::size_t mulpdu = 1454;
  std::uint16_t ird = 16;  // inbound Read Requests we accept at once
  std::uint16_t ord = 16;  // outbound Reads we may have in flight
  bool responder = false;  // RFC 5044 §7.1.2 rule 4: transmit nothing until the first inbound FPDU
  RtrType send_rtr = RtrType::none;    // initiator, p2p: send this RTR as the first FPDU
  RtrType expect_rtr = RtrType::none;  // responder, p2p: the first inbound FPDU must be this RTR
};

struct QpEvent {
  enum class Kind : std::uint8_t {
    terminate_sent,      // we found an error; the Terminate is queued, then the QP is in ERROR
    terminate_received,  // the peer sent a Terminate; the QP is in ERROR
    connection_lost,     // the LLP failed or the peer closed abruptly; the QP is in ERROR
    peer_closed,         // the peer closed gracefully
  };
  Kind kind = Kind::connection_lost;
  wire::TerminateCode code;  // for the terminate kinds
};

struct QpStats {
  std::uint64_t fpdus_sent = 0;
  std::uint64_t fpdus_received = 0;
  std::uint64_t fpdus_predicted = 0;  // of those, taken by header prediction (take_predicted_fpdu)
  std::uint64_t bytes_placed = 0;
};

class QueuePairEngine {
 public:
  QueuePairEngine(const QpConfig& config, MemoryTable& memory, CompletionSink& send_cq, CompletionSink& recv_cq);

  // --- application inputs (verbs) ---
  // Checks the WR against the caps (EINVAL), queue space (ENOMEM). In ERROR the WR is
  // accepted and completes with a flush error. Work posted before connect() waits.
  Status<std::errc> post_send(const SendWr& wr);
  Status<std::errc> post_recv(const RecvWr& wr);
  // The QP stops drawing from its SRQ (it is being destroyed): a later Send finds no
  // receive. A receive already taken stays with the QP and completes (or flushes) here.
  void detach_srq();
  // The receives posted before any connection, handed over when the QP runs on another
  // transport after all (a RoCE id adopting a QueuePair::create QP, rping -q).
  ReceiveQueue take_posted_receives() { return std::exchange(rq_, ReceiveQueue{}); }

  // --- connection inputs ---
  // Full operation starts (state RTS): the RTR, then queued work, go out.
  void connect(const StreamParams& params);
  // Inbound stream bytes (copy path). Returns how many were used (all, unless in ERROR).
  std::size_t handle_bytes(std::span<const std::uint8_t> bytes);
  // Zero-copy path (CRC off only): where the next inbound payload bytes belong; empty when
  // the next bytes are header/trailer bytes (use handle_bytes). After receiving directly
  // into it, report the count with handle_placed().
  std::span<std::uint8_t> receive_target();
  void handle_placed(std::size_t n);
  // The largest segment payload of the last complete inbound message (0 with CRC on, whose
  // payloads are never received in place): a driver that saw a large one keeps its next read
  // header-sized, so that the next message's payload can come straight into its target too.
  std::size_t last_message_largest_segment() const { return params_.crc ? 0 : last_message_largest_segment_; }
  void handle_peer_closed();       // FIN from the peer
  void handle_connection_lost();   // RST, error, timeout
  // Local graceful teardown: no more work accepted; outstanding work is flushed.
  void disconnect();
  // Local abortive teardown with a Terminate (e.g. RFC 6581 2/0/6, 2/0/7).
  void terminate(wire::TerminateCode code);

  // --- outputs ---
  // Fast path for a small Send or Write posted while nothing else waits to go out (the
  // ping-pong case): its one FPDU is framed at once, for the driver to write right away.
  // Empty when the WR must be posted with post_send() instead (anything queued or framed,
  // a Read, inline data, more than one FPDU, an invalid WR or SGE). Otherwise the WR is
  // committed: write the iovecs (valid until then) and call finish_direct() with the count
  // the socket accepted, 0 included, before any other input. A part the socket did not take
  // goes out like queued work, and the WR completes when it has.
  std::span<const iovec> frame_direct(const SendWr& wr);
  void finish_direct(const SendWr& wr, std::size_t written);
  // Fills `out` with the next bytes to write (FPDUs, in order); returns the count of iovecs.
  std::size_t gather_transmit(std::span<iovec> out);
  // The socket accepted the first `n` bytes of what gather_transmit() offered.
  void handle_transmitted(std::size_t n);
  // Asked after every input and post; inline, as it is mostly false.
  bool has_transmit() const { return connected_ && (ring_count_ > 0 || message_ready()); }
  std::optional<QpEvent> poll_event();
  bool has_events() const { return !events_.empty(); }
  QpState state() const;
  // RFC 5044 §7.1.2 rule 4: a responder sends nothing until the initiator's first FPDU (its
  // RTR, when one was negotiated) has arrived. Diagnostics only.
  bool transmit_fenced() const { return tx_fenced_; }
  // True once nothing more will be sent: the driver may close the socket (after draining).
  bool transmit_closed() const {
    return state_ == QpState::error && ring_count_ == 0 && (!terminate_ || terminate_framed_);
  }
  const QpStats& stats() const;

  // Driver contract and choices made here:
  // - What gather_transmit() offers stays valid until the next handle_transmitted(); call
  //   that right after writing, before any other input.
  // - handle_bytes() uses nothing before connect(), and returns fewer bytes than given only
  //   when the QP is (or just went) in ERROR: the rest of the inbound stream is dropped
  //   (RFC 5041 §7.2).
  // - At most 64 FPDUs / ~256 KiB are framed ahead of the socket; payload iovecs point into
  //   the registered buffers (or the inline copy taken at post time).
  // - A Send's receive leaves its queue (the QP's own or the SRQ) with the message's first
  //   accepted segment and is the QP's until the message completes; flushing completes that
  //   one and the QP's own queue, never what is left in an SRQ (verbs: it serves other QPs).
  // - A Terminate is not held by the responder fence (RFC 6581 §9.3: a responder that gets
  //   no matching RTR must be able to say 2/0/7). An FPDU partly written when the QP enters
  //   ERROR is finished from a private copy, never cut; nothing new is framed after it.
  // - Errors found while posting (bad local SGE) and CQ overrun end the stream with
  //   Terminate 0x0/0x0/0x00; an error before connect() sends it once connect() is called.
  // - An ORD of 0 holds every RDMA Read (and all WRs behind it) until teardown.

  // Small accessors (for the API layer and tests).
  std::size_t send_queue_size() const { return sq_.size(); }  // posted, not yet completed
  // Receives posted to this QP (or taken from its SRQ) and not yet completed.
  std::size_t recv_queue_size() const { return rq_.size() + (recv_taken_ ? 1 : 0); }
  std::size_t outstanding_reads() const { return outbound_reads_.size(); }

  QueuePairEngine(const QueuePairEngine&) = delete;
  QueuePairEngine& operator=(const QueuePairEngine&) = delete;

 private:
  // ---- send queue (qp_transmit.cpp) ----
  struct SendEntry {
    SendWr wr;
    std::vector<std::uint8_t> inline_data;  // kSendInline: the payload, copied at post time
    std::uint64_t length = 0;               // message length
    enum class Phase : std::uint8_t { queued, transmitting, awaiting_response, done } phase = Phase::queued;
    WcStatus status = WcStatus::success;
    bool signaled = true;
  };
  // An RDMA Read we sent and whose Read Response has not completed (ORD, RFC 5040 §6.1).
  struct OutboundRead {
    std::uint64_t seq = 0;  // send-queue entry; unused for the RTR
    std::uint32_t sink_stag = 0;
    std::uint64_t sink_offset = 0;
    std::uint32_t size = 0;
    bool rtr = false;
  };
  // What owns the message an FPDU belongs to.
  enum class TxOwner : std::uint8_t { none, send_queue, read_response, rtr, terminate };
  // The message being segmented (RFC 5041 §5.4).
  struct TxMessage {
    TxOwner owner = TxOwner::none;
    std::uint64_t seq = 0;           // send-queue entry or inbound read
    wire::SegmentHeader header;      // the fields every segment shares
    std::uint64_t length = 0;
    std::uint64_t offset = 0;        // bytes segmented so far (MO / TO - base)
    std::uint64_t base_offset = 0;   // tagged: TO of the first byte
    // The payload: one contiguous source, or else the gather list of send-queue entry `seq`,
    // looked up per segment (the queue's storage moves when WRs posted behind it grow it).
    const std::uint8_t* contiguous = nullptr;
    std::size_t sge_index = 0;
    std::uint64_t sge_offset = 0;
  };
  // One framed FPDU waiting for the socket: prefix, payload pieces, trailer.
  struct TxSlot {
    wire::FpduFramer framer;
    std::vector<iovec> pieces;
    std::size_t size = 0;
    std::size_t sent = 0;
    TxOwner owner = TxOwner::none;
    std::uint64_t seq = 0;
    bool last = false;  // the message's last segment
  };

  // ---- receive side (qp_receive.cpp) ----
  struct InboundRead {
    wire::ReadRequestHeader request;
    std::uint64_t sent = 0;  // bytes of the Read Response segmented so far
  };
  enum class RxKind : std::uint8_t { none, write, read_response, send, read_request, terminate, rtr_write, rtr_send };
  struct RxSegment {
    RxKind kind = RxKind::none;
    wire::SegmentHeader header;
    std::size_t length = 0;  // payload bytes of the segment
    std::size_t placed = 0;
    std::uint8_t* tagged_target = nullptr;
    PostedRecv* recv = nullptr;
    std::size_t sge_index = 0;
    std::uint64_t sge_offset = 0;
  };

  // qp_transmit.cpp
  Status<std::errc> check_send_wr(const SendWr& wr, std::uint64_t& length) const;
  static wire::SegmentHeader message_header(const SendWr& wr);
  bool transmit_idle() const;
  bool send_queue_head_ready() const;
  bool message_ready() const;
  bool start_next_message();
  void start_send_queue_message();
  void start_read_response();
  void start_rtr();
  template <typename Gather>
  bool frame_into_next_slot(const wire::SegmentHeader& header, std::size_t n, TxOwner owner, std::uint64_t seq,
                            Gather&& gather);
  void frame_segment();
  void fill_pipeline();
  void frame_whole(const wire::SegmentHeader& header, TxOwner owner);
  void on_message_transmitted(TxOwner owner, std::uint64_t seq, bool last);
  void complete_ready_sends();
  void stop_transmit();
  // A slot is allocated the first time the ring reaches it and kept: an idle QP holds the
  // few its setup used, a streaming one all of them, and framing soon allocates nothing.
  TxSlot& ring_at(std::size_t i) {
    std::unique_ptr<TxSlot>& slot = ring_[(ring_head_ + i) & (kTxSlots - 1)];
    if (!slot) slot = std::make_unique<TxSlot>();
    return *slot;
  }
  // Only for framed slots (i < ring_count_), which exist.
  const TxSlot& ring_at(std::size_t i) const { return *ring_[(ring_head_ + i) & (kTxSlots - 1)]; }

  // qp_receive.cpp
  void on_segment_header(const wire::SegmentHeader& header, std::size_t payload_length);
  void on_segment_payload(std::span<const std::uint8_t> payload);
  void on_segment_end();
  bool begin_segment(const wire::SegmentHeader& header, std::size_t payload_length);
  bool check_rtr(const wire::SegmentHeader& header, std::size_t payload_length);
  bool handle_tagged_segment(const wire::SegmentHeader& header, std::size_t payload_length);
  bool handle_read_response_segment(const wire::SegmentHeader& header, std::size_t payload_length);
  bool handle_send_segment(const wire::SegmentHeader& header, std::size_t payload_length);
  bool handle_read_request(const wire::SegmentHeader& header);
  std::size_t take_predicted_fpdu(std::span<const std::uint8_t> in);
  void count_valid_segment(std::size_t length, bool last);
  void release_segment_targets();
  void place(std::span<const std::uint8_t> bytes);
  std::span<std::uint8_t> send_run();
  void advance_send_cursor(std::size_t n);
  void deliver_send(wire::RdmapOpcode opcode, std::uint32_t invalidate_stag, std::uint64_t length);
  void complete_read();
  void handle_terminate(const wire::SegmentHeader& header);
  void capture_raw(std::span<const std::uint8_t> bytes);
  void stage_unchecked_payload();

  // qp_terminate.cpp
  void terminate_inbound(wire::TerminateCode code);  // with the offending segment's headers
  void on_decode_error(wire::WireError error);
  void send_terminate(const wire::TerminateHeader& terminate);
  void queue_terminate_fpdu();

  // queue_pair_engine.cpp
  void enter_error();
  void flush_all();
  void flush_recv(const PostedRecv& posted);
  void push_send_completion(const WorkCompletion& wc);
  void push_recv_completion(const WorkCompletion& wc, bool solicited);
  void after_input();
  WorkCompletion completion_for(const SendWr& wr, std::uint64_t length, WcStatus status) const;
  WorkCompletion completion_for(const SendEntry& entry) const;

  QpConfig config_;
  MemoryTable& memory_;
  CompletionSink& send_cq_;
  CompletionSink& recv_cq_;
  StreamParams params_;
  QpState state_ = QpState::init;
  bool connected_ = false;
  QpStats stats_;
  RingDeque<QpEvent> events_;
  bool cq_overrun_ = false;
  bool flushing_ = false;
  bool llp_closed_ = false;  // peer_closed or connection_lost was reported

  // transmit
  RingDeque<SendEntry> sq_;
  std::uint64_t sq_base_ = 0;  // sequence number of sq_.front()
  std::uint64_t sq_next_ = 0;  // next entry to transmit
  RingDeque<OutboundRead> outbound_reads_;
  std::uint32_t next_send_msn_ = 1;  // RFC 5041 §5.3: MSN starts at 1 per queue
  std::uint32_t next_read_msn_ = 1;
  bool rtr_pending_ = false;
  bool tx_fenced_ = false;       // RFC 5044 §7.1.2 rule 4 (responder)
  bool tx_stopped_ = false;      // no new FPDUs are framed (error / disconnect)
  bool last_was_response_ = false;
  std::size_t mulpdu_ = 1454;
  TxMessage tx_msg_;
  // FPDUs framed ahead of the socket (a power of two: ring positions are masked, not divided).
  static constexpr std::size_t kTxSlots = 64;
  static_assert((kTxSlots & (kTxSlots - 1)) == 0);
  std::array<std::unique_ptr<TxSlot>, kTxSlots> ring_;  // its iovecs point into the slots: they never move
  std::size_t ring_head_ = 0;
  std::size_t ring_count_ = 0;
  std::size_t ring_unsent_ = 0;  // bytes framed, not yet transmitted
  std::vector<std::uint8_t> tail_;  // rest of an FPDU cut off by teardown
  std::optional<wire::TerminateHeader> terminate_;  // the one Terminate of this stream
  bool terminate_framed_ = false;

  // receive
  ReceiveQueue rq_;                       // posted to this QP
  ReceiveQueue* receive_source_;          // where Sends take their receives: rq_ or the SRQ
  std::optional<PostedRecv> recv_taken_;  // the receive of the Send message in progress
  RingDeque<InboundRead> inbound_reads_;
  std::uint64_t inbound_base_ = 0;
  std::uint64_t inbound_next_ = 0;  // next inbound read to answer
  std::uint32_t expected_send_msn_ = 1;
  std::uint32_t expected_read_msn_ = 1;
  std::optional<wire::FpduStreamDecoder> decoder_;
  bool rx_dead_ = false;
  bool first_fpdu_seen_ = false;
  RxSegment rx_;
  std::size_t message_largest_segment_ = 0;       // of the inbound message under way
  std::size_t last_message_largest_segment_ = 0;  // of the last one completed (its L segment seen)
  // CRC on: the current segment's payload not yet checked. `unchecked_` is the part still in
  // the buffer handle_bytes() was given (valid during that call only); what a call leaves
  // unchecked is copied into `staging_` first (staged_ bytes). Staging is sized per segment
  // and released after a large one, so an idle connection holds at most kKeptStaging bytes.
  std::span<const std::uint8_t> unchecked_;
  std::size_t staged_ = 0;
  std::unique_ptr<std::uint8_t[]> staging_;
  std::size_t staging_capacity_ = 0;
  std::array<std::uint8_t, wire::kUlpduLengthSize + wire::kMaxSegmentHeaderSize> raw_{};
  std::size_t raw_filled_ = 0;
  bool raw_complete_ = false;  // the header of the current FPDU is captured
};

}  // namespace peercm::core
