// Shared helpers of the `peercm ping` and `peercm perf` subcommands: addresses, a little-
// endian codec for private data and control messages, the data pattern, and an Endpoint
// (one connection's PD, CQ, QP and registered buffers) with event and completion waits
// that never block for ever.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "engine/busy_poll.hpp"
#include "peercm/cm.hpp"
#include "peercm/verbs.hpp"

namespace peercm::tool {

using Clock = std::chrono::steady_clock;

// Every wait for a peer (CM event, completion, socket) gives up after this long.
inline constexpr std::chrono::milliseconds kWaitTimeout{10000};
// Busy polls spin this long without a completion before they start yielding the CPU every
// engine::BusyPollBudget::kCheckEvery empty polls (docs/progress.md, "Waiting"), or with the
// hybrid policy sleeping.
inline constexpr std::chrono::microseconds kSpinBeforeYield = engine::BusyPollBudget::kSpin;

// A fatal error of a run: the subcommand prints it and exits non-zero.
struct ToolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string errc_text(std::errc error);
[[noreturn]] void throw_errc(std::string_view what, std::errc error);

// --- addresses ---

// A numeric IPv4 address or a host name (resolved to its first IPv4 address).
std::optional<sockaddr_in> parse_address(const std::string& host, std::uint16_t port);
std::string format_address(const sockaddr_in& address);

// --- option values shared by the subcommands ---

// "on" -> 0 (required), "off" -> 2 (off), "" -> nullopt (library default).
std::optional<std::int64_t> crc_option(const std::string& value);
ProgressMode progress_option(const std::string& value);

// --- little-endian codec ---

class ByteWriter {
 public:
  ByteWriter& u8(std::uint8_t v);
  ByteWriter& u16(std::uint16_t v);
  ByteWriter& u32(std::uint32_t v);
  ByteWriter& u64(std::uint64_t v);
  std::vector<std::uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<std::uint8_t> bytes_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  std::uint8_t u8();
  std::uint16_t u16();
  std::uint32_t u32();
  std::uint64_t u64();
  bool ok() const { return ok_; }

 private:
  std::uint64_t take(std::size_t n);
  std::span<const std::uint8_t> bytes_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

// --- control messages (16 bytes: kind, iteration, status, value) ---

struct Control {
  std::uint32_t kind = 0;
  std::uint32_t iter = 0;
  std::uint32_t status = 0;
  std::uint32_t value = 0;
};
inline constexpr std::size_t kControlSize = 16;
void encode_control(const Control& c, std::span<std::uint8_t> out);
Control decode_control(std::span<const std::uint8_t> in);

// --- the data pattern: depends on the iteration and on the byte index ---

std::uint8_t pattern_byte(std::uint32_t iter, std::size_t index);
void fill_pattern(std::span<std::uint8_t> bytes, std::uint32_t iter);
// Index of the first byte that differs from the pattern, or nullopt.
std::optional<std::size_t> find_mismatch(std::span<const std::uint8_t> bytes, std::uint32_t iter);

// --- verbs/CM resources ---

// "iwarp" or "roce" (--transport).
Transport transport_option(const std::string& name);
// A random 127.a.b.c: a RoCE node is one address, and runs side by side must not share
// (address, 4791).
std::string random_loopback_host();

// One opened context and its CM event channel.
// Its CmIds (resolve, listen_on) use `transport`.
struct Device {
  // `faults`: the RoCE test hook (a lossy wire), for perf --drop.
  explicit Device(ProgressMode mode, Transport transport = Transport::iwarp, const RoceFaults& faults = {});
  Transport transport;
  std::unique_ptr<Context> context;
  std::unique_ptr<EventChannel> channel;
  // Client ids connect from this address when set (--bind of a client): over RoCE, an address
  // the server may share (docs/roce-transport.md, "Several processes on one address").
  std::optional<sockaddr_in> source;
};

// Registered memory owned by an Endpoint (64-byte aligned).
class Buffer {
 public:
  Buffer(ProtectionDomain& pd, std::size_t size, std::uint32_t access);
  std::uint8_t* data() { return storage_.get(); }
  const std::uint8_t* data() const { return storage_.get(); }
  std::span<std::uint8_t> span() { return {storage_.get(), size_}; }
  std::size_t size() const { return size_; }
  Sge sge(std::size_t offset, std::size_t length) const { return mr_->sge(offset, length); }
  Sge sge() const { return mr_->sge(); }
  std::uint64_t address() const;
  std::uint32_t rkey() const { return mr_->rkey(); }

