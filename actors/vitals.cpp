// Counting what an actor does (actors/vitals.hpp).
#include "actors/vitals.hpp"

#include <algorithm>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <caf/atom.hpp>

namespace tandem {

namespace {

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

/// The calling thread's OS id, asked of the kernel once per thread.
int64_t os_thread_id() {
  thread_local const auto id = static_cast<int64_t>(::syscall(SYS_gettid));
  return id;
}

class counting_behavior final : public caf::detail::behavior_impl {
public:
  counting_behavior(std::shared_ptr<vitals_meter> meter, caf::behavior inner)
    : caf::detail::behavior_impl(inner.timeout()), meter_(std::move(meter)), inner_(std::move(inner)) {
    begin_ = end_ = nullptr;
  }

  caf::match_case::result invoke(caf::detail::invoke_result_visitor& f, caf::type_erased_tuple& xs) override {
    meter_->begin(xs);
    struct done {
      vitals_meter& m;
      ~done() { m.end(); }
    } guard{*meter_};
    return inner_.as_behavior_impl()->invoke(f, xs);
  }

  caf::match_case::result invoke_empty(caf::detail::invoke_result_visitor& f) override {
    return inner_.as_behavior_impl()->invoke_empty(f);
  }

  void handle_timeout() override { inner_.handle_timeout(); }

private:
  std::shared_ptr<vitals_meter> meter_;
  caf::behavior inner_;
};

} // namespace

vitals_meter::vitals_meter(caf::actor_system& sys, std::string role, int32_t index, bool own_thread)
  : sys_(&sys), role_(std::move(role)), index_(index), own_thread_(own_thread) {}

void vitals_meter::begin(const caf::type_erased_tuple& msg) {
  ++handled_;
  thread_ = os_thread_id();
  previous_ = std::move(current_);
  previous_at_ = current_at_;
  current_at_ = clock_type::now();
  // An atom names the message ("step", "credit"); otherwise its first
  // element's registered type ("tandem.work_item").
  if (msg.empty())
    current_ = "()";
  else if (msg.type(0).first == caf::type_nr<caf::atom_value>::value)
    current_ = caf::to_string(msg.get_as<caf::atom_value>(0));
  else
    current_ = sys_->types().portable_name(msg.type(0));
}

void vitals_meter::end() {
  busiest_ms_ = std::max(busiest_ms_, ms_since(current_at_));
}

actor_vitals vitals_meter::report(uint64_t actor_id) const {
  actor_vitals v;
  v.role = role_;
  v.index = index_;
  v.actor_id = actor_id;
  v.answered = true;
  v.own_thread = own_thread_;
  v.thread = thread_;
  char name[32] = {0};
  if (pthread_getname_np(pthread_self(), name, sizeof name) == 0)
    v.thread_name = name;
  v.uptime_s = seconds_since(started_);
  v.handled = handled_;
  if (!previous_.empty()) {
    v.last_message = previous_;
    v.last_message_age_s = seconds_since(previous_at_);
  }
  v.busiest_ms = busiest_ms_;
  if (figures)
    v.figures = figures();
  return v;
}

caf::behavior counted(std::shared_ptr<vitals_meter> meter, caf::behavior inner) {
  // As an impl_ptr: the non-template constructor (the template one takes
  // match cases).
  caf::behavior::impl_ptr impl{caf::make_counted<counting_behavior>(std::move(meter), std::move(inner))};
  return caf::behavior{std::move(impl)};
}

} // namespace tandem
