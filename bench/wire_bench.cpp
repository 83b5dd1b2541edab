// Wire-codec microbenchmarks: CRC32C and memcpy throughput, FPDU encode+decode rate.
//
// Targets (checked by bench/run_wire_bench.sh): CRC32C >= 5 GB/s on one core for 64 KiB
// buffers, small-FPDU header encode+decode >= 20 M/s.
#include <benchmark/benchmark.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <vector>

#include "wire/crc32c.hpp"
#include "wire/ddp_rdmap.hpp"
#include "wire/fpdu.hpp"

namespace {

using namespace peercm::wire;

// The largest payload one FPDU carries behind a tagged header: ULPDU_Length is 16 bits,
// so a "64 KiB" FPDU is 65535 - 14 = 65521 payload bytes.
constexpr std::int64_t kLargestTaggedPayload =
    static_cast<std::int64_t>(kMaxUlpduLength - kTaggedHeaderSize);

std::vector<std::uint8_t> make_buffer(std::size_t size) {
  std::vector<std::uint8_t> buffer(size);
  std::uint32_t x = 0x12345678u;  // xorshift32: deterministic, not all zero
  for (auto& b : buffer) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::uint8_t>(x);
  }
  return buffer;
}

std::size_t arg_size(const benchmark::State& state, std::size_t index) {
  return static_cast<std::size_t>(state.range(index));
}

std::int64_t processed(const benchmark::State& state, std::size_t per_iteration) {
  return static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(per_iteration);
}

SegmentHeader bench_header(bool tagged) {
  SegmentHeader h;
  if (tagged) {
    h.opcode = RdmapOpcode::rdma_write;
    h.stag = 0x00ABCD01u;
    h.tagged_offset = 0x10000;
  } else {
    h.opcode = RdmapOpcode::send;
    h.queue_number = kQueueSend;
    h.msn = 1;
  }
  return h;
}

// Feeds the pieces to the decoder as consecutive stream input and folds what comes out
// into `sink`. Returns the number of complete FPDUs (end or whole events), or -1 on a decode error.
int decode_pieces(FpduStreamDecoder& decoder, std::initializer_list<std::span<const std::uint8_t>> pieces,
                  std::uint64_t& sink) {
  int ends = 0;
  for (auto piece : pieces) {
    while (!piece.empty()) {
      std::size_t consumed = 0;
      const FpduEvent event = decoder.next(piece, consumed);
      piece = piece.subspan(consumed);
      switch (event.kind) {
        case FpduEvent::Kind::header:
          sink += event.payload_length + (event.header ? event.header->msn + event.header->tagged_offset : 0);
          break;
        case FpduEvent::Kind::payload:
          sink += event.payload.size() + event.payload[0];
          break;
        case FpduEvent::Kind::end:
          ++ends;
          break;
        case FpduEvent::Kind::whole:
          sink += event.payload_length + event.header->msn + event.header->tagged_offset;
          ++ends;
          break;
        case FpduEvent::Kind::need_more:
          break;
        case FpduEvent::Kind::error:
          return -1;
      }
    }
  }
  return ends;
}

// --- CRC32C and its memcpy baseline -------------------------------------------------------

void BM_Crc32c(benchmark::State& state) {
  const auto buffer = make_buffer(arg_size(state, 0));
  const std::span<const std::uint8_t> bytes(buffer);
  for (auto _ : state) {
    benchmark::DoNotOptimize(bytes.data());
    std::uint32_t crc = crc32c(bytes);
    benchmark::DoNotOptimize(crc);
  }
  state.SetBytesProcessed(processed(state, bytes.size()));
}
BENCHMARK(BM_Crc32c)->Arg(64)->Arg(4 << 10)->Arg(64 << 10)->Arg(1 << 20);

