// `peercm ping`: an rping-like client/server that moves a pattern with Send, RDMA Write or
// RDMA Read and verifies every byte of every iteration.
//
// Connect private data (client -> server): magic, version, op, size, count.
// Accept private data (server -> client): magic, buffer address, rkey, size.
// Per iteration i (the pattern depends on i and the byte index):
//   send:  client SENDs pattern(i); the server checks it and SENDs it back; client checks.
//   write: client RDMA WRITEs pattern(i) into the server buffer, then SENDs "written i";
//          the server checks its buffer and answers "status i ok|bad".
//   read:  client SENDs "prepare i"; the server fills its buffer with pattern(i) and
//          answers "ready i"; the client RDMA READs the buffer and checks it.
#include <fmt/core.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "endpoint.hpp"
#include "subcommands.hpp"

namespace peercm::tool {
namespace {

constexpr std::uint32_t kHelloMagic = 0x504D4350;   // "PCMP"
constexpr std::uint32_t kAcceptMagic = 0x414D4350;  // "PCMA"
constexpr std::uint8_t kVersion = 1;
constexpr std::size_t kMaxSize = std::size_t{1} << 30;

enum class Op : std::uint8_t { send = 0, write = 1, read = 2 };

enum ControlKind : std::uint32_t { kWritten = 1, kStatus = 2, kPrepare = 3, kReady = 4 };

std::string_view op_name(Op op) {
  switch (op) {
    case Op::send: return "send";
    case Op::write: return "write";
    case Op::read: return "read";
  }
  return "?";
}

std::optional<Op> parse_op(std::string_view name) {
  if (name == "send") return Op::send;
  if (name == "write") return Op::write;
  if (name == "read") return Op::read;
  return std::nullopt;
}

struct PingOptions {
  bool server = false;
  std::string client;
  std::string bind;
  std::uint16_t port = 20049;
  bool once = false;
  std::string op = "send";
  std::size_t size = 64;
  std::uint32_t count = 10;
  std::string crc;
  std::string progress = "thread";
  std::string transport = "iwarp";
  bool json = false;
  bool verbose = false;
};

struct Hello {
  Op op = Op::send;
  std::uint64_t size = 0;
  std::uint32_t count = 0;
};

std::vector<std::uint8_t> encode_hello(const Hello& h) {
  ByteWriter w;
  w.u32(kHelloMagic).u8(kVersion).u8(static_cast<std::uint8_t>(h.op)).u16(0).u64(h.size).u32(h.count);
  return std::move(w.bytes());
}

std::optional<Hello> decode_hello(std::span<const std::uint8_t> bytes) {
  ByteReader r(bytes);
  if (r.u32() != kHelloMagic || r.u8() != kVersion) return std::nullopt;
  const std::uint8_t op = r.u8();
  r.u16();
  Hello h;
  h.size = r.u64();
  h.count = r.u32();
  if (!r.ok() || op > 2 || h.size == 0 || h.size > kMaxSize) return std::nullopt;
  h.op = static_cast<Op>(op);
  return h;
}

struct Grant {
  std::uint64_t addr = 0;
  std::uint32_t rkey = 0;
  std::uint64_t size = 0;
};

std::vector<std::uint8_t> encode_grant(const Grant& g) {
  ByteWriter w;
  w.u32(kAcceptMagic).u64(g.addr).u32(g.rkey).u64(g.size);
  return std::move(w.bytes());
}

std::optional<Grant> decode_grant(std::span<const std::uint8_t> bytes) {
  ByteReader r(bytes);
  if (r.u32() != kAcceptMagic) return std::nullopt;
  Grant g;
  g.addr = r.u64();
  g.rkey = r.u32();
  g.size = r.u64();
  if (!r.ok()) return std::nullopt;
  return g;
}

EndpointConfig ping_config() {
  EndpointConfig config;
  config.cq_capacity = 64;
  config.caps.max_send_wr = 16;
  config.caps.max_recv_wr = 16;
  config.sig_all = true;
  config.wait = WaitPolicy::block;  // sleep between completions: ping is not a benchmark
  return config;
}

// Counts the data errors of a run and reports the first few.
struct Verifier {
  std::uint32_t verified = 0;
  std::uint32_t errors = 0;
  std::string_view who;

