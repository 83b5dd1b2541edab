// A connected rsocket: the kernel's TCP connection carrying framed messages, so that
// riowrite() can place bytes in memory the peer mapped with riomap() while that peer makes no
// call at all (riostream spins on a byte of its buffer). docs/c-api.md "rsockets" has the model:
//
// - Every frame is a 16-byte header (type, payload length, offset) and its payload:
//   data (rsend's bytes), iomap / iounmap (the sender mapped or unmapped a region of its
//   memory at an offset), iowrite (bytes for the receiver's mapped region at an offset).
// - A process-wide agent thread reads every link's TCP connection. It places iowrite
//   payloads, keeps the peer's mappings, and passes data payloads on into a UNIX socket pair
//   whose one end has taken the application's descriptor number (dup3): rrecv, rpoll and
//   rselect are then the kernel's calls on that end, and readability means stream bytes.
// - The application's thread writes frames to the TCP connection directly (rsend, riowrite).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace peercm::capi::rsock {

enum class FrameType : std::uint8_t { data = 1, iomap = 2, iounmap = 3, iowrite = 4 };

constexpr std::size_t kFrameHeaderSize = 16;
// The largest payload one frame carries; a larger rsend/riowrite is split.
constexpr std::uint32_t kMaxFramePayload = 1u << 20;
// Mappings a peer may announce on one link: more is a protocol error (bounds the agent's memory).
constexpr std::size_t kMaxPeerMappings = 1024;

struct FrameHeader {
  FrameType type = FrameType::data;
  std::uint32_t length = 0;  // payload bytes (iomap: the region's length, with no payload)
  std::uint64_t offset = 0;  // iomap/iounmap/iowrite: the region's offset in the mapping space
};

void encode_header(const FrameHeader& header, std::uint8_t* out);
// False for an unknown type or a payload above kMaxFramePayload: the peer broke the framing.
bool decode_header(const std::uint8_t* in, FrameHeader& header);

struct Region {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::uint8_t* base = nullptr;  // local mappings only
};

class Link {
 public:
  Link(int app_fd, int tcp_fd, int agent_fd, bool nonblocking);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  int tcp_fd() const { return tcp_fd_; }
  int agent_fd() const { return agent_fd_; }
  int app_fd() const { return app_fd_; }
  void set_nonblocking(bool on);

  // The application's side. Each returns what the rsocket call returns (errno set on -1).
  ssize_t send_data(const std::uint8_t* bytes, std::size_t length, int flags);
  off_t map(void* buffer, std::size_t length, off_t offset);
  int unmap(void* buffer, std::size_t length);
  ssize_t write_remote(const std::uint8_t* bytes, std::size_t length, std::uint64_t offset, int flags);

  // The agent's side: consume what the TCP connection delivered; false ends the link
  // (EOF, error, or a broken frame). `want_write` tells whether data waits for the pair.
  bool on_tcp_readable();
  bool on_pair_writable();
  bool pending_to_application() const { return pending_begin_ < pending_end_; }
  void end_stream();

 private:
  ssize_t send_frame(const FrameHeader& header, const std::uint8_t* payload, int flags);
  ssize_t send_frames(FrameType type, const std::uint8_t* bytes, std::size_t length, std::uint64_t offset, int flags);
  bool parse();
  bool flush_pending();
  void place(std::uint64_t offset, const std::uint8_t* bytes, std::size_t n, bool frame_ends);

  const int app_fd_;
  const int tcp_fd_;
  const int agent_fd_;
  bool nonblocking_;

  std::mutex send_mutex_;  // one frame at a time on the wire
  std::mutex maps_mutex_;  // local_ and peer_ (the application maps, the agent places)
  std::vector<Region> local_;
  std::vector<Region> peer_;

  // Agent state: bytes read from TCP and not yet taken, and the frame being parsed.
  std::vector<std::uint8_t> in_;
  std::size_t in_begin_ = 0;
  std::size_t in_end_ = 0;
  bool in_header_ = true;
  FrameHeader frame_;
  std::uint64_t frame_done_ = 0;  // payload bytes of frame_ consumed
  // Data payload bytes (a span of in_) the pair did not take yet.
  std::size_t pending_begin_ = 0;
  std::size_t pending_end_ = 0;
};

// The registry of links by application descriptor, and the agent thread (started with the
// first link, for the life of the process, like the verbs context the rdma_cm ids share).
std::shared_ptr<Link> find(int app_fd);
// Makes `fd`, a connected TCP socket, a framed rsocket. Returns the link, or null with errno
// (ENOTSUP for a datagram socket: those stay the kernel's sockets).
std::shared_ptr<Link> attach(int fd);
// Drops the link of `fd` (rclose); true when there was one.
bool detach(int fd);

}  // namespace peercm::capi::rsock
