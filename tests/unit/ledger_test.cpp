// The sample ledger against a simulated drafter whose "weights" are the
// multiset of samples trained into them: across random failures and
// rollbacks, the final weights must hold every sample exactly once.
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "actors/ledger.hpp"

using tandem::sample_ledger;

TEST(ledger, plain_epoch_commits_every_sample_once) {
  sample_ledger l(10);
  auto b0 = l.issue({3, 1, 4});
  auto b1 = l.issue({0, 2});
  EXPECT_EQ(l.state_counts().issued, 5);
  l.trained(b0, 0);
  l.trained(b1, 1);
  EXPECT_EQ(l.durable(0), 3);
  EXPECT_TRUE(l.is_committed(4));
  EXPECT_FALSE(l.is_committed(0));
  EXPECT_EQ(l.durable(1), 2);
  EXPECT_FALSE(l.epoch_complete());
  l.trained(l.issue({5, 6, 7, 8, 9}), 2);
  l.durable(2);
  EXPECT_TRUE(l.epoch_complete());
  EXPECT_THROW(l.issue({1}), std::logic_error) << "committed samples cannot be issued again";
  l.next_epoch();
  EXPECT_EQ(l.epoch(), 1);
  EXPECT_EQ(l.state_counts().pending, 10);
}

TEST(ledger, double_issue_and_bad_ids_are_refused) {
  sample_ledger l(4);
  l.issue({0, 1});
  EXPECT_THROW(l.issue({1, 2}), std::logic_error);
  EXPECT_THROW(l.issue({2, 2}), std::logic_error);
  EXPECT_THROW(l.issue({7}), std::out_of_range);
  EXPECT_THROW(l.trained(99, 0), std::logic_error);
  EXPECT_THROW(l.next_epoch(), std::logic_error);
}

TEST(ledger, rollback_returns_in_flight_and_unsafe_samples_first_in_line) {
  sample_ledger l(8);
  auto a = l.issue({0, 1});
  auto b = l.issue({2, 3});
  auto c = l.issue({4, 5});
  l.trained(a, 0);
  l.trained(b, 1);
  l.durable(0);  // a is safe; b trained but not safe; c in flight
  auto back = l.rollback(0);
  EXPECT_EQ(back, (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_TRUE(l.is_committed(0));
  EXPECT_EQ(l.state_counts().pending, 6);
  EXPECT_EQ(l.take_reissue(3), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(l.take_reissue(10), (std::vector<int64_t>{5}));
}

TEST(ledger, save_and_restore_keep_only_committed_samples) {
  sample_ledger l(100);
  std::vector<int64_t> first, second;
  for (int64_t i = 0; i < 50; ++i)
    (i % 3 ? first : second).push_back(i);
  l.trained(l.issue(first), 0);
  l.durable(0);
  l.issue(second);  // in flight: not saved
  auto r = sample_ledger::restore(l.save());
  EXPECT_EQ(r.state_counts().committed, static_cast<int64_t>(first.size()));
  EXPECT_EQ(r.state_counts().pending, 100 - static_cast<int64_t>(first.size()));
  for (auto s : first)
    EXPECT_TRUE(r.is_committed(s));
  for (auto s : second)
    EXPECT_FALSE(r.is_committed(s));
  EXPECT_THROW(sample_ledger::restore(R"({"format":"other"})"), std::invalid_argument);
}

TEST(ledger, save_as_of_a_step_commits_what_those_weights_include) {
  sample_ledger l(6);
  l.trained(l.issue({0, 1}), 1);
  l.trained(l.issue({2, 3}), 2);
  l.issue({4});
  auto r = sample_ledger::restore(l.save(1));
  EXPECT_TRUE(r.is_committed(0));
  EXPECT_TRUE(r.is_committed(1));
  EXPECT_FALSE(r.is_committed(2)) << "trained after the checkpoint's step";
  EXPECT_FALSE(r.is_committed(4)) << "in flight";
  EXPECT_EQ(l.state_counts().committed, 0) << "save does not change the ledger";
}

TEST(ledger, random_failures_never_lose_or_duplicate_a_sample) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    std::mt19937 rng(seed);
    const int64_t n = 1 + static_cast<int64_t>(rng() % 200);
    sample_ledger l(n);
    std::vector<int64_t> fresh(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      fresh[static_cast<size_t>(i)] = i;
    std::shuffle(fresh.begin(), fresh.end(), rng);
    size_t next_fresh = 0;

    // The drafter's weights: for each step, the samples it trained; a
    // snapshot is the weights at a step.  Restoring drops later steps.
    std::map<int64_t, std::vector<int64_t>> weights;  // step → samples
    std::vector<std::pair<sample_ledger::batch_id, std::vector<int64_t>>> in_flight;
    int64_t step = -1, durable_step = -1;
    int guard = 0;
    while (!l.epoch_complete() && ++guard < 100000) {
      const auto r = rng() % 100;
      if (r < 40) {  // issue a batch: re-issues first, then fresh samples
        const size_t size = 1 + rng() % 8;
        auto batch = l.take_reissue(size);
        while (batch.size() < size && next_fresh < fresh.size())
          batch.push_back(fresh[next_fresh++]);
        if (!batch.empty())
          in_flight.emplace_back(l.issue(batch), batch);
      } else if (r < 75) {  // train the oldest batch in flight
        if (!in_flight.empty()) {
          ++step;
          l.trained(in_flight.front().first, step);
          weights[step] = in_flight.front().second;
          in_flight.erase(in_flight.begin());
        }
      } else if (r < 92) {  // a snapshot of the current weights
        durable_step = step;
        l.durable(step);
      } else {  // a drafter failure: restore the newest snapshot
        l.rollback(durable_step);
        weights.erase(weights.upper_bound(durable_step), weights.end());
        step = durable_step;
        in_flight.clear();
      }
      if (next_fresh == fresh.size() && in_flight.empty() && l.state_counts().pending == 0
          && l.state_counts().trained > 0) {
        durable_step = step;
        l.durable(step);
      }
    }
    ASSERT_TRUE(l.epoch_complete()) << "seed " << seed;
    std::vector<int> times(static_cast<size_t>(n), 0);
    for (auto& [s, samples] : weights)
      for (auto x : samples)
        ++times[static_cast<size_t>(x)];
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(times[static_cast<size_t>(i)], 1) << "sample " << i << ", seed " << seed;
  }
}
