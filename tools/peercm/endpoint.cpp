#include "endpoint.hpp"

#include <arpa/inet.h>
#include <fmt/core.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

namespace peercm::tool {

std::string errc_text(std::errc error) { return std::make_error_code(error).message(); }

void throw_errc(std::string_view what, std::errc error) {
  throw ToolError(fmt::format("{}: {}", what, errc_text(error)));
}

// --- addresses ---

std::optional<sockaddr_in> parse_address(const std::string& host, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (host.empty()) {
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    return a;
  }
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0 || list == nullptr) return std::nullopt;
  sockaddr_in found{};
  std::memcpy(&found, list->ai_addr, sizeof found);
  ::freeaddrinfo(list);
  a.sin_addr = found.sin_addr;
  return a;
}

std::string format_address(const sockaddr_in& address) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &address.sin_addr, text, sizeof text);
  return fmt::format("{}:{}", text, ntohs(address.sin_port));
}

std::optional<std::int64_t> crc_option(const std::string& value) {
  if (value == "on") return 0;   // CrcPolicy::required
  if (value == "off") return 2;  // CrcPolicy::off
  return std::nullopt;
}

ProgressMode progress_option(const std::string& value) {
  return value == "inline" ? ProgressMode::inline_ : ProgressMode::thread;
}

// --- codec ---

ByteWriter& ByteWriter::u8(std::uint8_t v) {
  bytes_.push_back(v);
  return *this;
}
ByteWriter& ByteWriter::u16(std::uint16_t v) {
  for (int i = 0; i < 2; ++i) bytes_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  return *this;
}
ByteWriter& ByteWriter::u32(std::uint32_t v) {
  for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  return *this;
}
ByteWriter& ByteWriter::u64(std::uint64_t v) {
  for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  return *this;
}

std::uint64_t ByteReader::take(std::size_t n) {
  if (!ok_ || bytes_.size() - pos_ < n) {
    ok_ = false;
    return 0;
  }
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t{bytes_[pos_ + i]} << (8 * i);
  pos_ += n;
  return v;
}
std::uint8_t ByteReader::u8() { return static_cast<std::uint8_t>(take(1)); }
std::uint16_t ByteReader::u16() { return static_cast<std::uint16_t>(take(2)); }
std::uint32_t ByteReader::u32() { return static_cast<std::uint32_t>(take(4)); }
std::uint64_t ByteReader::u64() { return take(8); }

void encode_control(const Control& c, std::span<std::uint8_t> out) {
  ByteWriter w;
  w.u32(c.kind).u32(c.iter).u32(c.status).u32(c.value);
  std::copy_n(w.bytes().begin(), std::min(out.size(), w.bytes().size()), out.begin());
}

Control decode_control(std::span<const std::uint8_t> in) {
  ByteReader r(in);
  Control c;
  c.kind = r.u32();
  c.iter = r.u32();
  c.status = r.u32();
  c.value = r.u32();
  if (!r.ok()) return Control{};
  return c;
}

// --- pattern ---

std::uint8_t pattern_byte(std::uint32_t iter, std::size_t index) {
  // Mixes the index (including its high bits, so that misplaced 256-byte or 64 KiB blocks
  // are caught) with the iteration (so that stale data from an earlier one is caught).
  const auto i = static_cast<std::uint32_t>(index);
  std::uint32_t x = i * 0x9E3779B1u + iter * 0x85EBCA77u + static_cast<std::uint32_t>(index >> 32);
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return static_cast<std::uint8_t>(x ^ (x >> 8) ^ (x >> 16) ^ (x >> 24));
}

void fill_pattern(std::span<std::uint8_t> bytes, std::uint32_t iter) {
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern_byte(iter, i);
}

std::optional<std::size_t> find_mismatch(std::span<const std::uint8_t> bytes, std::uint32_t iter) {
  for (std::size_t i = 0; i < bytes.size(); ++i)
    if (bytes[i] != pattern_byte(iter, i)) return i;
  return std::nullopt;
}

// --- resources ---

Transport transport_option(const std::string& name) { return name == "roce" ? Transport::roce : Transport::iwarp; }

std::string random_loopback_host() {
  std::random_device random;
  return fmt::format("127.{}.{}.{}", 1 + random() % 254, random() % 256, 1 + random() % 254);
}

