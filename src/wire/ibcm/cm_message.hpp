// A whole CM MAD (IBTA Vol 1 ch. 12-13; roce-ibcm-wire.md §3.2-3.3, §4): the 24-byte common
// header with class CM, version 2, method Send, and one of the seven connection messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>

#include "peercm/result.hpp"
#include "wire/ibcm/cm_common.hpp"
#include "wire/ibcm/cm_establish.hpp"
#include "wire/ibcm/cm_release.hpp"
#include "wire/ibcm/cm_rep.hpp"
#include "wire/ibcm/cm_req.hpp"
#include "wire/ibcm/mad.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::ibcm {

using CmMessage = std::variant<CmReq, CmMra, CmRej, CmRep, CmRtu, CmDreq, CmDrep>;

CmAttribute attribute_of(const CmMessage& message);

struct CmMad {
  // §3.3: answers reuse the TID of what they answer; resends reuse their own.
  std::uint64_t transaction_id = 0;
  std::uint32_t attribute_modifier = 0;
  CmMessage message;
};

// Writes the 256-byte MAD; status and class-specific are 0, the attribute ID follows the
// message. Fails with buffer_too_small or the message encoder's error.
Result<std::size_t, WireError> encode_cm_mad(const CmMad& mad, std::span<std::uint8_t> out);

// Decodes exactly one 256-byte MAD. Checks, in order: length (mad_bad_length), base version,
// class, class version, method, attribute (ibcm_unknown_attribute for ClassPortInfo, SIDR,
// LAP, APR and unknown IDs), then the message's own reserved values. Status and
// class-specific are not checked (Linux's CM ignores them). Private data views point into
// `mad`.
Result<CmMad, WireError> decode_cm_mad(std::span<const std::uint8_t> mad);

}  // namespace peercm::wire::ibcm