 private:
  struct Free {
    void operator()(std::uint8_t* p) const;
  };
  std::unique_ptr<std::uint8_t, Free> storage_;
  std::size_t size_;
  std::unique_ptr<MemoryRegion> mr_;
};

// CM events that belong to nobody waiting right now (connect requests arriving while a
// server is busy with another client) are kept here.
using EventStash = std::deque<CmEvent>;

// Waits for an event of one of `wanted` types on `id`; events of other ids are dropped,
// CONNECT_REQUESTs on a listener go to `stash` when given. Throws ToolError on a timeout
// or on any other event for `id` (REJECTED, UNREACHABLE, CONNECT_ERROR, DISCONNECTED...).
CmEvent wait_event(EventChannel& channel, const CmId* id, std::initializer_list<CmEventType> wanted,
                   EventStash* stash = nullptr, std::chrono::milliseconds timeout = kWaitTimeout);

// How a thread waits for completions.
enum class WaitPolicy {
  poll,    // busy-poll the CQ (perftest style), yielding after the spin budget
  block,   // sleep on the completion channel between completions
  hybrid,  // busy-poll for the spin budget, then sleep on the completion channel
};

struct EndpointConfig {
  std::uint32_t cq_capacity = 1024;
  QpCaps caps{};
  bool sig_all = true;
  WaitPolicy wait = WaitPolicy::poll;
};

// One side of a connection. The CmId comes from resolve (client) or from a CONNECT_REQUEST
// (server); the Endpoint creates PD, CQ and QP on it and owns the buffers.
// The destructor destroys the CmId and then empties the device's event channel: queued
// events still name the destroyed id's address, which a new CmId may reuse. Connect
// requests go to the stash; every other queued event is dropped, so an Endpoint assumes
// it is the only connection on its channel (besides a listener).
class Endpoint {
 public:
  Endpoint(Device& device, std::unique_ptr<CmId> id, const EndpointConfig& config, EventStash* stash = nullptr);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  Buffer& add_buffer(std::size_t size, std::uint32_t access = kAccessLocalWrite);

  // Posting; throw ToolError when the QP refuses the work request.
  void post_send(Buffer& buffer, std::size_t offset, std::size_t length, std::uint64_t wr_id,
                 std::uint32_t flags = 0);
  void post_write(Buffer& buffer, std::size_t offset, std::size_t length, std::uint64_t remote_addr,
                  std::uint32_t rkey, std::uint64_t wr_id, std::uint32_t flags = 0);
  void post_read(Buffer& buffer, std::size_t offset, std::size_t length, std::uint64_t remote_addr,
                 std::uint32_t rkey, std::uint64_t wr_id, std::uint32_t flags = 0);
  void post_recv(Buffer& buffer, std::size_t offset, std::size_t length, std::uint64_t wr_id);
  void post(const SendWr& wr);
  void post_rdma(WrOpcode opcode, Buffer& buffer, std::size_t offset, std::size_t length, std::uint64_t remote_addr,
                 std::uint32_t rkey, std::uint64_t wr_id, std::uint32_t flags);

  // Completions with an error status throw ToolError.
  std::size_t poll(std::span<WorkCompletion> out);
  WorkCompletion wait_completion(std::chrono::milliseconds timeout = kWaitTimeout);
  // Waits for a completion of `opcode`, handling the others through `other` (may be empty).
  template <class F>
  WorkCompletion wait_for(WcOpcode opcode, F&& other, std::chrono::milliseconds timeout = kWaitTimeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      WorkCompletion wc = wait_completion(std::max(left, std::chrono::milliseconds(0)));
      if (wc.opcode == opcode) return wc;
      other(wc);
    }
  }

  // CM steps.
  ConnParam connect(const ConnParam& param);  // returns the peer's accept parameters
  void accept(const ConnParam& param);
  CmEvent wait_event(std::initializer_list<CmEventType> wanted, std::chrono::milliseconds timeout = kWaitTimeout);
  // Graceful close: disconnect and wait (briefly) for the DISCONNECTED event.
  void close(std::chrono::milliseconds timeout = std::chrono::milliseconds(3000));

  Device& device() { return device_; }
  CmId& id() { return *id_; }
  QueuePair& qp() { return *qp_; }
  CompletionQueue& cq() { return *cq_; }
  // Whether an idle busy poll that started at `start` should yield the CPU now (called
  // every few dozen empty polls).
  bool should_yield(Clock::time_point start, Clock::time_point now) const { return now - start >= spin_; }
  // Called by an idle busy poll every few dozen empty polls: yields the CPU, or with the
  // hybrid policy sleeps on the completion channel, once the spin budget is spent.
  // Returns the completions it found on the way (into `out`).
  std::size_t idle(Clock::time_point start, Clock::time_point now, Clock::time_point deadline,
                   std::span<WorkCompletion> out);
  // Arms the CQ, polls once more (into `out`) and, if that found nothing, sleeps on the
  // completion channel until a completion event or `deadline`.
  std::size_t sleep_until_completion(Clock::time_point deadline, std::span<WorkCompletion> out);
  // How long an idle busy poll spins before it starts yielding (default: see kSpinBeforeYield).
  void set_spin(std::chrono::microseconds spin) { spin_ = spin; }

 private:
  Device& device_;
  EventStash* stash_;
  WaitPolicy wait_;
  std::chrono::microseconds spin_;
  std::unique_ptr<ProtectionDomain> pd_;
  std::unique_ptr<CompletionChannel> comp_channel_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<CmId> id_;
  QueuePair* qp_ = nullptr;
  std::deque<Buffer> buffers_;
  bool disconnected_ = false;
};

// Client side up to connect(): a CmId on `device` with its address and route resolved.
std::unique_ptr<CmId> resolve(Device& device, const sockaddr_in& destination, std::optional<std::int64_t> crc);

// A listening CmId.
std::unique_ptr<CmId> listen_on(Device& device, const sockaddr_in& address, std::optional<std::int64_t> crc);

// The next CONNECT_REQUEST (from the stash first); nullopt on timeout (negative: forever).
std::optional<CmEvent> next_request(Device& device, EventStash& stash, std::chrono::milliseconds timeout);

// Statistics of a series of samples (microseconds).
struct Summary {
  double median = 0, average = 0, min = 0, max = 0, p99 = 0;
};
Summary summarize(std::vector<double> samples);

}  // namespace peercm::tool
