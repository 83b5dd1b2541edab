// reliability_peer: the victim or hostile peer of the reliability tests, run in its own
// process so that the test can SIGKILL it at a chosen moment. It reports each step as one
// line on stdout and, once it has nothing more to do, blocks reading stdin (the test kills
// it there; if the test dies instead, stdin reaches EOF and the helper exits).
//
//   half-request <port>                   raw TCP: the first 10 bytes of an MPA Request
//   mpa-initiator <port>                  peercm client whose Request the test holds
//   mpa-responder                         peercm server that never answers a Request
//   rdma-server <write|read> <bytes> <n>  peercm server exposing <bytes>; stops driving
//                                         progress once <n> bytes were placed (write) or
//                                         <n> FPDUs sent (read)
//   p2p-collide <port> <guid> <tag>       raw p2p node: takes the test's attempt, sends a
//                                         colliding Request, reports the answer
//   flood <port> <total> <window> <rate>  <total> TCP connects at <rate>/s, the last
//                                         <window> held open and silent
//   roce-client <address> <port>          peercm RoCE client (client/server model) that
//                                         connects to <address>:<port> and then idles
//   request-flood <iwarp|roce> <cs|p2p> <address> <port> <total> [<source address>]
//                                         <total> whole connection requests at <address>:<port>,
//                                         as fast as they go, none of them ever completed:
//                                         iWARP: TCP connects each sending one MPA Request
//                                         (p2p: with a CM header of a fresh node), all held
//                                         open to the end; RoCE: REQs of a peercm node from
//                                         ids without a QP, distinct p2p tags. Reports "started"
//                                         after the first, then "done <sent> refused <n>"
//                                         (iWARP: closed by the listener; RoCE: REJECTED)
//   roce-p2p <address> <port>             peercm RoCE node listening on <address>:<port>
//                                         (p2p on, the default); reports "listening", accepts
//                                         every CONNECT_REQUEST ("established accepted"), and
//                                         on the stdin line "connect <address> <port>" connects
//                                         ("established connecting", or "event <type>")
//   fd-limited-server <nofile>            peercm iWARP server under RLIMIT_NOFILE <nofile>:
//                                         accepts every request with a receive posted, and
//                                         reports "established <n> pauses <accept_pauses>"
//                                         and "received <n>"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/queue_pair_impl.hpp"
#include "peercm/cm.hpp"
#include "peercm/verbs.hpp"
#include "raw_peer.hpp"
#include "wire/cm_header.hpp"