void BM_Memcpy(benchmark::State& state) {
  const std::size_t size = arg_size(state, 0);
  const auto src = make_buffer(size);
  std::vector<std::uint8_t> dst(size);
  for (auto _ : state) {
    benchmark::DoNotOptimize(src.data());
    std::memcpy(dst.data(), src.data(), size);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(processed(state, size));
}
BENCHMARK(BM_Memcpy)->Arg(64)->Arg(4 << 10)->Arg(64 << 10)->Arg(1 << 20);

// --- FPDU encode + decode ------------------------------------------------------------------

// Zero-copy send path: FpduFramer builds prefix and trailer around a payload that stays
// where it is; the receive side sees prefix, payload and trailer as consecutive stream bytes.
void BM_FpduFramerRoundTrip(benchmark::State& state) {
  const std::size_t payload_size = arg_size(state, 0);
  const bool with_crc = state.range(1) != 0;
  const auto payload_buffer = make_buffer(payload_size);
  const std::span<const std::uint8_t> payload(payload_buffer);
  SegmentHeader header = bench_header(true);
  FpduFramer framer;
  FpduStreamDecoder decoder(with_crc);
  std::uint64_t sink = 0;
  std::int64_t fpdus = 0;
  for (auto _ : state) {
    header.tagged_offset += payload_size;
    if (!framer.begin(header, payload_size)) {
      state.SkipWithError("FpduFramer::begin failed");
      break;
    }
    const auto prefix = framer.prefix();
    if (with_crc) framer.add_payload(payload);
    const auto trailer = framer.finish(with_crc);
    const int ends = decode_pieces(decoder, {prefix, payload, trailer}, sink);
    if (ends != 1) {
      state.SkipWithError("decode did not yield exactly one FPDU");
      break;
    }
    fpdus += ends;
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(fpdus);
  // With CRC off neither side touches the payload, so a byte rate would mean nothing.
  if (with_crc) state.SetBytesProcessed(fpdus * static_cast<std::int64_t>(payload_size));
}
BENCHMARK(BM_FpduFramerRoundTrip)
    ->ArgNames({"payload", "crc"})
    ->ArgsProduct({{64, kLargestTaggedPayload}, {0, 1}});

// Copying path: encode_fpdu into a preallocated buffer, then decode it as one contiguous read.
void BM_EncodeFpduRoundTrip(benchmark::State& state) {
  const std::size_t payload_size = arg_size(state, 0);
  const bool with_crc = state.range(1) != 0;
  const auto payload_buffer = make_buffer(payload_size);
  const std::span<const std::uint8_t> payload(payload_buffer);
  SegmentHeader header = bench_header(true);
  std::vector<std::uint8_t> wire(fpdu_wire_size(kTaggedHeaderSize + payload_size));
  FpduStreamDecoder decoder(with_crc);
  std::uint64_t sink = 0;
  std::int64_t fpdus = 0;
  for (auto _ : state) {
    header.tagged_offset += payload_size;
    auto size = encode_fpdu(header, payload, with_crc, wire);
    if (!size) {
      state.SkipWithError("encode_fpdu failed");
      break;
    }
    benchmark::DoNotOptimize(wire.data());
    const int ends = decode_pieces(decoder, {std::span<const std::uint8_t>(wire).first(*size)}, sink);
    if (ends != 1) {
      state.SkipWithError("decode did not yield exactly one FPDU");
      break;
    }
    fpdus += ends;
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(fpdus);
  state.SetBytesProcessed(fpdus * static_cast<std::int64_t>(payload_size));
}
BENCHMARK(BM_EncodeFpduRoundTrip)
    ->ArgNames({"payload", "crc"})
    ->ArgsProduct({{64, kLargestTaggedPayload}, {0, 1}});

// Small FPDU, CRC off: header framing (FpduFramer) plus stream decode of header and
// trailer; the payload (0 or 8 bytes) is not touched by the sender. tagged=1 is an RDMA
// Write (14-byte DDP header), tagged=0 a Send (18-byte header).
void BM_SmallFpduHeader(benchmark::State& state) {
  const std::size_t payload_size = arg_size(state, 0);
  const bool tagged = state.range(1) != 0;
  const std::array<std::uint8_t, 8> payload_buffer{1, 2, 3, 4, 5, 6, 7, 8};
  const auto payload = std::span<const std::uint8_t>(payload_buffer).first(payload_size);
  SegmentHeader header = bench_header(tagged);
  FpduFramer framer;
  FpduStreamDecoder decoder(false);
  std::uint64_t sink = 0;
  std::int64_t fpdus = 0;
  for (auto _ : state) {
    ++header.msn;
    header.tagged_offset += payload_size;
    if (!framer.begin(header, payload_size)) {
      state.SkipWithError("FpduFramer::begin failed");
      break;
    }
    const auto prefix = framer.prefix();
    const auto trailer = framer.finish(false);
    const int ends = decode_pieces(decoder, {prefix, payload, trailer}, sink);
    if (ends != 1) {
      state.SkipWithError("decode did not yield exactly one FPDU");
      break;
    }
    fpdus += ends;
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(fpdus);
}
BENCHMARK(BM_SmallFpduHeader)->ArgNames({"payload", "tagged"})->ArgsProduct({{0, 8}, {1, 0}});

}  // namespace
