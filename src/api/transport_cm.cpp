#include "api/transport_cm.hpp"

#include "api/context_impl.hpp"
#include "api/iwarp_cm.hpp"
#include "api/roce/roce_cm.hpp"

namespace peercm::detail {

TransportCm* transport_cm(ContextImpl& ctx, Transport transport) {
  switch (transport) {
    case Transport::iwarp:
      if (!ctx.cms[0]) ctx.cms[0] = std::make_unique<IwarpCm>(ctx);
      return ctx.cms[0].get();
    case Transport::roce:
      if (!ctx.cms[1]) ctx.cms[1] = std::make_unique<roce::RoceCm>(ctx);
      return ctx.cms[1].get();
  }
  return nullptr;
}

}  // namespace peercm::detail