  void check(std::span<const std::uint8_t> bytes, std::uint32_t iter, std::size_t expected_len,
             std::size_t byte_len) {
    if (byte_len != expected_len) {
      report(fmt::format("iteration {}: received {} bytes, expected {}", iter, byte_len, expected_len));
      return;
    }
    if (auto at = find_mismatch(bytes, iter)) {
      report(fmt::format("iteration {}: byte {} is 0x{:02x}, expected 0x{:02x}", iter, *at, bytes[*at],
                         pattern_byte(iter, *at)));
      return;
    }
    ++verified;
  }
  void report(const std::string& what) {
    if (++errors <= 5) fmt::print(stderr, "peercm ping {}: data error: {}\n", who, what);
  }
};

// What one side has outstanding on its QP: sends whose completions have not come yet, and
// receive completions that came while it waited for a send's. Over RoCE a send completes on
// the peer's ACK, and the peer may coalesce that ACK behind its next message: RC orders
// neither direction against the other, so the next receive can complete first.
struct Outstanding {
  int sends = 0;
  std::deque<WorkCompletion> receives;
};

// Waits for the next receive completion, retiring the send-side completions seen meanwhile.
WorkCompletion wait_recv(Endpoint& ep, Outstanding& pending) {
  if (!pending.receives.empty()) {
    const WorkCompletion wc = pending.receives.front();
    pending.receives.pop_front();
    return wc;
  }
  return ep.wait_for(WcOpcode::recv, [&](const WorkCompletion&) { --pending.sends; });
}

void drain_sends(Endpoint& ep, Outstanding& pending) {
  while (pending.sends > 0) {
    const WorkCompletion wc = ep.wait_completion();
    if (wc.opcode == WcOpcode::recv) {
      pending.receives.push_back(wc);
      continue;
    }
    --pending.sends;
  }
}

void send_control(Endpoint& ep, Buffer& tx, const Control& c, Outstanding& pending) {
  encode_control(c, tx.span());
  ep.post_send(tx, 0, kControlSize, c.iter);
  ++pending.sends;
}

// --- server ---

// Serves one client; returns its count of data errors. Throws ToolError on failures.
std::uint32_t serve_client(Device& device, EventStash& stash, CmEvent request, const PingOptions& opts) {
  const auto hello = decode_hello(request.param.private_data);
  std::unique_ptr<CmId> id = std::move(request.new_id);
  const std::string peer = format_address(id->peer_address());
  if (!hello) {
    [[maybe_unused]] auto r = id->reject();
    throw ToolError(fmt::format("rejected {}: malformed ping request", peer));
  }
  Endpoint ep(device, std::move(id), ping_config(), &stash);
  const std::size_t size = hello->size;
  Outstanding pending;
  Verifier v{.who = "server"};

  Buffer* data[2] = {nullptr, nullptr};
  Buffer* ctrl_rx = nullptr;
  Buffer* ctrl_tx = nullptr;
  Grant grant{.size = size};
  if (hello->op == Op::send) {
    data[0] = &ep.add_buffer(size);
    data[1] = &ep.add_buffer(size);
    ep.post_recv(*data[0], 0, size, 0);
    ep.post_recv(*data[1], 0, size, 1);
  } else {
    // The grant gives remote read and write access, as rping does.
    data[0] = &ep.add_buffer(size, kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead);
    ctrl_rx = &ep.add_buffer(kControlSize);
    ctrl_tx = &ep.add_buffer(kControlSize);
    ep.post_recv(*ctrl_rx, 0, kControlSize, 0);
    grant.addr = data[0]->address();
    grant.rkey = data[0]->rkey();
  }
  ConnParam param;
  param.private_data = encode_grant(grant);
  ep.accept(param);
  if (opts.verbose)
    fmt::print(stderr, "peercm ping server: {} connected: op {} size {} count {}\n", peer, op_name(hello->op), size,
               hello->count);

  const auto start = Clock::now();
  for (std::uint32_t i = 0; i < hello->count; ++i) {
    switch (hello->op) {
      case Op::send: {
        const WorkCompletion wc = wait_recv(ep, pending);
        Buffer& b = *data[wc.wr_id & 1];
        v.check(std::span(b.data(), std::min<std::size_t>(size, wc.byte_len)), i, size, wc.byte_len);
        ep.post_send(b, 0, wc.byte_len, i);
        ++pending.sends;
        drain_sends(ep, pending);  // the echo left the buffer: it may receive again
        ep.post_recv(b, 0, size, wc.wr_id);
        break;
      }
      case Op::write: {
        const WorkCompletion wc = wait_recv(ep, pending);
        const Control c = decode_control(std::span(ctrl_rx->data(), kControlSize));
        if (wc.byte_len != kControlSize || c.kind != kWritten || c.iter != i)
          throw ToolError(fmt::format("iteration {}: unexpected control message (kind {}, iter {})", i, c.kind, c.iter));
        const std::uint32_t before = v.errors;
        v.check(data[0]->span(), i, size, size);
        std::memset(data[0]->data(), 0, size);  // the next iteration must really write
        ep.post_recv(*ctrl_rx, 0, kControlSize, 0);
        drain_sends(ep, pending);
        send_control(ep, *ctrl_tx, Control{.kind = kStatus, .iter = i, .status = v.errors != before ? 1u : 0u},
                     pending);
        break;
      }
      case Op::read: {
        const WorkCompletion wc = wait_recv(ep, pending);
        const Control c = decode_control(std::span(ctrl_rx->data(), kControlSize));
        if (wc.byte_len != kControlSize || c.kind != kPrepare || c.iter != i)
          throw ToolError(fmt::format("iteration {}: unexpected control message (kind {}, iter {})", i, c.kind, c.iter));
        fill_pattern(data[0]->span(), i);
        ep.post_recv(*ctrl_rx, 0, kControlSize, 0);
        drain_sends(ep, pending);
        send_control(ep, *ctrl_tx, Control{.kind = kReady, .iter = i}, pending);
        v.verified++;  // the client verifies what it reads
        break;
      }
    }
  }
  drain_sends(ep, pending);
  const auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
  // The client closes once it has checked the last iteration.
  ep.wait_event({CmEventType::disconnected});
  ep.close();
  if (opts.json) {
    nlohmann::json out{{"role", "server"},       {"peer", peer},          {"op", op_name(hello->op)},
                       {"size", size},           {"count", hello->count}, {"verified", v.verified},
                       {"errors", v.errors},     {"elapsed_us", elapsed.count()}};
    fmt::print("{}\n", out.dump());
  } else {
    fmt::print("server: {} op {} size {} count {}: {} errors\n", peer, op_name(hello->op), size, hello->count,
               v.errors);
  }
  std::fflush(stdout);
  return v.errors;
}

int run_server(const PingOptions& opts) {
  const auto address = parse_address(opts.bind, opts.port);
  if (!address) throw ToolError(fmt::format("cannot resolve bind address '{}'", opts.bind));
  Device device(progress_option(opts.progress), transport_option(opts.transport));
  auto listener = listen_on(device, *address, crc_option(opts.crc));
  fmt::print(stderr, "peercm ping: listening on {}\n", format_address(listener->local_address()));
  std::fflush(stderr);
  EventStash stash;
  int status = 0;
  for (;;) {
    auto request = next_request(device, stash, std::chrono::milliseconds(-1));
    if (!request) continue;
    try {
      if (serve_client(device, stash, std::move(*request), opts) != 0) status = 1;
    } catch (const ToolError& e) {
      fmt::print(stderr, "peercm ping server: error: {}\n", e.what());
      status = 1;
    }
    if (opts.once) break;
  }
  return status;
}

// --- client ---

struct ClientResult {
  std::uint32_t verified = 0;
  std::uint32_t errors = 0;
  std::optional<Clock::time_point> start;  // of the first iteration
  std::int64_t elapsed_us = 0;
  std::string error;  // a fatal error, if any
};

void run_client_iterations(const PingOptions& opts, Op op, ClientResult& result) {
  const auto destination = parse_address(opts.client, opts.port);
  if (!destination) throw ToolError(fmt::format("cannot resolve '{}'", opts.client));
  Device device(progress_option(opts.progress), transport_option(opts.transport));
  if (!opts.bind.empty()) {
    device.source = parse_address(opts.bind, 0);
    if (!device.source) throw ToolError(fmt::format("cannot resolve bind address '{}'", opts.bind));
  }
  Endpoint ep(device, resolve(device, *destination, crc_option(opts.crc)), ping_config());
  const std::size_t size = opts.size;
  Buffer& tx = ep.add_buffer(size);
  // iWARP: the sink of an RDMA Read is written by the peer's Read Response, a tagged
  // message, so it needs remote write access (as with siw, iw_cxgb4 and svcrdma).
  Buffer& rx = ep.add_buffer(size, kAccessLocalWrite | kAccessRemoteWrite);
  Buffer& ctrl_tx = ep.add_buffer(kControlSize);
  Buffer& ctrl_rx = ep.add_buffer(kControlSize);
  Verifier v{.who = "client"};
  Outstanding pending;

  ConnParam param;
  param.private_data = encode_hello(Hello{.op = op, .size = size, .count = opts.count});
  const ConnParam accepted = ep.connect(param);
  const auto grant = decode_grant(accepted.private_data);
  if (!grant || grant->size != size) throw ToolError("the server's accept carries no valid buffer grant");

  const auto start = Clock::now();
  result.start = start;
  for (std::uint32_t i = 0; i < opts.count; ++i) {
    switch (op) {
      case Op::send: {
        std::memset(rx.data(), 0, size);
        ep.post_recv(rx, 0, size, i);
        fill_pattern(tx.span(), i);
        ep.post_send(tx, 0, size, i);
        ++pending.sends;
        const WorkCompletion wc = wait_recv(ep, pending);
        drain_sends(ep, pending);
        v.check(std::span(rx.data(), std::min<std::size_t>(size, wc.byte_len)), i, size, wc.byte_len);
        break;
      }
      case Op::write: {
        ep.post_recv(ctrl_rx, 0, kControlSize, i);
        fill_pattern(tx.span(), i);
        ep.post_write(tx, 0, size, grant->addr, grant->rkey, i);
        ++pending.sends;
        send_control(ep, ctrl_tx, Control{.kind = kWritten, .iter = i}, pending);
        const WorkCompletion wc = wait_recv(ep, pending);
        drain_sends(ep, pending);
        const Control c = decode_control(std::span(ctrl_rx.data(), kControlSize));
        if (wc.byte_len != kControlSize || c.kind != kStatus || c.iter != i)
          throw ToolError(fmt::format("iteration {}: unexpected control message (kind {}, iter {})", i, c.kind, c.iter));
        if (c.status == 0) {
          v.verified++;
        } else {
          v.report(fmt::format("iteration {}: the server found its buffer different from the pattern", i));
        }
        break;
      }
      case Op::read: {
        ep.post_recv(ctrl_rx, 0, kControlSize, i);
        send_control(ep, ctrl_tx, Control{.kind = kPrepare, .iter = i}, pending);
        const WorkCompletion wc = wait_recv(ep, pending);
        drain_sends(ep, pending);
        const Control c = decode_control(std::span(ctrl_rx.data(), kControlSize));
        if (wc.byte_len != kControlSize || c.kind != kReady || c.iter != i)
          throw ToolError(fmt::format("iteration {}: unexpected control message (kind {}, iter {})", i, c.kind, c.iter));
        std::memset(rx.data(), 0, size);
        ep.post_read(rx, 0, size, grant->addr, grant->rkey, i);
        ++pending.sends;
        const WorkCompletion done = ep.wait_completion();
        --pending.sends;
        if (done.opcode != WcOpcode::rdma_read) throw ToolError("unexpected completion");
        v.check(rx.span(), i, size, size);
        break;
      }
    }
    result.verified = v.verified;
    result.errors = v.errors;
  }
  result.elapsed_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  ep.close();
}

int run_client(const PingOptions& opts) {
  const Op op = *parse_op(opts.op);
  ClientResult result;
  try {
    run_client_iterations(opts, op, result);
  } catch (const ToolError& e) {
    result.error = e.what();
    if (result.start)
      result.elapsed_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - *result.start).count();
  }
  const std::uint32_t unfinished = opts.count - result.verified - result.errors;
  const std::uint32_t errors = result.errors + unfinished + (result.error.empty() || unfinished ? 0u : 1u);
  if (!result.error.empty()) fmt::print(stderr, "peercm ping: error: {}\n", result.error);
  if (opts.json) {
    nlohmann::json out{{"op", op_name(op)},           {"size", opts.size},     {"count", opts.count},
                       {"verified", result.verified}, {"errors", errors},       {"elapsed_us", result.elapsed_us}};
    if (!result.error.empty()) out["error"] = result.error;
    fmt::print("{}\n", out.dump());
  } else {
    const double per_iter = opts.count ? static_cast<double>(result.elapsed_us) / opts.count : 0.0;
    fmt::print("ping {} op {} size {} count {}: {} verified, {} errors, {} us ({:.1f} us/iteration)\n", opts.client,
               op_name(op), opts.size, opts.count, result.verified, errors, result.elapsed_us, per_iter);
  }
  return errors == 0 && result.error.empty() ? 0 : 1;
}

}  // namespace