Device::Device(ProgressMode mode, Transport transport_to_use, const RoceFaults& faults) : transport(transport_to_use) {
  ContextOptions options{.progress = mode};
  options.roce.faults = faults;
  auto ctx = Context::open(options);
  if (!ctx) throw_errc("Context::open", ctx.error());
  context = std::move(*ctx);
  auto ch = EventChannel::create();
  if (!ch) throw_errc("EventChannel::create", ch.error());
  channel = std::move(*ch);
}

void Buffer::Free::operator()(std::uint8_t* p) const { std::free(p); }

Buffer::Buffer(ProtectionDomain& pd, std::size_t size, std::uint32_t access) : size_(size) {
  const std::size_t rounded = std::max<std::size_t>(64, (size + 63) / 64 * 64);
  storage_.reset(static_cast<std::uint8_t*>(std::aligned_alloc(64, rounded)));
  if (!storage_) throw ToolError(fmt::format("cannot allocate {} bytes", size));
  std::memset(storage_.get(), 0, rounded);
  auto mr = MemoryRegion::register_memory(pd, storage_.get(), size, access);
  if (!mr) throw_errc(fmt::format("register_memory({} bytes)", size), mr.error());
  mr_ = std::move(*mr);
}

std::uint64_t Buffer::address() const { return reinterpret_cast<std::uintptr_t>(storage_.get()); }

namespace {

bool wanted_type(CmEventType type, std::initializer_list<CmEventType> wanted) {
  return std::find(wanted.begin(), wanted.end(), type) != wanted.end();
}

std::string describe(const CmEvent& event) {
  std::string text(to_string(event.type));
  if (event.status != 0) text += fmt::format(" ({})", std::generic_category().message(event.status));
  if (event.reject_reason != RejectReason::none) text += fmt::format(" [reason: {}]", to_string(event.reject_reason));
  return text;
}

}  // namespace

CmEvent wait_event(EventChannel& channel, const CmId* id, std::initializer_list<CmEventType> wanted,
                   EventStash* stash, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    auto event = channel.get_event(left);
    if (!event) {
      if (event.error() == std::errc::timed_out) break;
      throw_errc("get_event", event.error());
    }
    if (event->type == CmEventType::connect_request && event->listen_id != nullptr && event->listen_id != id) {
      if (stash) {
        stash->push_back(std::move(*event));
      } else if (event->new_id) {
        [[maybe_unused]] auto rejected = event->new_id->reject();
      }
      continue;
    }
    if (event->id != id) continue;  // a late event of an id that is gone or not ours
    if (wanted_type(event->type, wanted)) return std::move(*event);
    if (event->type == CmEventType::timewait_exit) continue;  // harmless
    throw ToolError(fmt::format("unexpected CM event {}", describe(*event)));
  }
  std::string names;
  for (auto t : wanted) names += fmt::format("{}{}", names.empty() ? "" : "/", to_string(t));
  throw ToolError(fmt::format("timed out after {} ms waiting for {}", timeout.count(), names));
}

Endpoint::Endpoint(Device& device, std::unique_ptr<CmId> id, const EndpointConfig& config, EventStash* stash)
    : device_(device),
      stash_(stash),
      wait_(config.wait),
      spin_(kSpinBeforeYield),
      id_(std::move(id)) {
  auto pd = ProtectionDomain::allocate(*device.context);
  if (!pd) throw_errc("ProtectionDomain::allocate", pd.error());
  pd_ = std::move(*pd);
  if (wait_ != WaitPolicy::poll) {
    auto ch = CompletionChannel::create(*device.context);
    if (!ch) throw_errc("CompletionChannel::create", ch.error());
    comp_channel_ = std::move(*ch);
  }
  auto cq = CompletionQueue::create(*device.context, config.cq_capacity, comp_channel_.get());
  if (!cq) throw_errc("CompletionQueue::create", cq.error());
  cq_ = std::move(*cq);
  QpInitAttr attr;
  attr.send_cq = cq_.get();
  attr.recv_cq = cq_.get();
  attr.caps = config.caps;
  attr.sq_sig_all = config.sig_all;
  auto qp = id_->create_qp(*pd_, attr);
  if (!qp) throw_errc("create_qp", qp.error());
  qp_ = *qp;
}

