#include "peercm/version.hpp"

namespace peercm {

std::string_view version() { return PEERCM_VERSION_STRING; }

}  // namespace peercm
