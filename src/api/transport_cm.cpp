#include "api/transport_cm.hpp"

#include "api/context_impl.hpp"
#include "api/iwarp_cm.hpp"
#include "api/roce/roce_cm.hpp"

namespace peercm {

std::string_view to_string(Transport transport) {
  switch (transport) {
    case Transport::iwarp: return "iwarp";
    case Transport::roce: return "roce";
  }
  return "unknown";
}

namespace detail {

TransportCm* transport_cm(ContextImpl& ctx, Transport transport) {
  switch (transport) {
    case Transport::iwarp:
      if (!ctx.cms[0]) ctx.cms[0] = std::make_unique<IwarpCm>(ctx);
      return ctx.cms[0].get();
    case Transport::roce:
      ctx.want_roce_slot();  // before the ids' QPs are numbered
      if (!ctx.cms[1]) ctx.cms[1] = std::make_unique<roce::RoceCm>(ctx);
      return ctx.cms[1].get();
  }
  return nullptr;
}

}  // namespace detail
}  // namespace peercm
