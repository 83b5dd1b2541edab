// `peercm perf`: latency and bandwidth of Send, RDMA Write and RDMA Read, each run next to
// the same traffic pattern over a plain TCP socket, with the ratio of the two.
//
//   lat send:  ping-pong Send/Recv; one-way latency = RTT/2.
//   lat write: ping-pong RDMA Write; each side busy-polls the last byte of its buffer for
//              the iteration's marker (perftest's write_lat); one-way latency = RTT/2.
//   lat read:  one RDMA Read of `size` bytes at a time; latency = its completion time.
//   bw:        a window of outstanding work requests (signaled every 16th). For Send the
//              receiver keeps kRecvDepth receives posted and returns credits, so the sender
//              never overruns it (iWARP has no RNR retry). The warm-up messages go first,
//              and the clock starts after a round trip behind them (Send, Write) or once they
//              completed (Read): the pipe is empty when it starts, as after ucx_perftest's
//              warm-up and barrier.
// Every run ends with a "fin" Send from the client answered by a "done" Send, so that the
// server knows the client has finished with its memory.
//
// Connect private data: magic, version, op, mode, size, iters, warm-up, window, and the
// client's buffer (address, rkey) for write latency. Accept private data: magic, the
// server's buffer (address, rkey), its receive depth.
#include <fmt/core.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>

#include "endpoint.hpp"
#include "perf_common.hpp"
#include "subcommands.hpp"
#include "tcp_baseline.hpp"

namespace peercm::tool {

std::string_view to_string(PerfOp op) {
  switch (op) {
    case PerfOp::send: return "send";
    case PerfOp::write: return "write";
    case PerfOp::read: return "read";
  }
  return "?";
}

std::string_view to_string(PerfMode mode) { return mode == PerfMode::lat ? "lat" : "bw"; }

double headline(const PerfParams& params, const Measurement& m) {
  if (params.mode == PerfMode::lat) return summarize(m.samples).median;
  return m.seconds > 0 ? static_cast<double>(m.bytes) / m.seconds / 1e6 : 0.0;
}

namespace {

constexpr std::uint32_t kHelloMagic = 0x46504350;   // "PCPF"
constexpr std::uint32_t kAcceptMagic = 0x41504350;  // "PCPA"
constexpr std::uint8_t kVersion = 2;  // 2: streams begin with warm-up messages and a sync
constexpr std::uint32_t kMaxSize = 1u << 30;
constexpr std::uint32_t kMaxWindow = 1024;
constexpr std::uint32_t kSignalEvery = 16;
constexpr std::uint32_t kRecvDepth = 512;    // bw send: receives the server keeps posted
constexpr std::uint32_t kCreditBatch = 64;   // bw send: receives returned per credit message
constexpr std::uint32_t kCtrlSlots = 32;     // control receives, 16 bytes each
constexpr std::uint64_t kCtrlWr = 1ull << 62;  // wr_id tag of control sends and receives
constexpr std::uint16_t kDefaultPort = 20050;
// A waiting server gives up on a silent client only after this long (a lost connection
// ends the wait at once through flushed receives).
constexpr std::chrono::milliseconds kRunTimeout{600000};

enum PerfControl : std::uint32_t { kFin = 1, kDone = 2, kCredit = 3, kSync = 4, kSynced = 5 };

// --spin-us: how long idle busy polls spin before yielding (both ends of this process).
std::optional<std::chrono::microseconds> g_spin;
// --wait: how the application threads wait for completions.
WaitPolicy g_wait = WaitPolicy::poll;

void apply_spin(Endpoint& ep) {
  if (g_spin) ep.set_spin(*g_spin);
}

// --pin: each end's application thread keeps to one CPU of the allowed ones (`slot` 0 the
// server's, 1 the client's), as perftest runs under taskset: the peercm run and the TCP
// baseline alike, the placement two hosts would have. Left to the scheduler, the baseline's
// two blocking threads share one CPU in some runs (each wake-up then a plain context switch)
// and not in others, and its latency changed about threefold between runs. The one-CPU
// placement, which only a loopback run can have, is measured on its own (tcp_one_cpu).
bool g_pin = false;

class PinScope {
 public:
  explicit PinScope(std::size_t slot) {
    if (!g_pin || pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_) != 0) return;
    std::size_t seen = 0;
    for (std::size_t cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &saved_) || seen++ != slot) continue;
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      pinned_ = pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
      return;
    }
  }
  ~PinScope() {
    if (pinned_) pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_);
  }
  PinScope(const PinScope&) = delete;
  PinScope& operator=(const PinScope&) = delete;

 private:
  cpu_set_t saved_{};
  bool pinned_ = false;
};

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Hello {
  PerfParams params;
  std::uint64_t addr = 0;
  std::uint32_t rkey = 0;
};

std::vector<std::uint8_t> encode_hello(const Hello& h) {
  ByteWriter w;
  w.u32(kHelloMagic).u8(kVersion).u8(static_cast<std::uint8_t>(h.params.op));
  w.u8(static_cast<std::uint8_t>(h.params.mode)).u8(0);
  w.u32(h.params.size).u64(h.params.iters).u32(h.params.warmup).u32(h.params.window);
  w.u64(h.addr).u32(h.rkey);
  return std::move(w.bytes());
}

