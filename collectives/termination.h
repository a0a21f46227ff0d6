// What a rank says when the launcher ends it. See Note [Termination by the launcher].
#pragma once

#include <string>

namespace loom::comm {

// Installs the SIGTERM report (once; only if SIGTERM still has its default action, so a
// program's own handler is never replaced). Called when the MPI world is created.
void install_termination_report();

// Marks this thread as waiting in the operation `context` describes, for its lifetime.
class WaitingScope {
 public:
  explicit WaitingScope(const std::string& context);
  ~WaitingScope();
  WaitingScope(const WaitingScope&) = delete;
  WaitingScope& operator=(const WaitingScope&) = delete;
};

}  // namespace loom::comm
