#pragma once
/// Control protocol (config [control]): the control endpoint's actor.  The
/// HTTP server (actors/control_http.hpp) runs on its own I/O thread and
/// reaches the run only through this actor; the actor reaches the rest only
/// by messages.
///
///   I/O thread           control                        coordinator      metrics
///     | -- control_request --> |                              |              |
///     |                        | -- status_atom ------------> |              |  reads
///     |                        | <------------ JSON status -- |              |
///     |                        | -- vitals_all_atom --------> |  asks every  |  the tree,
///     |                        | <---- vector<actor_vitals> - |  actor       |  the ledger
///     |                        |                              |  (messages/vitals.hpp)
///     |                        | -- control_command --------> |              |  acts
///     |                        | <--------------- result ---- |  (+ a control_event line)
///     | <---- control_reply -- |                              |              |
///     |                        | <------------- step_report, run_event ----- |  every one,
///     |                        |                              |              |  as they come
///     | -- unauthorized -----> |  a request without the token (counted)
///     |      (shutdown) -----> |  quits; the server stops and control.json goes
///
/// A request is answered within control_options::answer_timeout: a reply
/// the coordinator owes later than that (it is mid-message) becomes a 503.
/// (The I/O thread's control_request comes from a one-shot actor per
/// request, so the thread itself never waits.)

#include <cstdint>
#include <string>

#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/coordinator.hpp"
#include "messages/descriptors.hpp"
#include "messages/metrics.hpp"
#include "messages/vitals.hpp"

namespace tandem {

using unauthorized_atom = caf::atom_constant<caf::atom("unauth")>;

/// One HTTP request, parsed by the I/O thread: `method` "GET" or "POST",
/// `target` the path with its query ("/v1/steps?n=20"), `body` (JSON or
/// empty), `source` the client's address and user agent.
struct control_request {
  std::string method;
  std::string target;
  std::string body;
  std::string source;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, control_request& x) {
  return f(caf::meta::type_name("tandem.control_request"), x.method, x.target, x.body, x.source);
}

/// The answer: an HTTP status and a body, JSON unless `content_type` says
/// otherwise (GET /metrics: Prometheus text); errors: {"error": "..."}.
struct control_reply {
  int32_t status = 200;
  std::string body;
  std::string content_type = "application/json";
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, control_reply& x) {
  return f(caf::meta::type_name("tandem.control_reply"), x.status, x.body, x.content_type);
}

using control_actor = caf::typed_actor<
  caf::replies_to<control_request>::with<control_reply>,
  caf::reacts_to<step_report>,
  caf::reacts_to<run_event>,
  caf::reacts_to<unauthorized_atom, std::string>,  ///< I/O thread: a refused request (from whom)
  caf::reacts_to<shutdown_atom>,
  vitals_protocol>;

} // namespace tandem
