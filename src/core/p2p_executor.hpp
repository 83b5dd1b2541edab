// The one executor of the p2p resolver's decisions (docs/p2p.md, Rules). Every transport's CM
// agent drains its resolver through it and carries out each P2pAction through P2pBinding: what
// an action means on the wire is the transport's (an MPA Reject over iWARP, a silent drop of
// the REQ over the IB CM: rule 3's last sentence); when and in which order actions run is not.
#pragma once

#include "core/p2p_resolver.hpp"
#include "core/time.hpp"

namespace peercm::core {

// How one transport carries out each P2pAction (see P2pAction::Kind for what each means).
class P2pBinding {
 public:
  virtual ~P2pBinding() = default;
  virtual void deliver_request(const P2pAction& action, Time now) = 0;      // rule 4
  virtual void reject_request(const P2pAction& action, Time now) = 0;       // rules 3, 6
  virtual void accept_into_attempt(const P2pAction& action, Time now) = 0;  // rule 3, passive peer
  virtual void teardown_link(const P2pAction& action, Time now) = 0;        // rule 6
  virtual void attempt_failed(const P2pAction& action, Time now) = 0;       // rule 8
  // R5b: only a transport whose connect() passes the resolver a CheckLink gets these.
  virtual void dial_attempt(const P2pAction& action, Time now) = 0;
  virtual void attempt_already_connected(const P2pAction& action, Time now) = 0;
};

class P2pExecutor {
 public:
  // Carries out every pending action of `resolver`, in order, through `binding`. A binding that
  // feeds the resolver again (a link it closes, an attempt it ends) queues more actions: a call
  // made from inside an action returns at once and the outer loop takes them.
  void run(P2pResolver& resolver, P2pBinding& binding, Time now) {
    if (running_) return;
    running_ = true;
    while (auto action = resolver.poll_action()) {
      switch (action->kind) {
        case P2pAction::Kind::deliver_request: binding.deliver_request(*action, now); break;
        case P2pAction::Kind::reject_request: binding.reject_request(*action, now); break;
        case P2pAction::Kind::accept_into_attempt: binding.accept_into_attempt(*action, now); break;
        case P2pAction::Kind::teardown_link: binding.teardown_link(*action, now); break;
        case P2pAction::Kind::attempt_failed: binding.attempt_failed(*action, now); break;
        case P2pAction::Kind::dial_attempt: binding.dial_attempt(*action, now); break;
        case P2pAction::Kind::attempt_already_connected: binding.attempt_already_connected(*action, now); break;
      }
    }
    running_ = false;
  }

 private:
  bool running_ = false;
};

}  // namespace peercm::core
