#include "wire/ibcm/cm_message.hpp"

namespace peercm::wire::ibcm {
namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace

CmAttribute attribute_of(const CmMessage& message) {
  return std::visit(Overloaded{[](const CmReq&) { return CmAttribute::req; },
                               [](const CmMra&) { return CmAttribute::mra; },
                               [](const CmRej&) { return CmAttribute::rej; },
                               [](const CmRep&) { return CmAttribute::rep; },
                               [](const CmRtu&) { return CmAttribute::rtu; },
                               [](const CmDreq&) { return CmAttribute::dreq; },
                               [](const CmDrep&) { return CmAttribute::drep; }},
                    message);
}

Result<std::size_t, WireError> encode_cm_mad(const CmMad& mad, std::span<std::uint8_t> out) {
  if (out.size() < kMadSize) return fail(WireError::buffer_too_small);
  const MadHeader header{.transaction_id = mad.transaction_id,
                         .attribute_id = static_cast<std::uint16_t>(attribute_of(mad.message)),
                         .attribute_modifier = mad.attribute_modifier};
  auto body = out.subspan(kMadHeaderSize).first<kCmMessageSize>();
  const Status<WireError> ok =
      std::visit(Overloaded{[&](const CmReq& m) { return encode_cm_req(m, body); },
                            [&](const CmMra& m) { return encode_cm_mra(m, body); },
                            [&](const CmRej& m) { return encode_cm_rej(m, body); },
                            [&](const CmRep& m) { return encode_cm_rep(m, body); },
                            [&](const CmRtu& m) { return encode_cm_rtu(m, body); },
                            [&](const CmDreq& m) { return encode_cm_dreq(m, body); },
                            [&](const CmDrep& m) { return encode_cm_drep(m, body); }},
                 mad.message);
  if (!ok) return fail(ok.error());
  encode_mad_header(header, out.first<kMadHeaderSize>());
  return kMadSize;
}

Result<CmMad, WireError> decode_cm_mad(std::span<const std::uint8_t> mad) {
  if (mad.size() != kMadSize) return fail(WireError::mad_bad_length);
  const MadHeader h = decode_mad_header(mad.first<kMadHeaderSize>());
  if (h.base_version != kMadBaseVersion) return fail(WireError::mad_bad_base_version);
  if (h.management_class != kMgmtClassCm) return fail(WireError::mad_bad_class);
  // A CM answers another class version with REJ reason 31 (§4.8); the caller sees the error.
  if (h.class_version != kCmClassVersion) return fail(WireError::mad_bad_class_version);
  if (h.method != method::kSend) return fail(WireError::mad_bad_method);
  const auto body = mad.subspan(kMadHeaderSize).first<kCmMessageSize>();
  CmMad out{.transaction_id = h.transaction_id, .attribute_modifier = h.attribute_modifier, .message = CmRtu{}};
  switch (static_cast<CmAttribute>(h.attribute_id)) {
    case CmAttribute::req: out.message = decode_cm_req(body); break;
    case CmAttribute::mra: {
      auto m = decode_cm_mra(body);
      if (!m) return fail(m.error());
      out.message = *m;
      break;
    }
    case CmAttribute::rej: {
      auto m = decode_cm_rej(body);
      if (!m) return fail(m.error());
      out.message = *m;
      break;
    }
    case CmAttribute::rep: out.message = decode_cm_rep(body); break;
    case CmAttribute::rtu: out.message = decode_cm_rtu(body); break;
    case CmAttribute::dreq: out.message = decode_cm_dreq(body); break;
    case CmAttribute::drep: out.message = decode_cm_drep(body); break;
    default: return fail(WireError::ibcm_unknown_attribute);
  }
  return out;
}

}  // namespace peercm::wire::ibcm
