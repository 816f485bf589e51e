// Must NOT compile under clang -Wthread-safety -Werror: reads a guarded member
// without its mutex. tests/build/CMakeLists.txt checks that it is refused.
#include "src/base/mutex.h"

class Counter {
 public:
  int Get() const { return n_; }  // mu_ not held: the analysis must refuse this.

 private:
  mutable rdmaps::Mutex mu_;
  int n_ RDMAPS_GUARDED_BY(mu_) = 0;
};

int main() { return Counter().Get(); }
