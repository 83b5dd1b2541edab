#include "mesh/pmix_bootstrap.hpp"

#include <pmix.h>

#include <algorithm>
#include <cstring>

namespace peercm::mesh {
namespace {

std::errc to_errc(pmix_status_t status) {
  switch (status) {
    case PMIX_ERR_TIMEOUT:
      return std::errc::timed_out;
    case PMIX_ERR_UNREACH:
    case PMIX_ERR_LOST_CONNECTION:
      return std::errc::connection_reset;
    case PMIX_ERR_NOMEM:
      return std::errc::not_enough_memory;
    case PMIX_ERR_NOT_FOUND:
      return std::errc::no_such_file_or_directory;
    default:
      return std::errc::io_error;
  }
}

void set_name(pmix_proc_t& proc, const std::string& nspace, pmix_rank_t rank) {
  std::memset(&proc, 0, sizeof proc);
  const std::size_t n = std::min(nspace.size(), static_cast<std::size_t>(PMIX_MAX_NSLEN));
  std::memcpy(proc.nspace, nspace.data(), n);
  proc.rank = rank;
}

}  // namespace

Result<std::unique_ptr<PmixBootstrap>, std::errc> PmixBootstrap::create(std::string* why) {
  std::unique_ptr<PmixBootstrap> bootstrap(new PmixBootstrap());
  pmix_proc_t me;
  std::memset(&me, 0, sizeof me);
  pmix_status_t status = PMIx_Init(&me, nullptr, 0);
  if (status != PMIX_SUCCESS) {
    if (why) *why = PMIx_Error_string(status);
    return fail(std::errc::not_connected);
  }
  bootstrap->initialized_ = true;
  bootstrap->nspace_.assign(me.nspace, strnlen(me.nspace, PMIX_MAX_NSLEN));
  bootstrap->rank_ = static_cast<int>(me.rank);
  pmix_proc_t job;
  set_name(job, bootstrap->nspace_, PMIX_RANK_WILDCARD);
  pmix_value_t* value = nullptr;
  status = PMIx_Get(&job, PMIX_JOB_SIZE, nullptr, 0, &value);
  if (status != PMIX_SUCCESS || value == nullptr || value->type != PMIX_UINT32) {
    if (why) *why = std::string("PMIX_JOB_SIZE: ") + PMIx_Error_string(status);
    if (value) PMIX_VALUE_RELEASE(value);
    return fail(std::errc::protocol_error);
  }
  bootstrap->size_ = static_cast<int>(value->data.uint32);
  PMIX_VALUE_RELEASE(value);
  if (bootstrap->size_ < 1 || bootstrap->rank_ < 0 || bootstrap->rank_ >= bootstrap->size_)
    return fail(std::errc::protocol_error);
  return bootstrap;
}

PmixBootstrap::~PmixBootstrap() {
  if (initialized_) PMIx_Finalize(nullptr, 0);
}

Result<std::vector<std::vector<std::uint8_t>>, std::errc> PmixBootstrap::allgather(std::span<const std::uint8_t> bytes,
                                                                                   std::chrono::milliseconds timeout) {
  if (broken_) return fail(std::errc::connection_reset);
  auto broken = [this](pmix_status_t status) {
    broken_ = true;
    return fail(to_errc(status));
  };
  std::string key = "peercm." + std::to_string(round_);
  // A marker byte in front: PMIx values of zero bytes are not portable.
  std::string blob(1, '\x01');
  blob.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  pmix_value_t value;
  std::memset(&value, 0, sizeof value);
  value.type = PMIX_BYTE_OBJECT;
  value.data.bo.bytes = blob.data();
  value.data.bo.size = blob.size();
  if (auto status = PMIx_Put(PMIX_GLOBAL, key.c_str(), &value); status != PMIX_SUCCESS) return broken(status);
  if (auto status = PMIx_Commit(); status != PMIX_SUCCESS) return broken(status);

  pmix_proc_t job;
  set_name(job, nspace_, PMIX_RANK_WILDCARD);
  pmix_info_t info[2];
  PMIX_INFO_CONSTRUCT(&info[0]);
  PMIX_INFO_CONSTRUCT(&info[1]);
  bool collect = true;
  const int seconds = static_cast<int>(std::max<long long>(1, (timeout.count() + 999) / 1000));
  PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
  const pmix_status_t fenced = PMIx_Fence(&job, 1, info, 2);
  PMIX_INFO_DESTRUCT(&info[0]);
  PMIX_INFO_DESTRUCT(&info[1]);
  if (fenced != PMIX_SUCCESS) return broken(fenced);

  const auto n = static_cast<std::size_t>(size_);
  std::vector<std::vector<std::uint8_t>> table(n);
  for (std::size_t r = 0; r < n; ++r) {
    pmix_proc_t peer;
    set_name(peer, nspace_, static_cast<pmix_rank_t>(r));
    pmix_value_t* got = nullptr;
    const pmix_status_t status = PMIx_Get(&peer, key.c_str(), nullptr, 0, &got);
    if (status != PMIX_SUCCESS || got == nullptr || got->type != PMIX_BYTE_OBJECT || got->data.bo.size < 1) {
      if (got) PMIX_VALUE_RELEASE(got);
      failed_rank_ = static_cast<int>(r);
      return broken(status == PMIX_SUCCESS ? PMIX_ERROR : status);
    }
    const auto* at = reinterpret_cast<const std::uint8_t*>(got->data.bo.bytes);
    table[r].assign(at + 1, at + got->data.bo.size);
    PMIX_VALUE_RELEASE(got);
  }
  ++round_;
  failed_rank_ = -1;
  return table;
}

}  // namespace peercm::mesh
