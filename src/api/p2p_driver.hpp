// Runs a context's p2p resolver (design.md §3): feeds it the CM's inputs and carries out
// the actions it decides, on real connections and CmIds. All under the context lock.
#pragma once

#include <map>
#include <memory>
#include <optional>

#include "core/p2p_resolver.hpp"
#include "engine/reactor.hpp"
#include "peercm/cm.hpp"

namespace peercm::detail {

struct ContextImpl;
struct CmIdImpl;
class Connection;

class P2pDriver {
 public:
  explicit P2pDriver(ContextImpl& ctx);

  core::P2pResolver& resolver() { return resolver_; }
  core::LinkId new_link() { return ++last_link_; }

  // Bookkeeping the actions need.
  void own_link(core::LinkId link, const std::shared_ptr<CmIdImpl>& id) { link_owners_[link] = id; }
  void track_attempt(core::AttemptId attempt, const std::shared_ptr<CmIdImpl>& id) { attempts_[attempt] = id; }
  void forget_attempt(core::AttemptId attempt) { attempts_.erase(attempt); }
  // A request connection waiting for the resolver's verdict, with the listener it came to.
  void park_request(core::LinkId link, std::shared_ptr<Connection> conn, std::shared_ptr<CmIdImpl> listener,
                    core::NodeIdentity peer, core::AttemptId peer_cmid);
  // Rule 5 refined (docs/p2p.md): a CONNECT_REQUEST for `key` that is still queued, unseen
  // by the application, is taken back so that a connect() for the same key can compete with
  // it as a colliding request. Returns the re-parked request's link (0: none to reclaim);
  // the retracted event goes to `retracted` (destroy it without the context lock).
  struct Reclaimed {
    core::LinkId link = 0;
    core::NodeIdentity peer;
    core::AttemptId peer_cmid = 0;
  };
  Reclaimed reclaim_unseen_request(const core::P2pKey& key, std::optional<CmEvent>& retracted);
  // Called by a link's `closed` callback.
  void link_closed(core::LinkId link);

  // Carries out every pending action, then re-arms the deadline timer. Reentrant calls
  // (from callbacks of the actions themselves) return at once; the outer loop goes on.
  void run();

 private:
  struct ParkedRequest {
    std::shared_ptr<Connection> connection;
    std::weak_ptr<CmIdImpl> listener;
    core::NodeIdentity peer;
    core::AttemptId peer_cmid = 0;
  };

  void execute(const core::P2pAction& action);
  void deliver_request(const core::P2pAction& action);
  void reject_request(const core::P2pAction& action);
  void accept_into_attempt(const core::P2pAction& action);
  void teardown_link(const core::P2pAction& action);
  void attempt_failed(const core::P2pAction& action);
  void arm_timer();
  // The CmId of a request delivered to the application and not yet taken (accepted or
  // rejected) on `link`; null otherwise.
  std::shared_ptr<CmIdImpl> unseen_request_owner(core::LinkId link) const;
  void remember_delivered(const core::P2pKey& key, core::LinkId link);

  ContextImpl& ctx_;
  core::P2pResolver resolver_;
  core::LinkId last_link_ = 0;
  std::map<core::LinkId, std::weak_ptr<CmIdImpl>> link_owners_;
  std::map<core::AttemptId, std::weak_ptr<CmIdImpl>> attempts_;
  std::map<core::LinkId, ParkedRequest> parked_;
  // Requests delivered to the application (rule 4), by key: what reclaim_unseen_request()
  // looks through instead of every link. May hold stale links; they are checked and dropped.
  std::multimap<core::P2pKey, core::LinkId> delivered_;
  std::optional<engine::Reactor::TimerId> timer_;
  std::optional<core::Time> timer_deadline_;
  bool running_ = false;
};

}  // namespace peercm::detail
