// A program outside the peercm tree, built against an installed peercm.
#include <peercm/verbs_types.hpp>
#include <peercm/version.hpp>

#include <iostream>

int main() {
  std::cout << "peercm " << peercm::version() << " " << peercm::to_string(peercm::WcStatus::success) << "\n";
  return peercm::version().empty() ? 1 : 0;
}
