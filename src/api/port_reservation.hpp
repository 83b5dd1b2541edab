// rdma_cm's binding, which takes the port when the id is bound, as the kernel's rdma_cm does:
// a second id binding the same address and port fails then (EADDRINUSE), not when it listens,
// and rdma_get_src_port() reads the port the id will use as soon as it has one. CmId::bind()
// only records an address (a Mesh binds its active ids to its listener's address); the C API
// binds through here.
#pragma once

#include <netinet/in.h>

#include <system_error>

#include "peercm/cm.hpp"
#include "peercm/result.hpp"

namespace peercm::detail {

// bind() that reserves the port (0: a free one, known on return through local_address()).
// iWARP: a TCP socket bound to the address, which the id later listens on or connects from;
// EADDRINUSE when a listener or another bound id holds it, EADDRNOTAVAIL for an address
// not this host's. RoCE: the service port in the device's port space, on the address
// (whose UDP port 4791 the device opens now: EADDRINUSE when another node holds it).
Status<std::errc> bind_reserving_port(CmId& id, const sockaddr_in& address);

// resolve_addr()'s implicit bind for an iWARP id that has none: the address the host's routes
// use towards `destination` and a free port, reserved as above, so that the id's source is
// known at ADDR_RESOLVED (a RoCE id gets its own in resolve_addr()). Nothing for a bound id.
Status<std::errc> bind_source_towards(CmId& id, const sockaddr_in& destination);

}  // namespace peercm::detail
