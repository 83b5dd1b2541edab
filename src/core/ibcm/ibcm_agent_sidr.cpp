// SIDR in the IB CM agent (IBTA Vol 1 ch. 12.11; docs/roce-wire.md "SIDR"): rdma_cm's UDP
// port space. The active side sends a SIDR_REQ naming the service (Service ID, rdma_cm's header
// in its private data), resends it on a timer, and matches the SIDR_REP by request ID and
// sender; the passive side routes the SIDR_REQ to a UDP listener, hands it up as a
// connect_request, and answers with the application's accept (status valid, QPN, Q_Key) or
// reject. Copies of a REQ are dropped while it is undecided and answered with the same REP
// afterwards. Both directions are bounded by kMaxSidrPending.
#include <algorithm>

#include "core/ibcm/ibcm_agent.hpp"
#include "wire/ibcm/rdma_cm_ip.hpp"

namespace peercm::core::ibcm {

namespace w = wire::ibcm;
using EventKind = IbCmAgentEvent::Kind;

void IbCmAgent::listen_datagram(std::uint16_t port) { datagram_listeners_.insert(port); }

void IbCmAgent::stop_listening_datagram(std::uint16_t port) { datagram_listeners_.erase(port); }

Result<IbCmId, std::errc> IbCmAgent::sidr_request(const IbCmSidrParams& params, Time now) {
  if (params.private_data.size() > kMaxSidrRequestPrivateData) return fail(std::errc::invalid_argument);
  if (sidr_out_.size() >= kMaxSidrPending) return fail(std::errc::no_buffer_space);
  // §6: rdma_cm's header leads the private data, then the application's bytes.
  std::array<std::uint8_t, w::kReqPrivateDataSize> header{};
  if (!w::encode_cma_private_data(w::CmaHeader::ipv4(config_.address, params.source_port, params.destination), {},
                                  header)) {
    return fail(std::errc::invalid_argument);
  }
  std::vector<std::uint8_t> private_data(header.begin(), header.begin() + w::kCmaHeaderSize);
  private_data.insert(private_data.end(), params.private_data.begin(), params.private_data.end());

  const std::uint32_t request_id = take_comm_id();
  SidrOutstanding out{.mad = {.destination = w::ipv4_mapped_gid(params.destination)},
                      .interval = params.retry_interval.value_or(cm_time(config_.timing.cm_response_timeout)),
                      .retries_left = params.max_retries.value_or(config_.timing.max_cm_retries),
                      .destination = params.destination,
                      .port = params.port};
  // §3.3: the TID's upper half is the agent's, the lower the request ID.
  const w::SidrMad mad{.transaction_id = (std::uint64_t{config_.tid_high} << 32) | request_id,
                       .message = w::CmSidrReq{.request_id = request_id,
                                               .service_id = w::rdma_ip_service_id(w::RdmaPortSpace::udp, params.port),
                                               .private_data = private_data}};
  if (!w::encode_sidr_mad(mad, out.mad.bytes)) return fail(std::errc::invalid_argument);
  out.deadline = now + out.interval;
  const IbCmId id = next_id_++;
  out.id = id;
  mads_.push_back(out.mad);
  sidr_out_.emplace(request_id, std::move(out));
  sidr_out_ids_.emplace(id, request_id);
  return id;
}

void IbCmAgent::handle_sidr_mad(const Gid& from, std::span<const std::uint8_t> mad, Time now) {
  auto decoded = w::decode_sidr_mad(mad);
  if (!decoded) {
    ++stats_.malformed;
    ++stats_.sidr_malformed;
    return;
  }
  if (const auto* req = std::get_if<w::CmSidrReq>(&decoded->message)) {
    on_sidr_req(*req, decoded->transaction_id, from, now);
  } else {
    on_sidr_rep(std::get<w::CmSidrRep>(decoded->message), from);
  }
}

void IbCmAgent::on_sidr_req(const w::CmSidrReq& req, std::uint64_t tid, const Gid& from, Time now) {
  const SidrRemote remote{from, req.request_id};
  // A copy of a request: still undecided, it is dropped; answered, it gets the same REP (the
  // first may have been lost).
  if (sidr_in_by_remote_.contains(remote)) {
    ++stats_.sidr_duplicates;
    return;
  }
  if (auto answered = sidr_answered_.find(remote); answered != sidr_answered_.end() && answered->second.until > now) {
    ++stats_.sidr_duplicates;
    mads_.push_back(answered->second.mad);
    return;
  }
  auto service = w::decode_rdma_ip_service_id(req.service_id);
  if (!service || service->port_space != w::RdmaPortSpace::udp || !datagram_listeners_.contains(service->port)) {
    ++stats_.sidr_no_service;
    send_sidr_rep(from, tid,
                  {.request_id = req.request_id, .status = w::SidrStatus::service_unsupported,
                   .service_id = req.service_id},
                  now);
    return;
  }
  auto cma = w::decode_cma_private_data(req.private_data);
  if (!cma || cma->header.ip_version != 4) {
    // §6: rdma_cm refuses an unknown header version or IP version; IPv6 is not done here.
    ++stats_.sidr_malformed;
    send_sidr_rep(from, tid, {.request_id = req.request_id, .status = w::SidrStatus::rejected, .service_id = req.service_id},
                  now);
    return;
  }
  if (w::ipv4_mapped_gid(w::CmaHeader::ipv4_of(cma->header.source_ip)) != from) {
    // docs/reliability.md, "CM answers": as for a REQ, rdma_cm's header names the address the
    // datagram came from, or the request is refused (to its source, like every answer).
    ++stats_.rejected_address;
    send_sidr_rep(from, tid, {.request_id = req.request_id, .status = w::SidrStatus::rejected, .service_id = req.service_id},
                  now);
    return;
  }
  if (sidr_in_.size() >= kMaxSidrPending) {
    // A flood: no state for it, no answer (its sender retries or gives up).
    ++stats_.sidr_flood_dropped;
    return;
  }
  const IbCmId id = next_id_++;
  sidr_in_.emplace(id, SidrReceived{.from = from, .tid = tid, .request_id = req.request_id, .service_id = req.service_id});
  sidr_in_by_remote_.emplace(remote, id);
  IbCmAgentEvent event{.kind = EventKind::connect_request,
                       .id = id,
                       .peer_address = w::CmaHeader::ipv4_of(cma->header.source_ip),
                       .port = cma->header.source_port,
                       .service_port = service->port,
                       .datagram = true};
  event.peer.gid = from;
  event.private_data.assign(cma->application_data.begin(), cma->application_data.end());
  push_event(std::move(event));
}

void IbCmAgent::on_sidr_rep(const w::CmSidrRep& rep, const Gid& from) {
  auto it = sidr_out_.find(rep.request_id);
  // Matched by request ID, and only from the node the request went to.
  if (it == sidr_out_.end() || it->second.mad.destination != from) {
    ++stats_.unmatched;
    ++stats_.sidr_unmatched;
    return;
  }
  const SidrOutstanding out = std::move(it->second);
  sidr_out_.erase(it);
  sidr_out_ids_.erase(out.id);
  IbCmAgentEvent event{.id = out.id, .peer_address = out.destination, .port = out.port, .datagram = true};
  event.private_data.assign(rep.private_data.begin(), rep.private_data.end());
  event.peer.gid = from;
  if (rep.status == w::SidrStatus::valid) {
    event.kind = EventKind::established;
    event.peer.qpn = rep.qpn;
    event.qkey = rep.qkey;
  } else {
    event.kind = EventKind::rejected;
    event.reason = static_cast<std::uint16_t>(rep.status);
  }
  push_event(std::move(event));
}

bool IbCmAgent::answer_sidr(IbCmId id, w::SidrStatus status, std::uint32_t qpn, std::uint32_t qkey,
                            std::span<const std::uint8_t> private_data, Time now) {
  auto it = sidr_in_.find(id);
  if (it == sidr_in_.end()) return false;
  const SidrReceived in = it->second;
  sidr_in_.erase(it);
  sidr_in_by_remote_.erase({in.from, in.request_id});
  send_sidr_rep(in.from, in.tid,
                {.request_id = in.request_id,
                 .status = status,
                 .qpn = qpn,
                 .service_id = in.service_id,
                 .qkey = qkey,
                 .private_data = private_data},
                now);
  // Copies of the REQ that cross the REP get it again until the requester must have given up.
  if (sidr_answered_.size() < kMaxSidrPending) {
    SidrAnswered answered{.until = now + cm_time(config_.timing.timewait)};
    answered.mad = mads_.back();
    sidr_answered_[{in.from, in.request_id}] = answered;
  }
  return true;
}

void IbCmAgent::send_sidr_rep(const Gid& to, std::uint64_t tid, const w::CmSidrRep& rep, Time now) {
  (void)now;
  OutboundMad mad{.destination = to};
  // §3.3: the answer carries the request's TID.
  if (w::encode_sidr_mad({.transaction_id = tid, .message = rep}, mad.bytes)) mads_.push_back(mad);
}

void IbCmAgent::sidr_timeout(Time now) {
  std::vector<std::uint32_t> expired;
  for (auto& [request_id, out] : sidr_out_) {
    if (out.deadline > now) continue;
    if (out.retries_left == 0) {
      expired.push_back(request_id);
      continue;
    }
    --out.retries_left;
    out.deadline = now + out.interval;
    mads_.push_back(out.mad);  // §3.3: resent as it was, same TID
  }
  for (std::uint32_t request_id : expired) {
    const IbCmId id = sidr_out_.at(request_id).id;
    sidr_out_.erase(request_id);
    sidr_out_ids_.erase(id);
    push_event({.kind = EventKind::unreachable, .id = id, .datagram = true});
  }
  std::erase_if(sidr_answered_, [now](const auto& entry) { return entry.second.until <= now; });
}

void IbCmAgent::sidr_deadline(std::optional<Time>& next) const {
  auto earlier = [&next](Time t) {
    if (!next || t < *next) next = t;
  };
  for (const auto& [request_id, out] : sidr_out_) earlier(out.deadline);
  for (const auto& [remote, answered] : sidr_answered_) earlier(answered.until);
}

}  // namespace peercm::core::ibcm