namespace {

using namespace std::chrono_literals;
using namespace peercm;
using peercm::test::RawListener;
using peercm::test::RawSocket;

void say(const std::string& line) {
  const std::string out = line + "\n";
  [[maybe_unused]] const ssize_t n = ::write(1, out.data(), out.size());
}

[[noreturn]] void die(const std::string& why) {
  say("error " + why);
  ::_exit(2);
}

// Waits to be killed. _exit: the test owns this process's fate, not its destructors.
[[noreturn]] void block() {
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  ::_exit(0);
}

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

std::uint16_t port_arg(const char* s) { return static_cast<std::uint16_t>(std::strtoul(s, nullptr, 10)); }

CmEvent next_event(EventChannel& channel, CmEventType type) {
  auto event = channel.get_event(10s);
  if (!event) die("no event");
  if (event->type != type) die(std::string("event ") + std::string(to_string(event->type)));
  return std::move(*event);
}

QpInitAttr qp_attr(CompletionQueue& cq) {
  QpInitAttr attr;
  attr.send_cq = &cq;
  attr.recv_cq = &cq;
  return attr;
}

int half_request(std::uint16_t port) {
  auto socket = RawSocket::connect_to(port);
  if (socket.fd() < 0) die("connect");
  const auto request = test::mpa_request_bytes(true);
  if (!socket.send_all(std::span(request).first(10))) die("send");
  say("sent");
  block();
}

int mpa_initiator(std::uint16_t port) {
  auto context = std::move(Context::open().value());
  auto channel = std::move(EventChannel::create().value());
  auto pd = std::move(ProtectionDomain::allocate(*context).value());
  auto cq = std::move(CompletionQueue::create(*context, 64).value());
  auto id = std::move(CmId::create(*context, *channel).value());
  (void)id->set_option(CmOption::peer_to_peer, 0);
  (void)id->resolve_addr(loopback(port));
  next_event(*channel, CmEventType::addr_resolved);
  (void)id->resolve_route();
  next_event(*channel, CmEventType::route_resolved);
  (void)id->create_qp(*pd, qp_attr(*cq));
  if (!id->connect({})) die("connect");
  say("connecting");
  block();
}

int roce_client(const char* address, std::uint16_t port) {
  auto context = std::move(Context::open().value());
  auto channel = std::move(EventChannel::create().value());
  auto pd = std::move(ProtectionDomain::allocate(*context).value());
  auto cq = std::move(CompletionQueue::create(*context, 64).value());
  auto id = std::move(CmId::create(*context, *channel, nullptr, Transport::roce).value());
  (void)id->set_option(CmOption::peer_to_peer, 0);
  sockaddr_in server = loopback(port);
  if (::inet_pton(AF_INET, address, &server.sin_addr) != 1) die("address");
  (void)id->resolve_addr(server);
  next_event(*channel, CmEventType::addr_resolved);
  (void)id->resolve_route();
  next_event(*channel, CmEventType::route_resolved);
  (void)id->create_qp(*pd, qp_attr(*cq));
  if (!id->connect({})) die("connect");
  next_event(*channel, CmEventType::established);
  say("established");
  block();
}

int roce_p2p(const char* address, std::uint16_t port) {
  auto context = std::move(Context::open().value());
  auto channel = std::move(EventChannel::create().value());
  auto pd = std::move(ProtectionDomain::allocate(*context).value());
  auto cq = std::move(CompletionQueue::create(*context, 64).value());
  auto listener = std::move(CmId::create(*context, *channel, nullptr, Transport::roce).value());
  sockaddr_in own = loopback(port);
  if (::inet_pton(AF_INET, address, &own.sin_addr) != 1) die("address");
  if (!listener->bind(own) || !listener->listen(16)) die("listen");
  say("listening");
  std::vector<std::unique_ptr<CmId>> ids;
  CmId* connecting = nullptr;
  std::string line;
  for (;;) {
    while (auto event = channel->get_event(0ms)) {
      if (event->type == CmEventType::connect_request) {
        auto id = std::move(event->new_id);
        if (!id || !id->create_qp(*pd, qp_attr(*cq)) || !id->accept({})) die("accept");
        ids.push_back(std::move(id));
        continue;
      }
      if (event->type == CmEventType::established) {
        say(event->id == connecting ? "established connecting" : "established accepted");
        continue;
      }
      if (event->type == CmEventType::addr_resolved || event->type == CmEventType::route_resolved) {
        if (event->id != connecting) continue;
        if (event->type == CmEventType::addr_resolved) {
          if (!connecting->resolve_route()) die("resolve_route");
        } else if (!connecting->create_qp(*pd, qp_attr(*cq)) || !connecting->connect({})) {
          die("connect");
        }
        continue;
      }
      say(std::string("event ") + std::string(to_string(event->type)));
    }
    pollfd input{0, POLLIN, 0};
    if (::poll(&input, 1, 5) <= 0) continue;
    char c;
    if (::read(0, &c, 1) <= 0) ::_exit(0);
    if (c != '\n') {
      line.push_back(c);
      continue;
    }
    char to_address[64] = {};
    unsigned to_port = 0;
    if (std::sscanf(line.c_str(), "connect %63s %u", to_address, &to_port) == 2 && !connecting) {
      sockaddr_in to = loopback(static_cast<std::uint16_t>(to_port));
      if (::inet_pton(AF_INET, to_address, &to.sin_addr) != 1) die("address");
      ids.push_back(std::move(CmId::create(*context, *channel, nullptr, Transport::roce).value()));
      connecting = ids.back().get();
      if (!connecting->resolve_addr(to)) die("resolve_addr");
    }
    line.clear();
  }
}

int fd_limited_server(rlim_t nofile) {
  auto context = std::move(Context::open(ContextOptions{.reserved_descriptors = 0}).value());
  auto channel = std::move(EventChannel::create().value());
  auto pd = std::move(ProtectionDomain::allocate(*context).value());
  auto cq = std::move(CompletionQueue::create(*context, 256).value());
  auto listener = std::move(CmId::create(*context, *channel).value());
  // A large backlog: held handshakes then take descriptors until none is left.
  if (!listener->bind(loopback(0)) || !listener->listen(1024)) die("listen");
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = nofile;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) die("setrlimit");
  say("port " + std::to_string(ntohs(listener->local_address().sin_port)));
  std::vector<std::unique_ptr<CmId>> ids;
  std::vector<std::uint8_t> buffer(64 * 64);
  auto mr = std::move(MemoryRegion::register_memory(*pd, buffer.data(), buffer.size(), kAccessLocalWrite).value());
  int established = 0;
  int received = 0;
  for (;;) {
    WorkCompletion wc[8];
    for (std::size_t n = cq->poll(wc); n > 0; n = cq->poll(wc))
      for (std::size_t i = 0; i < n; ++i)
        if (wc[i].status == WcStatus::success) say("received " + std::to_string(++received));
    auto event = channel->get_event(5ms);
    if (!event) continue;
    if (event->type == CmEventType::connect_request && event->new_id) {
      auto id = std::move(event->new_id);
      auto qp = id->create_qp(*pd, qp_attr(*cq));
      if (!qp) continue;
      const auto slot = ids.size() % 64;
      (void)(*qp)->post_recv(RecvWr{.wr_id = slot, .sg_list = {mr->sge(slot * 64, 64)}});
      if (id->accept({})) ids.push_back(std::move(id));
    } else if (event->type == CmEventType::established) {
      say("established " + std::to_string(++established) + " pauses " +
          std::to_string(cm_stats(*context).accept_pauses));
    }
  }
}

