#include <iostream>

#include <rdmaps/status.h>
#include <rdmaps/version.h>

int main() {
  rdmaps::Status s = rdmaps::InvalidArgumentError("probe");
  if (s.ok()) return 1;
  std::cout << "rdmaps " << rdmaps::Version() << "\n";
  return 0;
}