std::optional<Hello> decode_hello(std::span<const std::uint8_t> bytes) {
  ByteReader r(bytes);
  if (r.u32() != kHelloMagic || r.u8() != kVersion) return std::nullopt;
  const std::uint8_t op = r.u8();
  const std::uint8_t mode = r.u8();
  r.u8();
  Hello h;
  h.params.size = r.u32();
  h.params.iters = r.u64();
  h.params.warmup = r.u32();
  h.params.window = r.u32();
  h.addr = r.u64();
  h.rkey = r.u32();
  if (!r.ok() || op > 2 || mode > 1 || h.params.size == 0 || h.params.size > kMaxSize || h.params.window == 0 ||
      h.params.window > kMaxWindow)
    return std::nullopt;
  h.params.op = static_cast<PerfOp>(op);
  h.params.mode = static_cast<PerfMode>(mode);
  return h;
}

struct Grant {
  std::uint64_t addr = 0;
  std::uint32_t rkey = 0;
  std::uint32_t recv_depth = 0;
};

std::vector<std::uint8_t> encode_grant(const Grant& g) {
  ByteWriter w;
  w.u32(kAcceptMagic).u64(g.addr).u32(g.rkey).u32(g.recv_depth);
  return std::move(w.bytes());
}

std::optional<Grant> decode_grant(std::span<const std::uint8_t> bytes) {
  ByteReader r(bytes);
  if (r.u32() != kAcceptMagic) return std::nullopt;
  Grant g;
  g.addr = r.u64();
  g.rkey = r.u32();
  g.recv_depth = r.u32();
  if (!r.ok()) return std::nullopt;
  return g;
}

EndpointConfig perf_config(const PerfParams& p) {
  EndpointConfig c;
  c.caps.max_send_wr = std::max<std::uint32_t>(p.window, 16) + 64;
  c.caps.max_recv_wr = kRecvDepth + kCtrlSlots + 16;
  c.cq_capacity = c.caps.max_send_wr + c.caps.max_recv_wr + 64;
  c.sig_all = false;
  c.wait = g_wait;  // default: busy polling, as perftest does
  return c;
}

bool is_send(const WorkCompletion& wc) { return wc.opcode != WcOpcode::recv && wc.opcode != WcOpcode::recv_rdma_with_imm; }

// The buffers of one side. `rx` takes Sends (slot of max(size, 16) bytes), remote writes
// and read responses, and is the source of remote reads; `ctrl_rx` has kCtrlSlots slots.
struct Buffers {
  Buffers(Endpoint& ep, const PerfParams& p)
      : cap(std::max<std::size_t>(p.size, kControlSize)),
        tx(ep.add_buffer(cap)),
        rx(ep.add_buffer(cap, kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead)),
        ctrl_tx(ep.add_buffer(kControlSize)),
        ctrl_rx(ep.add_buffer(kControlSize * kCtrlSlots)) {}
  std::size_t cap;
  Buffer& tx;
  Buffer& rx;
  Buffer& ctrl_tx;
  Buffer& ctrl_rx;
};

void post_ctrl_recv(Endpoint& ep, Buffers& b, std::uint32_t slot) {
  ep.post_recv(b.ctrl_rx, slot * kControlSize, kControlSize, kCtrlWr + slot);
}

// The control message a receive completion carries (from its control slot, or from rx).
Control control_of(Buffers& b, const WorkCompletion& wc) {
  if (wc.byte_len != kControlSize) return Control{};
  if (wc.wr_id >= kCtrlWr) {
    const std::size_t slot = static_cast<std::size_t>(wc.wr_id - kCtrlWr);
    return decode_control(std::span(b.ctrl_rx.data() + slot * kControlSize, kControlSize));
  }
  return decode_control(std::span(b.rx.data(), kControlSize));
}

void send_control(Endpoint& ep, Buffers& b, PerfControl kind, std::uint32_t value = 0) {
  encode_control(Control{.kind = kind, .value = value}, b.ctrl_tx.span());
  ep.post_send(b.ctrl_tx, 0, kControlSize, kCtrlWr, kSendSignaled);
}

// Busy-polls a batch; throws after `timeout` without any completion.
class Poller {
 public:
  explicit Poller(Endpoint& ep, std::chrono::milliseconds timeout = kWaitTimeout) : ep_(ep), timeout_(timeout) {}
  std::span<const WorkCompletion> poll() {
    const std::size_t n = ep_.poll(batch_);
    if (n > 0) {
      last_ = Clock::now();
      idle_ = 0;
    } else if (++idle_ % 64 == 0) {
      const auto now = Clock::now();
      if (now - last_ > timeout_)
        throw ToolError(fmt::format("no completion for {} ms (QP state {})", timeout_.count(),
                                    to_string(ep_.qp().state())));
      const std::size_t found = ep_.idle(last_, now, last_ + timeout_, batch_);
      if (found > 0) last_ = Clock::now();
      return std::span(batch_, found);
    }
    return std::span(batch_, n);
  }

