#include "wire/roce/aeth.hpp"

#include <array>

#include "wire/byte_io.hpp"

namespace peercm::wire::roce {
namespace {

constexpr std::uint32_t kMsnMask = 0x00FFFFFF;
constexpr std::uint8_t kKindMask = 0x03;
constexpr std::uint8_t kReservedKind = 2;  // syndrome bits 6-5 = 10
constexpr std::uint8_t kLastNakCode = static_cast<std::uint8_t>(NakCode::invalid_rd_request);

// roce-ibcm-wire.md §2.6: credit codes 0-30.
constexpr std::array<std::uint32_t, 31> kCredits = {
    0,   1,   2,   3,    4,    6,    8,    12,   16,   24,    32,    48,    64,    96,    128,  192,
    256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768};

// roce-ibcm-wire.md §2.7: RNR timer codes, in microseconds.
constexpr std::array<std::uint32_t, 32> kRnrTimerUs = {
    655360, 10,   20,   30,   40,   60,    80,    120,   160,   240,   320,    480,    640,    960,    1280,   1920,
    2560,   3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};

}  // namespace

Result<Aeth, WireError> decode_aeth(std::span<const std::uint8_t, kAethSize> b) {
  const std::uint8_t syndrome = b[0];
  const std::uint8_t kind = (syndrome >> 5) & kKindMask;
  const std::uint8_t value = syndrome & kMaxAethValue;
  if (kind == kReservedKind) return fail(WireError::roce_bad_aeth);
  if (kind == static_cast<std::uint8_t>(AethKind::nak) && value > kLastNakCode) return fail(WireError::roce_bad_aeth);
  return Aeth{.kind = static_cast<AethKind>(kind), .value = value, .msn = load_be32(b.data()) & kMsnMask};
}

Status<WireError> encode_aeth(const Aeth& a, std::span<std::uint8_t, kAethSize> out) {
  if (a.value > kMaxAethValue || a.msn > kMsnMask) return fail(WireError::roce_field_out_of_range);
  if (a.kind != AethKind::ack && a.kind != AethKind::rnr_nak && a.kind != AethKind::nak)
    return fail(WireError::roce_bad_aeth);
  if (a.kind == AethKind::nak && a.value > kLastNakCode) return fail(WireError::roce_bad_aeth);
  store_be32(out.data(), a.msn);
  out[0] = a.syndrome();
  return {};
}

std::optional<std::uint32_t> credit_count(std::uint8_t credit_code) {
  if (credit_code >= kCredits.size()) return std::nullopt;
  return kCredits[credit_code];
}

std::uint8_t credit_code_for(std::uint32_t available) {
  std::uint8_t code = 0;
  for (std::uint8_t i = 0; i < kCredits.size(); ++i) {
    if (kCredits[i] <= available) code = i;
  }
  return code;
}

std::uint32_t rnr_timer_us(std::uint8_t timer_code) {
  return timer_code < kRnrTimerUs.size() ? kRnrTimerUs[timer_code] : 0;
}

}  // namespace peercm::wire::roce
