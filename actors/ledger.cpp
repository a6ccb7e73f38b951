#include "actors/ledger.hpp"

#include <algorithm>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace tandem {

sample_ledger::sample_ledger(int64_t num_samples)
  : num_samples_(num_samples), state_(static_cast<size_t>(num_samples), state::pending) {
  if (num_samples < 0)
    throw std::invalid_argument("sample_ledger: negative sample count");
  counts_.pending = num_samples;
}

void sample_ledger::check_sample(int64_t sample) const {
  if (sample < 0 || sample >= num_samples_)
    throw std::out_of_range("sample_ledger: sample " + std::to_string(sample) + " outside 0.."
                            + std::to_string(num_samples_ - 1));
}

void sample_ledger::set(int64_t sample, state s) {
  auto& cur = state_[static_cast<size_t>(sample)];
  auto bump = [this](state x, int64_t d) {
    switch (x) {
      case state::pending: counts_.pending += d; break;
      case state::issued: counts_.issued += d; break;
      case state::trained: counts_.trained += d; break;
      case state::committed: counts_.committed += d; break;
    }
  };
  bump(cur, -1);
  bump(s, +1);
  cur = s;
}

bool sample_ledger::is_committed(int64_t sample) const {
  check_sample(sample);
  return state_[static_cast<size_t>(sample)] == state::committed;
}

sample_ledger::batch_id sample_ledger::issue(const std::vector<int64_t>& samples) {
  for (auto s : samples) {
    check_sample(s);
    if (state_[static_cast<size_t>(s)] != state::pending)
      throw std::logic_error("sample_ledger: sample " + std::to_string(s)
                             + " issued twice in epoch " + std::to_string(epoch_));
  }
  std::vector<int64_t> sorted(samples);
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw std::logic_error("sample_ledger: a batch names the same sample twice");
  for (auto s : samples)
    set(s, state::issued);
  // A re-issued sample leaves the re-issue queue wherever it stood.
  if (!reissue_.empty())
    reissue_.erase(std::remove_if(reissue_.begin(), reissue_.end(),
                                  [this](int64_t s) { return state_[static_cast<size_t>(s)] != state::pending; }),
                   reissue_.end());
  const auto id = next_batch_++;
  batches_[id] = batch{samples, -1};
  return id;
}

void sample_ledger::trained(batch_id id, int64_t step) {
  auto it = batches_.find(id);
  if (it == batches_.end())
    throw std::logic_error("sample_ledger: batch " + std::to_string(id) + " is not in flight");
  if (it->second.step >= 0)
    throw std::logic_error("sample_ledger: batch " + std::to_string(id) + " trained twice");
  if (step < last_trained_step_)
    throw std::logic_error("sample_ledger: step " + std::to_string(step) + " after step "
                           + std::to_string(last_trained_step_));
  last_trained_step_ = step;
  it->second.step = step;
  for (auto s : it->second.samples)
    set(s, state::trained);
}

int64_t sample_ledger::durable(int64_t step) {
  int64_t committed = 0;
  for (auto it = batches_.begin(); it != batches_.end();) {
    if (it->second.step >= 0 && it->second.step <= step) {
      for (auto s : it->second.samples)
        set(s, state::committed);
      committed += static_cast<int64_t>(it->second.samples.size());
      it = batches_.erase(it);
    } else {
      ++it;
    }
  }
  return committed;
}

std::vector<int64_t> sample_ledger::rollback(int64_t restore_step) {
  std::vector<int64_t> back;
  // Batches keep their issue order (ids increase), so re-issue order is
  // first-issued first.
  for (auto it = batches_.begin(); it != batches_.end();) {
    if (it->second.step < 0 || it->second.step > restore_step) {
      for (auto s : it->second.samples) {
        set(s, state::pending);
        back.push_back(s);
      }
      it = batches_.erase(it);
    } else {
      ++it;
    }
  }
  last_trained_step_ = std::min(last_trained_step_, restore_step);
  reissue_.insert(reissue_.begin(), back.begin(), back.end());
  return back;
}

std::vector<int64_t> sample_ledger::take_reissue(size_t max) {
  std::vector<int64_t> out;
  while (!reissue_.empty() && out.size() < max) {
    out.push_back(reissue_.front());
    reissue_.pop_front();
  }
  return out;
}

void sample_ledger::next_epoch() {
  if (!epoch_complete())
    throw std::logic_error("sample_ledger: epoch " + std::to_string(epoch_) + " not complete ("
                           + std::to_string(counts_.committed) + " of "
                           + std::to_string(num_samples_) + " committed)");
  std::fill(state_.begin(), state_.end(), state::pending);
  counts_ = counts{};
  counts_.pending = num_samples_;
  ++epoch_;
}

std::vector<int64_t> sample_ledger::consumed() const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < num_samples_; ++i)
    if (state_[static_cast<size_t>(i)] != state::pending)
      out.push_back(i);
  return out;
}

std::string sample_ledger::save() const {
  return save(-1);
}

std::string sample_ledger::save(int64_t durable_through) const {
  std::vector<bool> extra(static_cast<size_t>(num_samples_), false);
  for (const auto& [id, b] : batches_)
    if (b.step >= 0 && b.step <= durable_through)
      for (auto s : b.samples)
        extra[static_cast<size_t>(s)] = true;
  // Committed samples as sorted [first, last] runs: compact for the usual
  // case (a shuffled epoch half done is still ~N/2 runs at worst).
  nlohmann::json runs = nlohmann::json::array();
  int64_t start = -1;
  for (int64_t i = 0; i <= num_samples_; ++i) {
    const bool c = i < num_samples_ && (state_[static_cast<size_t>(i)] == state::committed
                                        || extra[static_cast<size_t>(i)]);
    if (c && start < 0)
      start = i;
    if (!c && start >= 0) {
      runs.push_back({start, i - 1});
      start = -1;
    }
  }
  return nlohmann::json{{"format", "tandem.ledger.v1"},
                        {"num_samples", num_samples_},
                        {"epoch", epoch_},
                        {"committed", runs}}
    .dump();
}

sample_ledger sample_ledger::restore(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  if (j.value("format", "") != "tandem.ledger.v1")
    throw std::invalid_argument("ledger state: format is not tandem.ledger.v1");
  sample_ledger l(j.at("num_samples").get<int64_t>());
  l.epoch_ = j.at("epoch").get<int64_t>();
  for (const auto& r : j.at("committed")) {
    const auto a = r.at(0).get<int64_t>(), b = r.at(1).get<int64_t>();
    for (int64_t i = a; i <= b; ++i) {
      l.check_sample(i);
      l.set(i, state::committed);
    }
  }
  return l;
}

} // namespace tandem