 private:
  Endpoint& ep_;
  std::chrono::milliseconds timeout_;
  WorkCompletion batch_[32];
  Clock::time_point last_ = Clock::now();
  unsigned idle_ = 0;
};

// Client: sends "fin" and waits for "done", handling late credits.
void client_finish(Endpoint& ep, Buffers& b) {
  send_control(ep, b, kFin);
  Poller poller(ep);
  for (;;) {
    for (const WorkCompletion& wc : poller.poll()) {
      if (is_send(wc)) continue;
      const Control c = control_of(b, wc);
      if (c.kind == kDone) return;
      if (wc.wr_id >= kCtrlWr) post_ctrl_recv(ep, b, static_cast<std::uint32_t>(wc.wr_id - kCtrlWr));
    }
  }
}

// Server: waits for "fin" (the client is done with our memory), answers "done". A "sync"
// (after the warm-up of a Write bw run) is answered, its control receive posted again first.
void server_finish(Endpoint& ep, Buffers& b) {
  Poller poller(ep, kRunTimeout);
  for (;;) {
    for (const WorkCompletion& wc : poller.poll()) {
      if (is_send(wc)) continue;
      const std::uint32_t kind = control_of(b, wc).kind;
      if (kind == kFin) {
        send_control(ep, b, kDone);
        return;
      }
      if (kind == kSync && wc.wr_id >= kCtrlWr) {
        post_ctrl_recv(ep, b, static_cast<std::uint32_t>(wc.wr_id - kCtrlWr));
        send_control(ep, b, kSynced);
      }
    }
  }
}

std::uint8_t marker(std::uint64_t i) { return static_cast<std::uint8_t>(i % 255 + 1); }

std::uint8_t last_byte(Buffer& buffer, std::size_t size) {
  return std::atomic_ref<std::uint8_t>(buffer.data()[size - 1]).load(std::memory_order_acquire);
}

// Spins until the last byte of rx is `want`, draining completions meanwhile.
void wait_marker(Endpoint& ep, Buffer& rx, std::size_t size, std::uint8_t want) {
  Poller poller(ep);
  while (last_byte(rx, size) != want) poller.poll();
}

// --- client (active side) ---

Measurement client_lat(Endpoint& ep, Buffers& b, const PerfParams& p, const Grant& g) {
  Measurement m;
  m.samples.reserve(p.iters);
  const std::uint64_t n = p.warmup + p.iters;
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    switch (p.op) {
      case PerfOp::send:
        ep.post_send(b.tx, 0, p.size, i, kSendSignaled);
        // Two receives are posted: the reply lands in the spare one while the receive the
        // last reply took is replaced, so reposting is not part of the round trip.
        if (i > 0) ep.post_recv(b.rx, 0, b.cap, i - 1);
        ep.wait_for(WcOpcode::recv, [](const WorkCompletion&) {});
        break;
      case PerfOp::write:
        b.tx.data()[p.size - 1] = marker(i);
        ep.post_write(b.tx, 0, p.size, g.addr, g.rkey, i, kSendSignaled);
        wait_marker(ep, b.rx, p.size, marker(i));
        break;
      case PerfOp::read:
        ep.post_read(b.rx, 0, p.size, g.addr, g.rkey, i, kSendSignaled);
        ep.wait_for(WcOpcode::rdma_read, [](const WorkCompletion&) {});
        break;
    }
    const double us = micros(Clock::now() - t0);
    if (i >= p.warmup) m.samples.push_back(p.op == PerfOp::read ? us : us / 2);
  }
  if (p.op == PerfOp::send && n > 0) ep.post_recv(b.rx, 0, b.cap, n - 1);  // both receives posted again
  return m;
}

// The client's side of a bw run: keeps the window full within the server's credits.
class BwStream {
 public:
  BwStream(Endpoint& ep, Buffers& b, const PerfParams& p, const Grant& g)
      : ep_(ep),
        b_(b),
        p_(p),
        g_(g),
        credits_(p.op == PerfOp::send ? g.recv_depth : ~std::uint64_t{0}),
        // Every `signal_every_`-th work request is signaled; at least one of a full window is.
        signal_every_(std::min(kSignalEvery, p.window)),
        poller_(ep) {}

  // Posts `count` more messages and returns once each has completed here.
  void run(std::uint64_t count) {
    const std::uint64_t last = posted_ + count;
    while (retired_ < last) {
      while (posted_ < last && credits_ > 0 && posted_ - retired_ < p_.window) {
        const std::uint64_t id = ++posted_;
        const std::uint32_t flags = (id % signal_every_ == 0 || id == last) ? std::uint32_t{kSendSignaled} : 0u;
        switch (p_.op) {
          case PerfOp::send:
            ep_.post_send(b_.tx, 0, p_.size, id, flags);
            --credits_;
            break;
          case PerfOp::write: ep_.post_write(b_.tx, 0, p_.size, g_.addr, g_.rkey, id, flags); break;
          case PerfOp::read: ep_.post_read(b_.rx, 0, p_.size, g_.addr, g_.rkey, id, flags); break;
        }
      }
      poll_once();
    }
  }

