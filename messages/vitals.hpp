#pragma once
/// Vitals: every actor of a run answers `vitals_atom` with what it has done
/// so far — the control endpoint's actor tree (messages/control.hpp) is made
/// of these answers.
///
///   control                      coordinator               each peer
///     | -- (vitals_all_atom, ms) --> |  -- (vitals_atom) ------> |  counted by
///     |                              |  <----- actor_vitals ---- |  its behaviour
///     | <-- vector<actor_vitals> --- |  its own, then its peers'; a peer that
///     |                                 does not answer within `ms` is listed
///     |                                 with `answered` false (and `down` when
///     |                                 it has ended)
///
/// The counting is done around the behaviour (actors/vitals.hpp): every
/// message an actor handles, of any protocol, counts, including these.
/// A GPU actor answers between its steps; one that does not answer within
/// the deadline is busy or stuck, which the tree then says.

#include <cstdint>
#include <string>
#include <vector>

#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>

namespace tandem {

using vitals_atom = caf::atom_constant<caf::atom("vitals")>;
/// To the coordinator: every actor's vitals.
using vitals_all_atom = caf::atom_constant<caf::atom("vitals_all")>;

/// One figure of an actor's role, by name.
struct vitals_figure {
  std::string name;
  double value = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, vitals_figure& x) {
  return f(caf::meta::type_name("tandem.vitals_figure"), x.name, x.value);
}

/// One actor's vitals.
struct actor_vitals {
  std::string role;            ///< "drafter", "target", "prefetch", "coordinator", ...
  int32_t index = 0;           ///< its index among the actors of its role
  uint64_t actor_id = 0;       ///< CAF's id of this incarnation
  bool answered = false;       ///< false: no answer before the deadline (busy or stuck)
  bool down = false;           ///< not answered because the actor has ended
  bool own_thread = false;     ///< detached (a private thread), else on the scheduler's workers
  int64_t thread = 0;          ///< the OS thread id that handled its last message
  std::string thread_name;     ///< that thread's name, where it has one
  double uptime_s = 0;         ///< since this incarnation's behaviour started
  uint64_t handled = 0;        ///< messages handled, of any kind (this one included)
  std::string last_message;    ///< the last one before this request: its atom, or its type's name
  double last_message_age_s = 0;
  double busiest_ms = 0;       ///< the longest time one message kept it busy
  /// Figures of its role (target: forward_ms_last, forward_ms_mean,
  /// batches, queue_depth; prefetch: epoch, epoch_samples, samples_sent,
  /// samples_per_s, tokens_per_s, padding_waste; ...), in a fixed order.
  std::vector<vitals_figure> figures;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, actor_vitals& x) {
  return f(caf::meta::type_name("tandem.actor_vitals"), x.role, x.index, x.actor_id, x.answered, x.down,
           x.own_thread, x.thread, x.thread_name, x.uptime_s, x.handled, x.last_message,
           x.last_message_age_s, x.busiest_ms, x.figures);
}

/// The request every actor's protocol includes.
using vitals_protocol = caf::replies_to<vitals_atom>::with<actor_vitals>;

} // namespace tandem