int mpa_responder() {
  auto context = std::move(Context::open().value());
  auto channel = std::move(EventChannel::create().value());
  auto listener = std::move(CmId::create(*context, *channel).value());
  if (!listener->bind(loopback(0)) || !listener->listen(4)) die("listen");
  say("port " + std::to_string(ntohs(listener->local_address().sin_port)));
  auto request = next_event(*channel, CmEventType::connect_request);
  say("request");
  block();
}

int rdma_server(const std::string& mode, std::size_t bytes, std::uint64_t threshold) {
  // Inline progress: the connection moves only while this thread drives it, so "stop here"
  // is exact and the test's kill lands mid-transfer.
  auto context = std::move(Context::open(ContextOptions{.progress = ProgressMode::inline_}).value());
  auto channel = std::move(EventChannel::create().value());
  auto pd = std::move(ProtectionDomain::allocate(*context).value());
  auto cq = std::move(CompletionQueue::create(*context, 64).value());
  auto listener = std::move(CmId::create(*context, *channel).value());
  if (!listener->bind(loopback(0)) || !listener->listen(4)) die("listen");
  say("port " + std::to_string(ntohs(listener->local_address().sin_port)));
  auto request = next_event(*channel, CmEventType::connect_request);
  auto id = std::move(request.new_id);
  QueuePair* qp = id->create_qp(*pd, qp_attr(*cq)).value();
  std::vector<std::uint8_t> buffer(bytes, 0);
  const bool read_mode = mode == "read";
  if (read_mode) {
    for (std::size_t i = 0; i < bytes; ++i) buffer[i] = static_cast<std::uint8_t>(i * 7 + 1);
  }
  auto mr = std::move(MemoryRegion::register_memory(*pd, buffer.data(), buffer.size(),
                                                    kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead)
                          .value());
  ConnParam param;
  const std::uint64_t addr = reinterpret_cast<std::uintptr_t>(buffer.data());
  const std::uint32_t rkey = mr->rkey();
  const std::uint64_t length = bytes;
  param.private_data.resize(20);
  std::memcpy(param.private_data.data(), &addr, 8);
  std::memcpy(param.private_data.data() + 8, &rkey, 4);
  std::memcpy(param.private_data.data() + 12, &length, 8);
  if (!id->accept(param)) die("accept");
  next_event(*channel, CmEventType::established);
  say("established");
  const auto& stats = qp->impl().engine->stats();
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while ((read_mode ? stats.fpdus_sent : stats.bytes_placed) < threshold) {
    if (std::chrono::steady_clock::now() > deadline) die("no traffic");
    context->progress(1ms);
  }
  say("midway " + std::to_string(read_mode ? stats.fpdus_sent : stats.bytes_placed));
  block();
}