Endpoint::~Endpoint() {
  // The connection goes first (no more placement into the buffers), then the memory.
  if (id_) {
    id_->destroy_qp();
    id_.reset();
    // Events of the destroyed id may still be queued, naming its address, which a new
    // CmId can reuse: drop them now. Connect requests for a listener are kept.
    for (;;) {
      auto event = device_.channel->get_event(std::chrono::milliseconds(0));
      if (!event) break;
      if (event->type == CmEventType::connect_request && event->new_id && stash_) stash_->push_back(std::move(*event));
    }
  }
  buffers_.clear();
  cq_.reset();
  comp_channel_.reset();
  pd_.reset();
}

Buffer& Endpoint::add_buffer(std::size_t size, std::uint32_t access) {
  return buffers_.emplace_back(*pd_, size, access);
}

void Endpoint::post(const SendWr& wr) {
  auto posted = qp_->post_send(wr);
  if (!posted) throw_errc("post_send", posted.error());
}

void Endpoint::post_send(Buffer& buffer, std::size_t offset, std::size_t length, std::uint64_t wr_id,
                         std::uint32_t flags) {
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = WrOpcode::send;
  wr.flags = flags;
  if (length > 0) wr.sg_list.push_back(buffer.sge(offset, length));
  post(wr);
}

void Endpoint::post_write(Buffer& buffer, std::size_t offset, std::size_t length, std::uint64_t remote_addr,
                          std::uint32_t rkey, std::uint64_t wr_id, std::uint32_t flags) {
  post_rdma(WrOpcode::rdma_write, buffer, offset, length, remote_addr, rkey, wr_id, flags);
}

void Endpoint::post_read(Buffer& buffer, std::size_t offset, std::size_t length, std::uint64_t remote_addr,
                         std::uint32_t rkey, std::uint64_t wr_id, std::uint32_t flags) {
  post_rdma(WrOpcode::rdma_read, buffer, offset, length, remote_addr, rkey, wr_id, flags);
}

void Endpoint::post_rdma(WrOpcode opcode, Buffer& buffer, std::size_t offset, std::size_t length,
                         std::uint64_t remote_addr, std::uint32_t rkey, std::uint64_t wr_id, std::uint32_t flags) {
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = opcode;
  wr.flags = flags;
  wr.sg_list.push_back(buffer.sge(offset, length));
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  post(wr);
}

void Endpoint::post_recv(Buffer& buffer, std::size_t offset, std::size_t length, std::uint64_t wr_id) {
  RecvWr wr;
  wr.wr_id = wr_id;
  wr.sg_list.push_back(buffer.sge(offset, length));
  auto posted = qp_->post_recv(wr);
  if (!posted) throw_errc("post_recv", posted.error());
}

std::size_t Endpoint::poll(std::span<WorkCompletion> out) {
  const std::size_t n = cq_->poll(out);
  for (std::size_t i = 0; i < n; ++i) {
    if (out[i].status != WcStatus::success)
      throw ToolError(fmt::format("work completion error: {} on {} (wr_id {})", to_string(out[i].status),
                                  to_string(out[i].opcode), out[i].wr_id));
  }
  return n;
}

WorkCompletion Endpoint::wait_completion(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const auto start = Clock::now();
  WorkCompletion wc;
  const std::span<WorkCompletion> one(&wc, 1);
  unsigned idle_polls = 0;
  for (;;) {
    if (poll(one) == 1) return wc;
    if (wait_ == WaitPolicy::block) {
      if (Clock::now() >= deadline) break;
      if (sleep_until_completion(deadline, one) == 1) return wc;
    } else if (++idle_polls % engine::BusyPollBudget::kCheckEvery == 0) {
      const auto now = Clock::now();
      if (now >= deadline) break;
      if (idle(start, now, deadline, one) == 1) return wc;
    }
  }
  throw ToolError(fmt::format("timed out after {} ms waiting for a work completion (QP state {})",
                              timeout.count(), to_string(qp_->state())));
}

std::size_t Endpoint::idle(Clock::time_point start, Clock::time_point now, Clock::time_point deadline,
                           std::span<WorkCompletion> out) {
  if (!should_yield(start, now)) return 0;
  if (wait_ == WaitPolicy::hybrid) return sleep_until_completion(deadline, out);
  std::this_thread::yield();  // let progress threads and the peer run
  return 0;
}

std::size_t Endpoint::sleep_until_completion(Clock::time_point deadline, std::span<WorkCompletion> out) {
  // A completion may arrive between the last poll and arming: poll once more after.
  auto armed = cq_->request_notify();
  if (!armed) throw_errc("request_notify", armed.error());
  if (const std::size_t n = poll(out); n > 0) return n;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  auto got = comp_channel_->get_event(std::max(left, std::chrono::milliseconds(1)));
  if (got) comp_channel_->ack_events(**got, 1);
  return 0;
}

