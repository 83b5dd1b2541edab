// rsockets as the kernel's TCP sockets (see rdma/rsocket.h for why): each call forwards to
// its socket counterpart, so rpoll()/rselect() also serve any other descriptor.
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdarg>

#include "capi/handles.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
#include <rdma/rsocket.h>
#pragma GCC diagnostic pop

int rsocket(int domain, int type, int protocol) { return ::socket(domain, type, protocol); }
int rbind(int socket, const sockaddr* addr, socklen_t addrlen) { return ::bind(socket, addr, addrlen); }
int rlisten(int socket, int backlog) { return ::listen(socket, backlog); }
int raccept(int socket, sockaddr* addr, socklen_t* addrlen) { return ::accept(socket, addr, addrlen); }
int rconnect(int socket, const sockaddr* addr, socklen_t addrlen) { return ::connect(socket, addr, addrlen); }
int rshutdown(int socket, int how) { return ::shutdown(socket, how); }
int rclose(int socket) { return ::close(socket); }

ssize_t rrecv(int socket, void* buf, size_t len, int flags) { return ::recv(socket, buf, len, flags); }
ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, sockaddr* src_addr, socklen_t* addrlen) {
  return ::recvfrom(socket, buf, len, flags, src_addr, addrlen);
}
ssize_t rrecvmsg(int socket, msghdr* msg, int flags) { return ::recvmsg(socket, msg, flags); }
ssize_t rsend(int socket, const void* buf, size_t len, int flags) { return ::send(socket, buf, len, flags); }
ssize_t rsendto(int socket, const void* buf, size_t len, int flags, const sockaddr* dest_addr, socklen_t addrlen) {
  return ::sendto(socket, buf, len, flags, dest_addr, addrlen);
}
ssize_t rsendmsg(int socket, const msghdr* msg, int flags) { return ::sendmsg(socket, msg, flags); }
ssize_t rread(int socket, void* buf, size_t count) { return ::read(socket, buf, count); }
ssize_t rreadv(int socket, const iovec* iov, int iovcnt) { return ::readv(socket, iov, iovcnt); }
ssize_t rwrite(int socket, const void* buf, size_t count) { return ::write(socket, buf, count); }
ssize_t rwritev(int socket, const iovec* iov, int iovcnt) { return ::writev(socket, iov, iovcnt); }

int rpoll(pollfd* fds, nfds_t nfds, int timeout) { return ::poll(fds, nfds, timeout); }
int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  return ::select(nfds, readfds, writefds, exceptfds, timeout);
}

int rgetpeername(int socket, sockaddr* addr, socklen_t* addrlen) { return ::getpeername(socket, addr, addrlen); }
int rgetsockname(int socket, sockaddr* addr, socklen_t* addrlen) { return ::getsockname(socket, addr, addrlen); }

int rsetsockopt(int socket, int level, int optname, const void* optval, socklen_t optlen) {
  if (level == SOL_RDMA) return 0;  // queue sizes and inline limits of a transport not used here
  return ::setsockopt(socket, level, optname, optval, optlen);
}

int rgetsockopt(int socket, int level, int optname, void* optval, socklen_t* optlen) {
  if (level == SOL_RDMA) {
    errno = ENOPROTOOPT;
    return -1;
  }
  return ::getsockopt(socket, level, optname, optval, optlen);
}

int rfcntl(int socket, int cmd, ...) {
  va_list args;
  va_start(args, cmd);
  const long arg = va_arg(args, long);  // every fcntl command rsockets use takes an int or nothing
  va_end(args);
  return ::fcntl(socket, cmd, arg);
}

// Remote I/O mapping puts the peer's riowrite() bytes into mapped memory with no call on
// this side, which needs an agent reading the connection on its own and a framed stream;
// these rsockets are plain kernel sockets with neither (docs/c-api.md), so it is not offered.
off_t riomap(int, void*, size_t, int, int, off_t) {
  errno = ENOSYS;
  return -1;
}

int riounmap(int, void*, size_t) {
  errno = ENOSYS;
  return -1;
}

size_t riowrite(int, const void*, size_t, off_t, int) {
  errno = ENOSYS;
  return 0;
}
