// rdma_getaddrinfo: names and services to the addresses rdma_create_ep() takes. One result,
// IPv4, for a connected (RC) endpoint, or a UD one in rdma_cm's UDP port space (RDMA_PS_UDP or
// IBV_QPT_UD in the hints); errors are getaddrinfo's EAI_* codes, and -1 with errno EINVAL
// for no name, no service and no hints (librdmacm's).
#include <netdb.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "capi/handles.hpp"

namespace {

sockaddr* copy_address(const sockaddr* address, socklen_t length) {
  auto* copy = static_cast<sockaddr*>(std::malloc(length));
  if (copy) std::memcpy(copy, address, length);
  return copy;
}

// rdma_getaddrinfo(NULL, NULL, hints): a result holding the hints' destination (if any) and
// source (if any) addresses, which must be IPv4 like every address here.
int addresses_of_hints(const rdma_addrinfo* hints, bool datagram, rdma_addrinfo** res) {
  if (!hints) {
    errno = EINVAL;
    return -1;
  }
  for (const auto& [address, length] : {std::pair{hints->ai_dst_addr, hints->ai_dst_len},
                                        std::pair{hints->ai_src_addr, hints->ai_src_len}}) {
    if (length && (!address || address->sa_family != AF_INET || length < sizeof(sockaddr_in))) return EAI_FAMILY;
  }
  auto* rai = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
  if (!rai) return EAI_MEMORY;
  rai->ai_flags = hints->ai_flags;
  rai->ai_family = AF_INET;
  rai->ai_qp_type = datagram ? IBV_QPT_UD : IBV_QPT_RC;
  rai->ai_port_space = datagram ? RDMA_PS_UDP : RDMA_PS_TCP;
  bool ok = true;
  if (hints->ai_dst_len) {
    rai->ai_dst_addr = copy_address(hints->ai_dst_addr, hints->ai_dst_len);
    rai->ai_dst_len = hints->ai_dst_len;
    ok = rai->ai_dst_addr != nullptr;
  }
  if (ok && hints->ai_src_len) {
    rai->ai_src_addr = copy_address(hints->ai_src_addr, hints->ai_src_len);
    rai->ai_src_len = hints->ai_src_len;
    ok = rai->ai_src_addr != nullptr;
  }
  if (!ok) {
    rdma_freeaddrinfo(rai);
    return EAI_MEMORY;
  }
  *res = rai;
  return 0;
}

}  // namespace

int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res) {
  if (!res) return EAI_SYSTEM;
  const int flags = hints ? hints->ai_flags : 0;
  bool datagram = false;
  if (hints) {
    if (hints->ai_family != AF_UNSPEC && hints->ai_family != AF_INET) return EAI_FAMILY;
    if (hints->ai_qp_type != 0 && hints->ai_qp_type != IBV_QPT_RC && hints->ai_qp_type != IBV_QPT_UD)
      return EAI_SOCKTYPE;
    if (hints->ai_port_space != 0 && hints->ai_port_space != RDMA_PS_TCP && hints->ai_port_space != RDMA_PS_IB &&
        hints->ai_port_space != RDMA_PS_UDP)
      return EAI_SOCKTYPE;
    datagram = hints->ai_port_space == RDMA_PS_UDP || hints->ai_qp_type == IBV_QPT_UD;
    // librdmacm pairs UD with the UDP port space and RC with TCP's; a mixed pair names nothing.
    if (datagram && (hints->ai_qp_type == IBV_QPT_RC ||
                     (hints->ai_port_space != 0 && hints->ai_port_space != RDMA_PS_UDP)))
      return EAI_SOCKTYPE;
  }
  // No name and no service: the addresses are the hints' own, as in librdmacm (libfabric's
  // verbs provider asks this way for an endpoint towards an address it already has).
  if (!node && !service) return addresses_of_hints(hints, datagram, res);
  addrinfo ip_hints{};
  ip_hints.ai_family = AF_INET;
  ip_hints.ai_socktype = SOCK_STREAM;
  if (flags & RAI_PASSIVE) ip_hints.ai_flags |= AI_PASSIVE;
  if (flags & RAI_NUMERICHOST) ip_hints.ai_flags |= AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (const int error = ::getaddrinfo(node, service, &ip_hints, &found); error != 0) return error;

  auto* rai = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
  if (!rai) {
    ::freeaddrinfo(found);
    return EAI_MEMORY;
  }
  rai->ai_flags = flags;
  rai->ai_family = AF_INET;
  rai->ai_qp_type = datagram ? IBV_QPT_UD : IBV_QPT_RC;
  rai->ai_port_space = datagram ? RDMA_PS_UDP : RDMA_PS_TCP;
  bool ok = true;
  if (flags & RAI_PASSIVE) {
    rai->ai_src_addr = copy_address(found->ai_addr, found->ai_addrlen);
    rai->ai_src_len = found->ai_addrlen;
    ok = rai->ai_src_addr != nullptr;
  } else {
    rai->ai_dst_addr = copy_address(found->ai_addr, found->ai_addrlen);
    rai->ai_dst_len = found->ai_addrlen;
    ok = rai->ai_dst_addr != nullptr;
    if (ok && hints && hints->ai_src_addr && hints->ai_src_len) {
      rai->ai_src_addr = copy_address(hints->ai_src_addr, hints->ai_src_len);
      rai->ai_src_len = hints->ai_src_len;
      ok = rai->ai_src_addr != nullptr;
    }
  }
  ::freeaddrinfo(found);
  if (!ok) {
    rdma_freeaddrinfo(rai);
    return EAI_MEMORY;
  }
  *res = rai;
  return 0;
}

void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    std::free(res->ai_src_addr);
    std::free(res->ai_dst_addr);
    std::free(res->ai_src_canonname);
    std::free(res->ai_dst_canonname);
    std::free(res->ai_route);
    std::free(res->ai_connect);
    std::free(res);
    res = next;
  }
}
