// The CM header and the CM reject (design.md §3 rule 1) from any MPA private data.
// Oracles: both codecs are canonical — a decoded header re-encodes to exactly the 36 bytes it
// came from and its application data is exactly what follows them, a decoded reject
// re-encodes to exactly its 8 bytes; and a header built from arbitrary field values encodes
// (unless it sets unknown flags) and decodes back to itself.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "fuzz_support.hpp"
#include "wire/byte_io.hpp"
#include "wire/cm_header.hpp"

namespace {

using namespace peercm::wire;

void check_decode(std::span<const std::uint8_t> pd) {
  auto view = decode_cm_header(pd);
  if (view) {
    FUZZ_CHECK(pd.size() >= kCmHeaderSize, "header decoded from fewer than 36 bytes");
    std::array<std::uint8_t, kCmHeaderSize> encoded{};
    auto written = encode_cm_header(view->header, encoded);
    FUZZ_CHECK(written.has_value() && *written == kCmHeaderSize, "a decoded CM header does not encode");
    FUZZ_CHECK(std::memcmp(encoded.data(), pd.data(), kCmHeaderSize) == 0, "CM header is not canonical");
    FUZZ_CHECK(view->application_data.data() == pd.data() + kCmHeaderSize &&
                   view->application_data.size() == pd.size() - kCmHeaderSize,
               "application data is not the rest of the private data");
  }
  auto reason = decode_cm_reject(pd);
  if (reason) {
    FUZZ_CHECK(pd.size() == kCmRejectSize, "CM reject of the wrong size accepted");
    std::array<std::uint8_t, kCmRejectSize> encoded{};
    auto written = encode_cm_reject(*reason, encoded);
    FUZZ_CHECK(written.has_value() && *written == kCmRejectSize, "a decoded CM reject does not encode");
    FUZZ_CHECK(std::memcmp(encoded.data(), pd.data(), kCmRejectSize) == 0, "CM reject is not canonical");
  }
  // One magic each: the same bytes are never both.
  FUZZ_CHECK(!(view && reason), "bytes decode as both a CM header and a CM reject");
}

void check_encode(std::span<const std::uint8_t> fields) {
  if (fields.size() < 27) return;
  const std::uint8_t* p = fields.data();
  CmHeader h{.flags = p[0],
             .node_guid = load_be64(p + 1),
             .incarnation = load_be64(p + 9),
             .listen_port = load_be16(p + 17),
             .tag = load_be32(p + 19),
             .cmid = load_be32(p + 23)};
  std::array<std::uint8_t, kCmHeaderSize> encoded{};
  auto written = encode_cm_header(h, encoded);
  if (h.flags & ~CmHeader::kKnownFlags) {
    FUZZ_CHECK(!written && written.error() == WireError::cm_reserved_bits_set, "unknown CM flags encoded");
    return;
  }
  FUZZ_CHECK(written.has_value(), "a valid CM header does not encode");
  auto back = decode_cm_header(encoded);
  FUZZ_CHECK(back.has_value() && back->header == h, "CM header does not survive a round trip");
  FUZZ_CHECK(back->application_data.empty(), "application data appeared from nowhere");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  check_decode(bytes);
  check_encode(bytes);
  return 0;
}
