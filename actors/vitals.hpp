#pragma once
/// Counting what an actor does (messages/vitals.hpp).  CAF's actor profiler
/// is compiled out of Debian's CAF, so each actor wraps its behaviour:
///
///   auto meter = std::make_shared<vitals_meter>(self->system(), "target", index, true);
///   return counted(meter, behavior_type{ ..., vitals_handler(self, meter) });
///
/// `counted` puts a thin behaviour around the actor's own: every message it
/// handles (of any protocol, and those its default handler refuses) is
/// counted with its name and how long it kept the actor busy.  Replies to
/// the actor's own requests go to their response handlers and are not
/// counted.  The meter lives as long as the actor's behaviour and is only
/// touched on the actor's thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/behavior.hpp>
#include <caf/detail/behavior_impl.hpp>
#include <caf/make_counted.hpp>
#include <caf/type_erased_tuple.hpp>
#include <caf/typed_behavior.hpp>

#include "actors/time.hpp"
#include "messages/vitals.hpp"

namespace tandem {

class vitals_meter {
public:
  /// `own_thread`: the actor is spawned detached.
  vitals_meter(caf::actor_system& sys, std::string role, int32_t index, bool own_thread);

  /// The role's figures, asked at each report (on the actor's thread).
  std::function<std::vector<vitals_figure>()> figures;

  /// Around each message.
  void begin(const caf::type_erased_tuple& msg);
  void end();

  /// What the meter saw, for the actor with CAF id `actor_id`.
  actor_vitals report(uint64_t actor_id) const;

private:
  caf::actor_system* sys_;
  std::string role_;
  int32_t index_;
  bool own_thread_;
  clock_type::time_point started_ = clock_type::now();
  uint64_t handled_ = 0;
  // The message being handled and the one before it (a vitals request asks
  // about the actor, not about itself).
  std::string current_, previous_;
  clock_type::time_point current_at_{}, previous_at_{};
  double busiest_ms_ = 0;
  int64_t thread_ = 0;
};

/// A behaviour that counts every message into `meter`, then hands it to `inner`.
caf::behavior counted(std::shared_ptr<vitals_meter> meter, caf::behavior inner);

template <class... Sigs>
caf::typed_behavior<Sigs...> counted(std::shared_ptr<vitals_meter> meter, caf::typed_behavior<Sigs...> inner) {
  // The inner behaviour was checked against the protocol when it was built;
  // the wrapper handles exactly what it handles.
  return {typename caf::typed_behavior<Sigs...>::unsafe_init{}, counted(std::move(meter), inner.unbox())};
}

/// The `vitals_atom` handler every actor's behaviour lists.
template <class Self>
auto vitals_handler(Self* self, std::shared_ptr<vitals_meter> meter) {
  return [self, meter](vitals_atom) { return meter->report(self->id()); };
}

} // namespace tandem