void add_ping(CLI::App& app) {
  auto opts = std::make_shared<PingOptions>();
  auto* cmd = app.add_subcommand("ping", "rping-like connectivity and data check (send, write or read, verified)");
  cmd->option_defaults()->always_capture_default();
  auto* server = cmd->add_flag("--server", opts->server, "Run the server (serves clients one after another)");
  auto* client = cmd->add_option("--client", opts->client, "Run the client against ADDR")->type_name("ADDR");
  server->excludes(client);
  cmd->add_option("--bind", opts->bind, "Server: address to listen on (default: all); client: address to connect from")->type_name("ADDR");
  cmd->add_option("--port", opts->port, "Port (server: 0 picks a free one)");
  cmd->add_flag("--once", opts->once, "Server: exit after one client");
  cmd->add_option("--op", opts->op, "Client: operation")->check(CLI::IsMember({"send", "write", "read"}));
  cmd->add_option("--size", opts->size, "Client: bytes per iteration")
      ->check(CLI::Range(std::size_t{1}, kMaxSize));
  cmd->add_option("--count", opts->count, "Client: iterations");
  cmd->add_option("--crc", opts->crc, "MPA CRC: on (required) or off (default: preferred)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--progress", opts->progress, "Progress mode")->check(CLI::IsMember({"thread", "inline"}));
  cmd->add_option("--transport", opts->transport, "iwarp (MPA over TCP) or roce (RoCEv2 over UDP 4791)")
      ->check(CLI::IsMember({"iwarp", "roce"}));
  cmd->add_flag("--json", opts->json, "Print the result as JSON");
  cmd->add_flag("-v,--verbose", opts->verbose, "Report connections on stderr");
  cmd->callback([opts] {
    if (!opts->server && opts->client.empty()) throw CLI::ValidationError("ping", "give --server or --client ADDR");
    try {
      exit_status = opts->server ? run_server(*opts) : run_client(*opts);
    } catch (const ToolError& e) {
      fmt::print(stderr, "peercm ping: error: {}\n", e.what());
      exit_status = 1;
    }
  });
}

}  // namespace peercm::tool
