#include "actors/group_step.hpp"

#include <algorithm>
#include <stdexcept>

namespace tandem {

const char* to_string(group_step::phase p) {
  switch (p) {
    case group_step::phase::none: return "none";
    case group_step::phase::forming: return "forming";
    case group_step::phase::ready: return "ready";
    case group_step::phase::stepping: return "stepping";
    case group_step::phase::failing: return "failing";
  }
  return "?";
}

group_step::group_step(int32_t world) : world_(world) {
  if (world < 1)
    throw std::invalid_argument("group_step: a group needs at least one rank");
}

void group_step::require(phase p, const char* what) const {
  if (phase_ != p)
    throw std::logic_error(std::string("group_step: ") + what + " while " + to_string(phase_)
                           + " (needs " + to_string(p) + ")");
}

int64_t group_step::begin_forming() {
  require(phase::none, "begin_forming");
  phase_ = phase::forming;
  up_ = 0;
  joined_ = 0;
  return ++generation_;
}

bool group_step::member_up(int64_t gen) {
  if (!forming(gen))
    return false;
  return ++up_ == world_;
}

bool group_step::set_id(int64_t gen, std::vector<uint8_t> id) {
  if (!forming(gen))
    return false;
  nccl_id_ = std::move(id);
  return true;
}

bool group_step::member_joined(int64_t gen) {
  if (!forming(gen) || ++joined_ < world_)
    return false;
  phase_ = phase::ready;
  return true;
}

bool group_step::join_failed(int64_t gen) {
  if (!forming(gen))
    return false;
  phase_ = phase::none;
  return true;
}

void group_step::dispatch(std::vector<int64_t> batches) {
  require(phase::ready, "dispatch");
  if (batches.empty() || batches.size() > static_cast<size_t>(world_))
    throw std::logic_error("group_step: a group step takes 1 to N real batches");
  phase_ = phase::stepping;
  reports_due_ = world_;
  reports_.clear();
  failed_.clear();
  batches_ = std::move(batches);
}

bool group_step::collective_failed() const {
  return std::any_of(reports_.begin(), reports_.end(),
                     [](const rank_report& r) { return r.group_failed; });
}

group_step::report_kind group_step::report(const rank_report& r) {
  if (!in_step())
    return report_kind::stale;
  reports_.push_back(r);
  if (--reports_due_ > 0)
    return report_kind::wait;
  return phase_ == phase::failing ? report_kind::resolve : report_kind::complete;
}

bool group_step::rank_failed(int32_t d, std::string why) {
  if (!in_step())
    throw std::logic_error("group_step: rank_failed with no step in flight ("
                           + std::string(to_string(phase_)) + ")");
  phase_ = phase::failing;
  failed_.emplace_back(d, std::move(why));
  auto it = std::find_if(reports_.begin(), reports_.end(),
                         [d](const rank_report& r) { return r.drafter == d; });
  if (it == reports_.end())
    --reports_due_;  // its report will not come
  else
    reports_.erase(it);  // it reported, then died: its state is gone with it
  return reports_due_ == 0;
}

group_step::verdict group_step::finish_step(int64_t before) {
  require(phase::stepping, "finish_step");
  if (reports_due_ != 0)
    throw std::logic_error("group_step: finish_step with reports due");
  phase_ = phase::ready;
  verdict v;
  v.reports = std::move(reports_);
  reports_.clear();
  const auto& rs = v.reports;
  using kind = verdict::kind;
  for (const auto& x : rs)
    if (x.group_failed) {
      v.what = kind::collective_failed;
      v.drafter = x.drafter;
      v.step = before + 1;
      return v;
    }
  for (const auto& x : rs)
    if (!x.finite) {
      // Every rank skipped the update (the averaged gradient is not
      // finite); the one whose own loss is not finite is the failure.
      v.what = kind::not_finite;
      v.drafter = x.drafter;
      for (const auto& y : rs)
        if (!y.loss_finite) {
          v.drafter = y.drafter;
          break;
        }
      v.all_skipped = std::all_of(rs.begin(), rs.end(), [](const rank_report& y) { return !y.finite; });
      v.step = before + 1;
      return v;
    }
  v.step = rs.front().step;
  v.first_drafter = rs.front().drafter;
  for (const auto& x : rs)
    if (x.step != v.step) {
      v.what = kind::disagree;
      v.drafter = x.drafter;
      v.other_step = x.step;
      return v;
    }
  v.what = kind::trained;
  return v;
}

group_step::resolution group_step::resolve(int64_t before) {
  require(phase::failing, "resolve");
  if (reports_due_ != 0)
    throw std::logic_error("group_step: resolve with survivors' reports due");
  phase_ = phase::ready;
  resolution res;
  res.failed = std::move(failed_);
  failed_.clear();
  res.reports = std::move(reports_);
  reports_.clear();
  const int64_t after = before + 1;
  res.known = !res.reports.empty();
  bool any_after = false;
  for (const auto& r : res.reports) {
    res.known &= r.step == before || r.step == after;
    any_after |= r.step == after;
  }
  res.step_trained = res.known && any_after;
  res.step = res.step_trained ? after : before;
  if (res.step_trained)
    for (const auto& r : res.reports)
      if (r.step == after && r.finite)
        res.completed.push_back(r.drafter);
  return res;
}

std::vector<int64_t> group_step::take_batches() {
  auto out = std::move(batches_);
  batches_.clear();
  return out;
}

std::vector<uint8_t> group_step::take_id() {
  auto out = std::move(nccl_id_);
  nccl_id_.clear();
  return out;
}

void group_step::dissolve() {
  phase_ = phase::none;
  reports_due_ = 0;
  reports_.clear();
  batches_.clear();
  failed_.clear();
}

} // namespace tandem