int p2p_collide(std::uint16_t peer_port, std::uint64_t guid, std::uint32_t tag) {
  RawListener listener;
  say("port " + std::to_string(listener.port()));
  auto attempt = listener.accept_one(10s);
  if (attempt.fd() < 0) die("accept");
  if (test::read_mpa_frame(attempt, 10s).empty()) die("attempt request");
  say("got-request");
  std::array<std::uint8_t, wire::kCmHeaderSize> header{};
  const wire::CmHeader cm{.node_guid = guid,
                          .incarnation = std::random_device{}(),
                          .listen_port = listener.port(),
                          .tag = tag,
                          .cmid = 1};
  if (!wire::encode_cm_header(cm, header)) die("cm header");
  const auto request = test::mpa_bytes(wire::MpaFrame{
      .kind = wire::MpaFrameKind::request,
      .crc = true,
      .revision = 2,
      .enhanced = wire::IrdOrdBlock{.peer_to_peer = true, .send_rtr = true, .write_rtr = true, .read_rtr = true, .ird = 16, .ord = 16},
      .private_data = header});
  auto colliding = RawSocket::connect_to(peer_port);
  if (colliding.fd() < 0 || !colliding.send_all(request)) die("collide");
  say("sent-request");
  const auto answer = test::read_mpa_frame(colliding, 3s);
  if (answer.empty()) {
    say("answer none");
  } else {
    say((answer[16] & 0x20) ? "answer reject" : "answer accept");  // R bit
  }
  block();
}

// <total> connects, one every 1/<rate> s, the last <window> of them held open and silent.
// Reports how many reached the listener: when the kernel's accept queue is full it drops the
// SYN, and a socket still in SYN_SENT when its turn to close comes is not counted.
int flood(std::uint16_t port, std::size_t total, std::size_t window, std::size_t rate) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur < window + 64) {
    limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, window + 64);
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  const sockaddr_in target = loopback(port);
  std::deque<int> open;
  std::size_t connected = 0;
  auto retire = [&] {
    const int fd = open.front();
    open.pop_front();
    int error = 0;
    socklen_t len = sizeof error;
    sockaddr_in peer{};
    socklen_t peer_len = sizeof peer;
    // Connected, or reset by the listener after it took it (ECONNRESET, or EPIPE after its FIN).
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 &&
        (error != 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0))
      ++connected;
    // Three in four end with an RST: the listener meets both ends, and TIME_WAIT stays small.
    if (connected % 4 != 0) {
      linger hard{1, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    }
    ::close(fd);
  };
  const auto start = std::chrono::steady_clock::now();
  const auto interval = std::chrono::nanoseconds(1'000'000'000 / std::max<std::size_t>(rate, 1));
  for (std::size_t i = 0; i < total; ++i) {
    std::this_thread::sleep_until(start + interval * static_cast<std::int64_t>(i));
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket " + std::string(std::strerror(errno)));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&target), sizeof target) != 0 && errno != EINPROGRESS) {
      ::close(fd);
      continue;
    }
    open.push_back(fd);
    if (i + 1 == window) say("started");
    if (open.size() > window) retire();
  }
  while (!open.empty()) retire();
  say("done " + std::to_string(connected) + " " + std::to_string(total));
  block();
}

// request-flood: see the top of the file.
int request_flood_iwarp(bool p2p, const sockaddr_in& target, std::size_t total, const sockaddr_in& source) {
  // Every request stays open (as far as the descriptor limit allows): a held request whose
  // peer went away is no longer the listener's, and the flood should not let it off that way.
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, total + 64);
  ::setrlimit(RLIMIT_NOFILE, &limit);
  const std::size_t kWindow = limit.rlim_cur - 64;
  std::mt19937_64 random{std::random_device{}()};
  std::deque<int> open;
  std::size_t sent = 0, refused = 0;
  auto retire = [&] {
    const int fd = open.front();
    open.pop_front();
    char byte;
    // The listener closed it (refused, or displaced): EOF or a reset.
    const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN)) ++refused;
    linger hard{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    ::close(fd);
  };
  for (std::size_t i = 0; i < total; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket " + std::string(std::strerror(errno)));
    if (source.sin_addr.s_addr != 0 && ::bind(fd, reinterpret_cast<const sockaddr*>(&source), sizeof source) != 0)
      die("bind " + std::string(std::strerror(errno)));
    timeval limit_connect{.tv_sec = 0, .tv_usec = 200000};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit_connect, sizeof limit_connect);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&target), sizeof target) != 0) {
      ::close(fd);
      continue;
    }
    const auto request =
        p2p ? test::p2p_request_bytes(wire::CmHeader{.node_guid = random(), .incarnation = random(), .listen_port = 0,
                                                     .tag = static_cast<std::uint32_t>(i), .cmid = 1})
            : test::mpa_request_bytes(true);
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) ++sent;
    open.push_back(fd);
    if (i == 0) say("started");
    if (open.size() > kWindow) retire();
  }
  while (!open.empty()) retire();
  say("done " + std::to_string(sent) + " refused " + std::to_string(refused));
  block();
}