  // Send, Write: "sync" behind the data and its answer; the server has every byte after it.
  void sync() {
    await_credit();
    if (p_.op == PerfOp::send) --credits_;  // the sync consumes one of the credited receives
    send_control(ep_, b_, kSync);
    while (!synced_) poll_once();
  }

  // Sends "fin" and waits for "done" (with a credit in hand for Send: the fin takes a receive).
  void finish() {
    await_credit();
    client_finish(ep_, b_);
  }

 private:
  // Send: a control message takes one of the server's receives, so one must be credited.
  void await_credit() {
    while (p_.op == PerfOp::send && credits_ == 0) poll_once();
  }

  void poll_once() {
    for (const WorkCompletion& wc : poller_.poll()) {
      if (is_send(wc)) {
        if (wc.wr_id < kCtrlWr) retired_ = std::max(retired_, wc.wr_id);
        continue;
      }
      const Control c = control_of(b_, wc);
      if (c.kind == kCredit) credits_ += c.value;
      if (c.kind == kSynced) synced_ = true;
      post_ctrl_recv(ep_, b_, static_cast<std::uint32_t>(wc.wr_id - kCtrlWr));
    }
  }

  Endpoint& ep_;
  Buffers& b_;
  const PerfParams& p_;
  const Grant& g_;
  std::uint64_t posted_ = 0;
  std::uint64_t retired_ = 0;
  std::uint64_t credits_;
  std::uint32_t signal_every_;
  bool synced_ = false;
  Poller poller_;
};