ConnParam Endpoint::connect(const ConnParam& param) {
  auto ok = id_->connect(param);
  if (!ok) throw_errc("connect", ok.error());
  auto event = wait_event({CmEventType::established});
  return std::move(event.param);
}

void Endpoint::accept(const ConnParam& param) {
  auto ok = id_->accept(param);
  if (!ok) throw_errc("accept", ok.error());
  wait_event({CmEventType::established});
}

CmEvent Endpoint::wait_event(std::initializer_list<CmEventType> wanted, std::chrono::milliseconds timeout) {
  auto event = tool::wait_event(*device_.channel, id_.get(), wanted, stash_, timeout);
  if (event.type == CmEventType::disconnected) disconnected_ = true;
  return event;
}

void Endpoint::close(std::chrono::milliseconds timeout) {
  if (!disconnected_) {
    [[maybe_unused]] auto ok = id_->disconnect();
    try {
      wait_event({CmEventType::disconnected}, timeout);
    } catch (const ToolError&) {
      // Closing anyway; the CmId's destructor aborts what is left.
    }
  }
}

std::unique_ptr<CmId> resolve(Device& device, const sockaddr_in& destination, std::optional<std::int64_t> crc) {
  auto created = CmId::create(*device.context, *device.channel, nullptr, device.transport);
  if (!created) throw_errc("CmId::create", created.error());
  std::unique_ptr<CmId> id = std::move(*created);
  if (crc) {
    auto ok = id->set_option(CmOption::crc, *crc);
    if (!ok) throw_errc("set_option(crc)", ok.error());
  }
  if (device.transport == Transport::roce) {
    // A RoCE REQ carries 56 private bytes, of which the p2p header takes 20: the tools'
    // hellos need more, and their client/server runs no p2p.
    auto off = id->set_option(CmOption::peer_to_peer, 0);
    if (!off) throw_errc("set_option(peer_to_peer)", off.error());
  }
  if (device.source) {
    auto bound = id->bind(*device.source);
    if (!bound) throw_errc(fmt::format("bind {}", format_address(*device.source)), bound.error());
  }
  auto ok = id->resolve_addr(destination);
  if (!ok) throw_errc("resolve_addr", ok.error());
  tool::wait_event(*device.channel, id.get(), {CmEventType::addr_resolved});
  ok = id->resolve_route();
  if (!ok) throw_errc("resolve_route", ok.error());
  tool::wait_event(*device.channel, id.get(), {CmEventType::route_resolved});
  return id;
}

std::unique_ptr<CmId> listen_on(Device& device, const sockaddr_in& address, std::optional<std::int64_t> crc) {
  auto created = CmId::create(*device.context, *device.channel, nullptr, device.transport);
  if (!created) throw_errc("CmId::create", created.error());
  std::unique_ptr<CmId> id = std::move(*created);
  if (crc) {
    auto ok = id->set_option(CmOption::crc, *crc);
    if (!ok) throw_errc("set_option(crc)", ok.error());
  }
  auto ok = id->bind(address);
  if (!ok) throw_errc(fmt::format("bind {}", format_address(address)), ok.error());
  ok = id->listen(16);
  if (!ok) throw_errc(fmt::format("listen {}", format_address(address)), ok.error());
  return id;
}

std::optional<CmEvent> next_request(Device& device, EventStash& stash, std::chrono::milliseconds timeout) {
  if (!stash.empty()) {
    CmEvent event = std::move(stash.front());
    stash.pop_front();
    return event;
  }
  const bool forever = timeout.count() < 0;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    std::chrono::milliseconds slice(1000);
    if (!forever) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      slice = std::min(slice, left);
    }
    auto event = device.channel->get_event(slice);
    if (!event) {
      if (event.error() == std::errc::timed_out) continue;
      throw_errc("get_event", event.error());
    }
    if (event->type == CmEventType::connect_request && event->new_id) return std::move(*event);
    // Anything else is a late event of a connection that is gone.
  }
}

Summary summarize(std::vector<double> samples) {
  Summary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  s.min = samples.front();
  s.max = samples.back();
  s.median = n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
  s.average = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(n);
  s.p99 = samples[std::min(n - 1, static_cast<std::size_t>(static_cast<double>(n) * 0.99))];
  return s;
}

}  // namespace peercm::tool