int request_flood_roce(bool p2p, const sockaddr_in& target, std::size_t total, const sockaddr_in& source) {
  auto context = std::move(Context::open().value());
  auto channel = std::move(EventChannel::create().value());
  // A refused id goes at once: its service port (one of 16,384 ephemeral ones) is free again.
  std::map<const CmId*, std::unique_ptr<CmId>> ids;
  std::size_t sent = 0, refused = 0;
  auto drain = [&](std::chrono::milliseconds wait) {
    while (auto event = channel->get_event(wait)) {
      if (event->type == CmEventType::addr_resolved) {
        (void)event->id->resolve_route();
      } else if (event->type == CmEventType::route_resolved) {
        // A QP number no QP of ours has: the IB CM exchange alone (docs/roce-transport.md).
        ConnParam param;
        param.qp_num = static_cast<std::uint32_t>(0x1000 + sent);
        if (event->id->connect(param)) ++sent;
      } else if (event->type == CmEventType::rejected) {
        ++refused;
        ids.erase(event->id);
      } else if (event->type == CmEventType::unreachable || event->type == CmEventType::connect_error) {
        ids.erase(event->id);
      }
      wait = std::chrono::milliseconds(0);
    }
  };
  for (std::size_t i = 0; i < total; ++i) {
    auto id = std::move(CmId::create(*context, *channel, nullptr, Transport::roce).value());
    (void)id->set_option(CmOption::peer_to_peer, p2p ? 1 : 0);
    (void)id->set_option(CmOption::p2p_tag, static_cast<std::int64_t>(i));
    if (source.sin_addr.s_addr != 0) (void)id->bind(source);
    (void)id->resolve_addr(target);
    const CmId* key = id.get();
    ids.emplace(key, std::move(id));
    if (i % 64 == 63) drain(0ms);
    // Never more than 8,192 at once: the ephemeral service ports run out at 16,384.
    while (ids.size() >= 8192) drain(10ms);
    if (i == 0) say("started");
  }
  for (const auto until = std::chrono::steady_clock::now() + 3s; std::chrono::steady_clock::now() < until;) drain(10ms);
  say("done " + std::to_string(sent) + " refused " + std::to_string(refused));
  block();
}

int request_flood(const std::string& transport, const std::string& kind, const char* address, std::uint16_t port,
                  std::size_t total, const char* from) {
  sockaddr_in target = loopback(port);
  if (::inet_pton(AF_INET, address, &target.sin_addr) != 1) die("address");
  sockaddr_in source = loopback(0);
  source.sin_addr.s_addr = 0;
  if (from != nullptr && ::inet_pton(AF_INET, from, &source.sin_addr) != 1) die("source address");
  const bool p2p = kind == "p2p";
  return transport == "roce" ? request_flood_roce(p2p, target, total, source)
                             : request_flood_iwarp(p2p, target, total, source);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 2 && args[0] == "half-request") return half_request(port_arg(argv[2]));
  if (args.size() == 2 && args[0] == "mpa-initiator") return mpa_initiator(port_arg(argv[2]));
  if (args.size() == 1 && args[0] == "mpa-responder") return mpa_responder();
  if (args.size() == 3 && args[0] == "roce-client") return roce_client(argv[2], port_arg(argv[3]));
  if (args.size() == 3 && args[0] == "roce-p2p") return roce_p2p(argv[2], port_arg(argv[3]));
  if (args.size() == 2 && args[0] == "fd-limited-server") return fd_limited_server(std::strtoull(argv[2], nullptr, 10));
  if (args.size() == 4 && args[0] == "rdma-server")
    return rdma_server(args[1], std::strtoull(argv[3], nullptr, 10), std::strtoull(argv[4], nullptr, 10));
  if (args.size() == 4 && args[0] == "p2p-collide")
    return p2p_collide(port_arg(argv[2]), std::strtoull(argv[3], nullptr, 0),
                       static_cast<std::uint32_t>(std::strtoul(argv[4], nullptr, 10)));
  if ((args.size() == 6 || args.size() == 7) && args[0] == "request-flood")
    return request_flood(args[1], args[2], argv[4], port_arg(argv[5]), std::strtoull(argv[6], nullptr, 10),
                         args.size() == 7 ? argv[7] : nullptr);
  if (args.size() == 5 && args[0] == "flood")
    return flood(port_arg(argv[2]), std::strtoull(argv[3], nullptr, 10), std::strtoull(argv[4], nullptr, 10),
                 std::strtoull(argv[5], nullptr, 10));
  std::fprintf(stderr, "usage: see the comment at the top of reliability_peer.cpp\n");
  return 64;
}