Measurement client_bw(Endpoint& ep, Buffers& b, const PerfParams& p, const Grant& g) {
  Measurement m;
  BwStream stream(ep, b, p, g);
  if (p.warmup > 0) {
    stream.run(p.warmup);
    if (p.op != PerfOp::read) stream.sync();  // a completed Read has all its bytes here
  }
  const auto t0 = Clock::now();
  stream.run(p.iters);
  if (p.op == PerfOp::read) {
    m.seconds = std::chrono::duration<double>(Clock::now() - t0).count();  // every byte is here
    client_finish(ep, b);
  } else {
    // Sends and writes have left; the data is all at the server once it answers "fin".
    stream.finish();
    m.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  m.bytes = p.iters * p.size;
  return m;
}

Measurement run_peercm_client(Device& device, const sockaddr_in& destination, std::optional<std::int64_t> crc,
                              const PerfParams& p) {
  Endpoint ep(device, resolve(device, destination, crc), perf_config(p));
  apply_spin(ep);
  Buffers b(ep, p);
  if (p.mode == PerfMode::lat && p.op == PerfOp::send) {
    ep.post_recv(b.rx, 0, b.cap, 0);
    ep.post_recv(b.rx, 0, b.cap, 1);
  } else {
    const std::uint32_t slots = p.op == PerfOp::send ? kCtrlSlots : 1;
    for (std::uint32_t s = 0; s < slots; ++s) post_ctrl_recv(ep, b, s);
  }
  ConnParam param;
  param.private_data = encode_hello(Hello{.params = p, .addr = b.rx.address(), .rkey = b.rx.rkey()});
  const auto grant = decode_grant(ep.connect(param).private_data);
  if (!grant) throw ToolError("the server's accept carries no valid buffer grant");
  Measurement m = p.mode == PerfMode::lat ? client_lat(ep, b, p, *grant) : client_bw(ep, b, p, *grant);
  if (p.mode == PerfMode::lat) client_finish(ep, b);
  ep.close();
  return m;
}

// --- server (passive side) ---

void server_lat(Endpoint& ep, Buffers& b, const PerfParams& p, const Hello& h) {
  const std::uint64_t n = p.warmup + p.iters;
  switch (p.op) {
    case PerfOp::send:
      for (std::uint64_t i = 0; i < n; ++i) {
        ep.wait_for(WcOpcode::recv, [](const WorkCompletion&) {});
        // The answer first: the client's next message takes the spare receive.
        ep.post_send(b.tx, 0, p.size, i, kSendSignaled);
        ep.post_recv(b.rx, 0, b.cap, i);
      }
      break;
    case PerfOp::write:
      for (std::uint64_t i = 0; i < n; ++i) {
        wait_marker(ep, b.rx, p.size, marker(i));
        b.tx.data()[p.size - 1] = marker(i);
        ep.post_write(b.tx, 0, p.size, h.addr, h.rkey, i, kSendSignaled);
      }
      break;
    case PerfOp::read: break;  // the client reads our memory
  }
  server_finish(ep, b);
}

void server_bw_send(Endpoint& ep, Buffers& b, const PerfParams& p) {
  // Receives arrive in order: the warm-up messages, their sync, the measured ones, the fin.
  const std::uint64_t sync_at = p.warmup > 0 ? p.warmup + 1 : 0;
  const std::uint64_t before_fin = p.warmup + p.iters + (sync_at > 0 ? 1 : 0);
  std::uint64_t received = 0;
  std::uint32_t since_credit = 0;
  Poller poller(ep);
  while (received < before_fin) {
    for (const WorkCompletion& wc : poller.poll()) {
      if (is_send(wc)) continue;
      ++received;
      ep.post_recv(b.rx, 0, b.cap, received);
      if (received > before_fin) {  // the fin, in the same batch as the last messages
        send_control(ep, b, kDone);
        return;
      }
      if (received == sync_at) send_control(ep, b, kSynced);
      if (++since_credit == kCreditBatch && received < before_fin) {
        send_control(ep, b, kCredit, since_credit);
        since_credit = 0;
      }
    }
  }
  server_finish(ep, b);
}

// Serves one perf client on an accepted request: returns the client's parameters.
PerfParams serve_peercm(Device& device, EventStash& stash, CmEvent request) {
  const auto hello = decode_hello(request.param.private_data);
  std::unique_ptr<CmId> id = std::move(request.new_id);
  if (!hello) {
    [[maybe_unused]] auto r = id->reject();
    throw ToolError(fmt::format("rejected {}: malformed perf request, or one from another version of peercm perf",
                                format_address(id->peer_address())));
  }
  const PerfParams& p = hello->params;
  Endpoint ep(device, std::move(id), perf_config(p), &stash);
  apply_spin(ep);
  Buffers b(ep, p);
  std::uint32_t recv_depth = 0;
  if (p.op == PerfOp::send) {
    recv_depth = p.mode == PerfMode::lat ? 2 : kRecvDepth;
    for (std::uint32_t i = 0; i < recv_depth; ++i) ep.post_recv(b.rx, 0, b.cap, i);
  } else {
    post_ctrl_recv(ep, b, 0);
  }
  ConnParam param;
  param.private_data = encode_grant(Grant{.addr = b.rx.address(), .rkey = b.rx.rkey(), .recv_depth = recv_depth});
  ep.accept(param);
  if (p.mode == PerfMode::lat) {
    server_lat(ep, b, p, *hello);
  } else if (p.op == PerfOp::send) {
    server_bw_send(ep, b, p);
  } else {
    server_finish(ep, b);
  }
  // The client closes after "done"; then our memory may go.
  ep.wait_event({CmEventType::disconnected});
  ep.close();
  return p;
}

// One client: the peercm run, then the TCP baseline on `tcp_listener`.
PerfParams serve_one(Device& device, EventStash& stash, Socket& tcp_listener, std::chrono::milliseconds wait) {
  auto request = next_request(device, stash, wait);
  if (!request) throw ToolError("no client connected");
  const PerfParams p = [&] {
    const PinScope pin(0);
    return serve_peercm(device, stash, std::move(*request));
  }();
  Socket tcp = tcp_accept(tcp_listener);
  const PinScope pin(0);
  tcp_server(tcp, p);
  return p;
}

struct Results {
  Measurement peercm;
  Measurement tcp;
  std::optional<Measurement> tcp_one_cpu;  // --loopback --pin, lat: both TCP ends on one CPU
  std::optional<Measurement> tcp_spin;     // --loopback --pin, lat: both TCP ends busy-polling
};

Results run_client_side(Device& device, const sockaddr_in& peercm_dst, const sockaddr_in& tcp_dst,
                        std::optional<std::int64_t> crc, const PerfParams& p) {
  Results r;
  {
    const PinScope pin(1);
    r.peercm = run_peercm_client(device, peercm_dst, crc, p);
  }
  Socket tcp = tcp_connect(tcp_dst);
  const PinScope pin(1);
  r.tcp = tcp_client(tcp, p);
  return r;
}

// The TCP ping-pong once more over loopback, its ends on the CPUs of the given pin slots.
Measurement tcp_loopback(const PerfParams& p, std::size_t server_slot, std::size_t client_slot, TcpWait wait,
                         std::string_view name) {
  Socket listener = tcp_listen(*parse_address("127.0.0.1", 0));
  std::string server_error;
  std::thread server([&] {
    try {
      const PinScope pin(server_slot);
      Socket tcp = tcp_accept(listener);
      tcp_server(tcp, p, wait);
    } catch (const std::exception& e) {
      server_error = e.what();
    }
  });
  Measurement m;
  try {
    const PinScope pin(client_slot);
    Socket tcp = tcp_connect(*parse_address("127.0.0.1", local_port(listener)));
    m = tcp_client(tcp, p, wait);
  } catch (...) {
    server.join();
    throw;
  }
  server.join();
  if (!server_error.empty()) throw ToolError(fmt::format("tcp {} baseline: {}", name, server_error));
  return m;
}

// Both ends on the first CPU: each wake-up a plain context switch.
Measurement tcp_one_cpu(const PerfParams& p) { return tcp_loopback(p, 0, 0, TcpWait::block, "one-cpu"); }
// Both ends busy-polling on their own CPUs: what a polling stack over TCP sockets cannot beat.
Measurement tcp_spin(const PerfParams& p) { return tcp_loopback(p, 0, 1, TcpWait::spin, "spin"); }

// --- options and output ---

struct PerfOptions {
  bool loopback = false;
  bool pin = false;
  bool server = false;
  std::string client;
  std::string bind;
  std::uint16_t port = kDefaultPort;
  bool once = false;
  std::string op = "send";
  std::string mode = "lat";
  std::uint32_t size = 8;
  std::uint64_t iters = 0;
  std::int64_t warmup = -1;
  std::uint32_t window = 64;
  std::string crc;
  std::string progress = "thread";
  std::string transport = "iwarp";
  double drop = 0;
  std::int64_t spin_us = -1;
  std::string wait = "poll";
  bool json = false;
};

PerfParams params_from(const PerfOptions& o) {
  PerfParams p;
  p.op = o.op == "write" ? PerfOp::write : o.op == "read" ? PerfOp::read : PerfOp::send;
  p.mode = o.mode == "bw" ? PerfMode::bw : PerfMode::lat;
  p.size = o.size;
  p.window = o.window;
  p.iters = o.iters;
  if (p.iters == 0) {
    if (p.mode == PerfMode::lat) {
      // 1000 round trips, fewer for large messages (at least 100, about 64 MiB each way).
      p.iters = p.size <= (64u << 10) ? 1000 : std::max<std::uint64_t>(100, (64ull << 20) / p.size);
    } else {
      // Roughly 1 s on loopback: 1 GiB (1024 messages of 1 MiB), at least 256 messages,
      // at most 100000 (small messages are bound by per-message costs).
      p.iters = std::clamp<std::uint64_t>((1ull << 30) / p.size, 256, 100000);
    }
  }
  // bw: 16 messages, the warm-up the side-by-side suite gives ucx_perftest (-w 16).
  const std::uint64_t default_warmup = p.mode == PerfMode::lat ? std::min<std::uint64_t>(100, p.iters / 10)
                                                               : std::min<std::uint64_t>(16, p.iters);
  p.warmup = o.warmup >= 0 ? static_cast<std::uint32_t>(o.warmup) : static_cast<std::uint32_t>(default_warmup);
  return p;
}

nlohmann::json detail_json(const PerfParams& p, const Measurement& m) {
  if (p.mode == PerfMode::lat) {
    const Summary s = summarize(m.samples);
    return {{"median", s.median}, {"average", s.average}, {"min", s.min}, {"max", s.max}, {"p99", s.p99}};
  }
  return {{"bytes", m.bytes}, {"seconds", m.seconds}};
}

// The TCP baselines only a --pin latency run has: JSON name, table row, ratio row.
struct ExtraBaseline {
  const char* key;
  const char* row;
  const char* ratio_label;
  const std::optional<Measurement>* measurement;
};
std::array<ExtraBaseline, 2> extra_baselines(const Results& r) {
  return {ExtraBaseline{"one_cpu", "tcp, one CPU", "ratio to one CPU", &r.tcp_one_cpu},
          ExtraBaseline{"spin", "tcp, busy-polling", "ratio to polling", &r.tcp_spin}};
}

void print_results(const PerfOptions& o, const PerfParams& p, const Results& r) {
  const double peercm = headline(p, r.peercm);
  const double tcp = headline(p, r.tcp);
  const double ratio = tcp > 0 ? peercm / tcp : 0.0;
  const std::string crc = o.crc.empty() ? "default" : o.crc;
  const char* unit = p.mode == PerfMode::lat ? "us" : "MB/s";
  if (o.json) {
    nlohmann::json out{{"op", to_string(p.op)},
                       {"mode", to_string(p.mode)},
                       {"size", p.size},
                       {"iters", p.iters},
                       {"unit", unit},
                       {"peercm", peercm},
                       {"tcp", tcp},
                       {"ratio", ratio},
                       {"transport", o.transport},
                       {"progress", o.progress},
                       {"wait", o.wait},
                       {"crc", crc},
                       {"peercm_detail", detail_json(p, r.peercm)},
                       {"tcp_detail", detail_json(p, r.tcp)}};
    if (o.drop > 0) out["drop"] = o.drop;
    for (const ExtraBaseline& extra : extra_baselines(r)) {
      if (!*extra.measurement) continue;
      const double value = headline(p, **extra.measurement);
      out[fmt::format("tcp_{}", extra.key)] = value;
      out[fmt::format("ratio_{}", extra.key)] = value > 0 ? peercm / value : 0.0;
      out[fmt::format("tcp_{}_detail", extra.key)] = detail_json(p, **extra.measurement);
    }
    out["warmup"] = p.warmup;
    if (p.mode == PerfMode::lat) {
      out["statistic"] = p.op == PerfOp::read ? "median completion time" : "median one-way (RTT/2)";
    } else {
      out["window"] = p.window;
    }
    fmt::print("{}\n", out.dump());
    return;
  }
  if (p.mode == PerfMode::lat) {
    fmt::print("peercm perf: {} lat, {} B, {} iterations (+{} warm-up), progress {}, crc {}\n", to_string(p.op),
               p.size, p.iters, p.warmup, o.progress, crc);
    fmt::print("  {} latency, us\n", p.op == PerfOp::read ? "RDMA Read completion" : "one-way (RTT/2)");
    fmt::print("  {:<18} {:>10} {:>10} {:>10} {:>10}\n", "", "median", "average", "min", "p99");
    for (auto [name, m] : {std::pair{"peercm", &r.peercm}, std::pair{"tcp", &r.tcp}}) {
      const Summary s = summarize(m->samples);
      fmt::print("  {:<18} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", name, s.median, s.average, s.min, s.p99);
    }
    for (const ExtraBaseline& extra : extra_baselines(r)) {
      if (!*extra.measurement) continue;
      const Summary s = summarize((*extra.measurement)->samples);
      fmt::print("  {:<18} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", extra.row, s.median, s.average, s.min, s.p99);
    }
    fmt::print("  {:<18} {:>10.2f}\n", "ratio peercm/tcp", ratio);
    for (const ExtraBaseline& extra : extra_baselines(r)) {
      if (!*extra.measurement) continue;
      const double value = headline(p, **extra.measurement);
      fmt::print("  {:<18} {:>10.2f}\n", extra.ratio_label, value > 0 ? peercm / value : 0.0);
    }
  } else {
    fmt::print("peercm perf: {} bw, {} B x {} ({:.1f} MB, +{} warm-up), window {}, progress {}, crc {}\n",
               to_string(p.op), p.size, p.iters, static_cast<double>(p.size) * static_cast<double>(p.iters) / 1e6,
               p.warmup, p.window, o.progress, crc);
    fmt::print("  {:<18} {:>10.1f} MB/s ({:.3f} s)\n", "peercm", peercm, r.peercm.seconds);
    fmt::print("  {:<18} {:>10.1f} MB/s ({:.3f} s)\n", "tcp", tcp, r.tcp.seconds);
    fmt::print("  {:<18} {:>10.2f}\n", "ratio peercm/tcp", ratio);
  }
}

int run_loopback(const PerfOptions& o) {
  const PerfParams p = params_from(o);
  const auto crc = crc_option(o.crc);
  const ProgressMode mode = progress_option(o.progress);
  const Transport transport = transport_option(o.transport);
  // Each context drops its own datagrams: both directions of the wire lose `drop`.
  Device server_device(mode, transport, RoceFaults{.drop = o.drop, .seed = 1});
  Device client_device(mode, transport, RoceFaults{.drop = o.drop, .seed = 2});
  const std::uint16_t port = o.loopback && o.port != kDefaultPort ? o.port : 0;
  // A RoCE node is an address, and (address, 4791) one socket: the server takes a random
  // 127/8 address so that runs side by side do not collide (the client gets its own).
  const std::string server_host = transport == Transport::roce ? random_loopback_host() : "127.0.0.1";
  auto listener = listen_on(server_device, *parse_address(server_host, port), crc);
  Socket tcp_listener = tcp_listen(*parse_address("127.0.0.1", port ? static_cast<std::uint16_t>(port + 1) : 0));
  const sockaddr_in peercm_dst = *parse_address(server_host, ntohs(listener->local_address().sin_port));
  const sockaddr_in tcp_dst = *parse_address("127.0.0.1", local_port(tcp_listener));

  std::string server_error;
  std::thread server([&] {
    try {
      EventStash stash;
      serve_one(server_device, stash, tcp_listener, kWaitTimeout);
    } catch (const std::exception& e) {
      server_error = e.what();
    }
  });
  std::string client_error;
  Results results;
  try {
    results = run_client_side(client_device, peercm_dst, tcp_dst, crc, p);
  } catch (const std::exception& e) {
    client_error = e.what();
  }
  server.join();
  if (client_error.empty() && server_error.empty() && g_pin && p.mode == PerfMode::lat) {
    try {
      results.tcp_one_cpu = tcp_one_cpu(p);
      results.tcp_spin = tcp_spin(p);
    } catch (const std::exception& e) {
      client_error = e.what();
    }
  }
  if (!client_error.empty()) fmt::print(stderr, "peercm perf: error: {}\n", client_error);
  if (!server_error.empty()) fmt::print(stderr, "peercm perf: server error: {}\n", server_error);
  if (!client_error.empty() || !server_error.empty()) return 1;
  print_results(o, p, results);
  return 0;
}

int run_client(const PerfOptions& o) {
  const PerfParams p = params_from(o);
  const auto peercm_dst = parse_address(o.client, o.port);
  const auto tcp_dst = parse_address(o.client, static_cast<std::uint16_t>(o.port + 1));
  if (!peercm_dst || !tcp_dst) throw ToolError(fmt::format("cannot resolve '{}'", o.client));
  Device device(progress_option(o.progress), transport_option(o.transport));
  if (!o.bind.empty()) {
    device.source = parse_address(o.bind, 0);
    if (!device.source) throw ToolError(fmt::format("cannot resolve bind address '{}'", o.bind));
  }
  const Results results = run_client_side(device, *peercm_dst, *tcp_dst, crc_option(o.crc), p);
  print_results(o, p, results);
  return 0;
}

int run_server(const PerfOptions& o) {
  const auto address = parse_address(o.bind, o.port);
  if (!address) throw ToolError(fmt::format("cannot resolve bind address '{}'", o.bind));
  Device device(progress_option(o.progress), transport_option(o.transport));
  auto listener = listen_on(device, *address, crc_option(o.crc));
  sockaddr_in tcp_address = *address;
  tcp_address.sin_port = htons(static_cast<std::uint16_t>(ntohs(listener->local_address().sin_port) + 1));
  Socket tcp_listener = tcp_listen(tcp_address);
  fmt::print(stderr, "peercm perf: listening on {} (tcp baseline on port {})\n",
             format_address(listener->local_address()), local_port(tcp_listener));
  std::fflush(stderr);
  EventStash stash;
  int status = 0;
  for (;;) {
    try {
      const PerfParams p = serve_one(device, stash, tcp_listener, std::chrono::milliseconds(-1));
      if (!o.json)
        fmt::print("served: {} {} size {} iters {}\n", to_string(p.op), to_string(p.mode), p.size, p.iters);
      std::fflush(stdout);
    } catch (const ToolError& e) {
      fmt::print(stderr, "peercm perf server: error: {}\n", e.what());
      status = 1;
    }
    if (o.once) break;
  }
  return status;
}

}  // namespace

