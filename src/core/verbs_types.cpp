// Names of the verbs vocabulary types (for logs, tools and test output).
#include "peercm/verbs_types.hpp"

namespace peercm {

std::string_view to_string(WcStatus status) {
  switch (status) {
    case WcStatus::success: return "success";
    case WcStatus::local_length_error: return "local_length_error";
    case WcStatus::local_qp_operation_error: return "local_qp_operation_error";
    case WcStatus::local_protection_error: return "local_protection_error";
    case WcStatus::wr_flush_error: return "wr_flush_error";
    case WcStatus::remote_invalid_request_error: return "remote_invalid_request_error";
    case WcStatus::remote_access_error: return "remote_access_error";
    case WcStatus::remote_operation_error: return "remote_operation_error";
    case WcStatus::fatal_error: return "fatal_error";
    case WcStatus::retry_exceeded: return "retry_exceeded";
    case WcStatus::rnr_retry_exceeded: return "rnr_retry_exceeded";
  }
  return "unknown";
}

std::string_view to_string(WcOpcode opcode) {
  switch (opcode) {
    case WcOpcode::send: return "send";
    case WcOpcode::rdma_write: return "rdma_write";
    case WcOpcode::rdma_read: return "rdma_read";
    case WcOpcode::recv: return "recv";
    case WcOpcode::recv_rdma_with_imm: return "recv_rdma_with_imm";
  }
  return "unknown";
}

std::string_view to_string(QpState state) {
  switch (state) {
    case QpState::reset: return "reset";
    case QpState::init: return "init";
    case QpState::rtr: return "rtr";
    case QpState::rts: return "rts";
    case QpState::error: return "error";
  }
  return "unknown";
}

}  // namespace peercm
