#pragma once

#include <string_view>

namespace peercm {

// The library's version, "MAJOR.MINOR.PATCH".
std::string_view version();

}  // namespace peercm