void add_perf(CLI::App& app) {
  auto o = std::make_shared<PerfOptions>();
  auto* cmd = app.add_subcommand("perf", "Latency and bandwidth of send/write/read, side by side with plain TCP");
  cmd->option_defaults()->always_capture_default();
  auto* loopback = cmd->add_flag("--loopback", o->loopback, "Run both ends in this process over 127.0.0.1");
  auto* server = cmd->add_flag("--server", o->server, "Run the server end (the TCP baseline listens on port+1)");
  auto* client = cmd->add_option("--client", o->client, "Run the client end against ADDR")->type_name("ADDR");
  loopback->excludes(server)->excludes(client);
  server->excludes(client);
  cmd->add_option("--bind", o->bind, "Server: address to listen on (default: all); client: address to connect from")->type_name("ADDR");
  cmd->add_option("--port", o->port, "Port of the peercm listener (the TCP baseline uses port+1)");
  cmd->add_flag("--once", o->once, "Server: exit after one client");
  cmd->add_option("--op", o->op, "Operation")->check(CLI::IsMember({"send", "write", "read"}));
  cmd->add_option("--mode", o->mode, "lat (latency) or bw (bandwidth)")->check(CLI::IsMember({"lat", "bw"}));
  cmd->add_option("--size", o->size, "Message size in bytes")->check(CLI::Range(1u, kMaxSize));
  cmd->add_option("--iters", o->iters, "Iterations (lat) or messages (bw); 0: automatic");
  cmd->add_option("--warmup", o->warmup,
                  "warm-up iterations (lat) or messages (bw), not measured (-1: lat min(100, iters/10), bw "
                  "min(16, iters))");
  cmd->add_option("--window", o->window, "bw: outstanding work requests")->check(CLI::Range(1u, kMaxWindow));
  cmd->add_option("--crc", o->crc, "MPA CRC: on (required) or off (default: the library's preference)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--progress", o->progress, "Progress mode of the peercm contexts")
      ->check(CLI::IsMember({"thread", "inline"}));
  cmd->add_option("--transport", o->transport, "iwarp (MPA over TCP) or roce (RoCEv2 over UDP 4791)")
      ->check(CLI::IsMember({"iwarp", "roce"}));
  cmd->add_option("--drop", o->drop,
                  "--loopback --transport roce: each end drops this fraction of the UDP datagrams it sends "
                  "(a lossy wire; RC recovers)")
      ->check(CLI::Range(0.0, 0.5));
  cmd->add_option("--spin-us", o->spin_us,
                  "Idle busy polls spin this long before yielding the CPU or, with --wait hybrid, "
                  "sleeping (-1: the default, 50)");
  cmd->add_option("--wait", o->wait,
                  "poll: busy-poll the CQ (perftest style); block: sleep on the completion channel; "
                  "hybrid: busy-poll for the spin budget, then sleep")
      ->check(CLI::IsMember({"poll", "block", "hybrid"}));
  cmd->add_flag("--pin", o->pin,
                "Pin each end's application thread to its own CPU (server: the first allowed CPU, client: the "
                "second), as perftest under taskset, in the peercm run and in the TCP baseline; with --loopback in "
                "lat mode, also measure TCP with both ends on the first CPU (tcp_one_cpu) and with both ends busy-polling "
                "on their own CPUs (tcp_spin)");
  cmd->add_flag("--json", o->json, "Print the result as JSON");
  cmd->callback([o] {
    if (o->spin_us >= 0) g_spin = std::chrono::microseconds(o->spin_us);
    g_pin = o->pin;
    g_wait = o->wait == "block" ? WaitPolicy::block : o->wait == "hybrid" ? WaitPolicy::hybrid : WaitPolicy::poll;
    if (!o->loopback && !o->server && o->client.empty())
      throw CLI::ValidationError("perf", "give --loopback, --server or --client ADDR");
    if (o->drop > 0 && (!o->loopback || o->transport != "roce"))
      throw CLI::ValidationError("perf", "--drop needs --loopback --transport roce");
    try {
      exit_status = o->loopback ? run_loopback(*o) : o->server ? run_server(*o) : run_client(*o);
    } catch (const ToolError& e) {
      fmt::print(stderr, "peercm perf: error: {}\n", e.what());
      exit_status = 1;
    }
  });
}

}  // namespace peercm::tool
