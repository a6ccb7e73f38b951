// The data-parallel group step (actors/group_step.hpp): its transitions one
// by one, then against a simulated group whose ranks fail at random inside
// steps, where every resolved step must continue from a state a survivor
// really holds, count a step only when a survivor applied it, and count it
// once.
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "actors/group_step.hpp"

using tandem::group_step;
using tandem::rank_report;
using phase = group_step::phase;
using kind = group_step::report_kind;
using verdict_kind = group_step::verdict::kind;

namespace {

rank_report at(int32_t d, int64_t step) {
  rank_report r;
  r.drafter = d;
  r.step = step;
  return r;
}

/// A group of `world` formed through generation 1.
group_step formed(int32_t world) {
  group_step g(world);
  const auto gen = g.begin_forming();
  for (int32_t d = 0; d < world; ++d)
    g.member_up(gen);
  g.set_id(gen, {1, 2, 3});
  for (int32_t d = 0; d < world; ++d)
    g.member_joined(gen);
  return g;
}

} // namespace

TEST(group_step, forming_needs_every_drafter_up_then_every_join) {
  group_step g(3);
  EXPECT_EQ(g.current(), phase::none);
  const auto gen = g.begin_forming();
  EXPECT_EQ(gen, 1);
  EXPECT_TRUE(g.forming(gen));
  EXPECT_FALSE(g.member_up(gen));
  EXPECT_FALSE(g.member_up(gen));
  EXPECT_TRUE(g.member_up(gen)) << "the third answer: ask rank 0 for the id";
  EXPECT_TRUE(g.set_id(gen, {7}));
  EXPECT_EQ(g.nccl_id(), (std::vector<uint8_t>{7}));
  EXPECT_FALSE(g.member_joined(gen));
  EXPECT_FALSE(g.member_joined(gen));
  EXPECT_EQ(g.current(), phase::forming);
  EXPECT_TRUE(g.member_joined(gen));
  EXPECT_EQ(g.current(), phase::ready);
  EXPECT_FALSE(g.member_joined(gen)) << "a group is formed once";
  EXPECT_THROW(g.begin_forming(), std::logic_error);
}

TEST(group_step, only_the_first_failure_of_a_generation_counts_and_stale_replies_never_act) {
  group_step g(2);
  const auto gen = g.begin_forming();
  g.member_up(gen);
  EXPECT_TRUE(g.join_failed(gen));
  EXPECT_EQ(g.current(), phase::none);
  EXPECT_FALSE(g.join_failed(gen)) << "the others' timeouts are its consequences";
  const auto next = g.begin_forming();
  EXPECT_EQ(next, gen + 1);
  EXPECT_FALSE(g.member_up(gen)) << "generation 1's late heartbeat";
  EXPECT_FALSE(g.set_id(gen, {9}));
  EXPECT_TRUE(g.nccl_id().empty());
  EXPECT_FALSE(g.member_joined(gen));
  EXPECT_FALSE(g.join_failed(gen));
  EXPECT_EQ(g.current(), phase::forming);
  EXPECT_FALSE(g.member_up(next)) << "generation 1's answer did not count for 2";
  EXPECT_TRUE(g.member_up(next));
}

TEST(group_step, a_step_completes_when_every_rank_reported_at_one_step) {
  auto g = formed(3);
  EXPECT_THROW(g.finish_step(4), std::logic_error);
  g.dispatch({10, 11});  // the epoch's tail: two real batches, three ranks
  EXPECT_EQ(g.current(), phase::stepping);
  EXPECT_TRUE(g.in_step());
  EXPECT_THROW(g.dispatch({12}), std::logic_error) << "one step at a time";
  EXPECT_EQ(g.report(at(1, 5)), kind::wait);
  EXPECT_EQ(g.report(at(0, 5)), kind::wait);
  EXPECT_EQ(g.reports_due(), 1);
  EXPECT_EQ(g.report(at(2, 5)), kind::complete);
  const auto v = g.finish_step(4);
  EXPECT_EQ(v.what, verdict_kind::trained);
  EXPECT_EQ(v.step, 5);
  ASSERT_EQ(v.reports.size(), 3u);
  EXPECT_EQ(v.reports[0].drafter, 1) << "arrival order";
  EXPECT_EQ(g.current(), phase::ready);
  EXPECT_EQ(g.take_batches(), (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(g.report(at(0, 5)), kind::stale) << "no step in flight";
}

TEST(group_step, a_finished_step_names_its_failure_in_order) {
  {
    auto g = formed(2);
    g.dispatch({1, 2});
    auto a = at(0, 3), b = at(1, 3);
    b.group_failed = true;
    a.finite = b.finite = false;
    g.report(a);
    g.report(b);
    const auto v = g.finish_step(3);
    EXPECT_EQ(v.what, verdict_kind::collective_failed) << "before a non-finite gradient";
    EXPECT_EQ(v.drafter, 1);
  }
  {
    auto g = formed(3);
    g.dispatch({1, 2, 3});
    auto a = at(0, 3), b = at(1, 3), c = at(2, 3);
    a.finite = b.finite = c.finite = false;
    c.loss_finite = false;
    g.report(a);
    g.report(b);
    g.report(c);
    const auto v = g.finish_step(3);
    EXPECT_EQ(v.what, verdict_kind::not_finite);
    EXPECT_EQ(v.drafter, 2) << "the rank whose own loss is not finite";
    EXPECT_TRUE(v.all_skipped);
  }
  {
    auto g = formed(2);
    g.dispatch({1, 2});
    auto a = at(0, 4), b = at(1, 4);
    b.finite = false;
    g.report(a);
    g.report(b);
    const auto v = g.finish_step(3);
    EXPECT_EQ(v.what, verdict_kind::not_finite);
    EXPECT_EQ(v.drafter, 1) << "no loss is non-finite: the first report that skipped";
    EXPECT_FALSE(v.all_skipped);
  }
  {
    auto g = formed(2);
    g.dispatch({1, 2});
    g.report(at(0, 4));
    g.report(at(1, 7));
    const auto v = g.finish_step(3);
    EXPECT_EQ(v.what, verdict_kind::disagree);
    EXPECT_EQ(v.first_drafter, 0);
    EXPECT_EQ(v.step, 4);
    EXPECT_EQ(v.drafter, 1);
    EXPECT_EQ(v.other_step, 7);
  }
}

TEST(group_step, a_rank_failing_inside_a_step_waits_for_the_survivors) {
  auto g = formed(3);
  g.dispatch({1, 2, 3});
  EXPECT_EQ(g.report(at(0, 6)), kind::wait);
  EXPECT_FALSE(g.rank_failed(2, "drafter 2 died"));
  EXPECT_EQ(g.current(), phase::failing);
  EXPECT_EQ(g.reports_due(), 1);
  EXPECT_EQ(g.report(at(1, 5)), kind::resolve);
  const auto r = g.resolve(5);
  EXPECT_EQ(g.current(), phase::ready);
  EXPECT_TRUE(r.known);
  EXPECT_TRUE(r.step_trained) << "drafter 0 applied the whole step";
  EXPECT_EQ(r.step, 6);
  EXPECT_EQ(r.completed, (std::vector<int32_t>{0}));
  ASSERT_EQ(r.failed.size(), 1u);
  EXPECT_EQ(r.failed[0].first, 2);
  EXPECT_EQ(r.failed[0].second, "drafter 2 died");
  EXPECT_TRUE(r.holds_state(r.reports[0]));
  EXPECT_FALSE(r.holds_state(r.reports[1])) << "drafter 1 skipped the update";
}

TEST(group_step, a_rank_that_reported_then_died_takes_its_report_along) {
  auto g = formed(2);
  g.dispatch({1, 2});
  EXPECT_EQ(g.report(at(0, 6)), kind::wait);
  EXPECT_FALSE(g.rank_failed(0, "gone")) << "drafter 1 still due";
  EXPECT_EQ(g.report(at(1, 5)), kind::resolve);
  const auto r = g.resolve(5);
  EXPECT_TRUE(r.known);
  EXPECT_FALSE(r.step_trained) << "the one state at step 6 died with drafter 0";
  EXPECT_EQ(r.step, 5);
  EXPECT_TRUE(r.completed.empty());
}

TEST(group_step, survivors_anywhere_else_or_none_send_everyone_to_the_checkpoint) {
  {
    auto g = formed(3);
    g.dispatch({1, 2, 3});
    g.rank_failed(0, "a");
    g.report(at(1, 5));
    g.report(at(2, 9));
    const auto r = g.resolve(5);
    EXPECT_FALSE(r.known);
    EXPECT_FALSE(r.step_trained);
    EXPECT_FALSE(r.holds_state(r.reports[0]));
  }
  {
    auto g = formed(2);
    g.dispatch({1, 2});
    EXPECT_FALSE(g.rank_failed(0, "a"));
    EXPECT_TRUE(g.rank_failed(1, "b")) << "no report is due: resolve";
    const auto r = g.resolve(5);
    EXPECT_FALSE(r.known) << "no survivor";
    EXPECT_EQ(r.failed.size(), 2u);
  }
}

TEST(group_step, transitions_out_of_their_phase_are_refused) {
  group_step g(2);
  EXPECT_THROW(group_step(0), std::invalid_argument);
  EXPECT_THROW(g.dispatch({1}), std::logic_error);
  EXPECT_THROW(g.rank_failed(0, "x"), std::logic_error);
  EXPECT_THROW(g.resolve(0), std::logic_error);
  EXPECT_EQ(g.report(at(0, 1)), kind::stale);
  auto f = formed(2);
  EXPECT_THROW(f.dispatch({}), std::logic_error);
  EXPECT_THROW(f.dispatch({1, 2, 3}), std::logic_error) << "more real batches than ranks";
  f.dispatch({1});
  EXPECT_THROW(f.resolve(0), std::logic_error) << "no rank failed";
  f.dissolve();
  EXPECT_EQ(f.current(), phase::none);
  EXPECT_FALSE(f.in_step());
  EXPECT_EQ(f.report(at(0, 1)), kind::stale) << "a step cut short";
  EXPECT_EQ(f.take_id(), (std::vector<uint8_t>{1, 2, 3})) << "the id lives until it is aborted";
  EXPECT_TRUE(f.nccl_id().empty());
}

// A simulated group: each rank's state is a step count.  A group step either
// completes its collective (every rank applies it) or is cut short by a
// failure (the survivors skip the guarded update), and now and then a rank's
// state is corrupt.  The coordinator's rule: continue from the resolution's
// step when known, else from the checkpoint; the machine must never claim
// a state no survivor holds, and each step is counted once.
TEST(group_step, random_failures_continue_from_a_state_a_survivor_holds) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    const int32_t world = 2 + static_cast<int32_t>(rng() % 4);
    group_step g(world);
    std::vector<int64_t> state(static_cast<size_t>(world), 0);  // each rank's step
    int64_t ledger = 0, checkpoint = 0, counted = 0, dispatched = 0;
    int64_t last_gen = 0;
    for (int round = 0; round < 60; ++round) {
      // Form a group (sometimes a join fails first).
      ASSERT_EQ(g.current(), phase::none) << "seed " << seed;
      auto gen = g.begin_forming();
      ASSERT_GT(gen, last_gen);
      last_gen = gen;
      if (rng() % 5 == 0) {
        ASSERT_TRUE(g.join_failed(gen));
        ASSERT_FALSE(g.member_joined(gen));
        continue;
      }
      for (int32_t d = 0; d < world; ++d)
        ASSERT_EQ(g.member_up(gen), d == world - 1);
      ASSERT_TRUE(g.set_id(gen, {static_cast<uint8_t>(gen)}));
      for (int32_t d = 0; d < world; ++d)
        ASSERT_EQ(g.member_joined(gen), d == world - 1);
      std::fill(state.begin(), state.end(), ledger);  // rank 0's broadcast
      // Steps until a failure breaks the group.
      bool broken = false;
      while (!broken) {
        ASSERT_EQ(g.current(), phase::ready);
        const size_t real = 1 + rng() % static_cast<size_t>(world);
        std::vector<int64_t> batches;
        for (size_t i = 0; i < real; ++i)
          batches.push_back(dispatched++);
        g.dispatch(batches);
        std::vector<int32_t> order(static_cast<size_t>(world));
        for (int32_t d = 0; d < world; ++d)
          order[static_cast<size_t>(d)] = d;
        std::shuffle(order.begin(), order.end(), rng);
        if (rng() % 3 != 0) {  // the step completes everywhere
          for (size_t i = 0; i < order.size(); ++i) {
            const auto d = order[i];
            state[static_cast<size_t>(d)] = ledger + 1;
            ASSERT_EQ(g.report(at(d, ledger + 1)), i + 1 == order.size() ? kind::complete : kind::wait);
          }
          const auto v = g.finish_step(ledger);
          ASSERT_EQ(v.what, verdict_kind::trained);
          ASSERT_EQ(v.step, ledger + 1);
          ASSERT_EQ(g.take_batches(), batches);
          ledger = v.step;
          ++counted;
          if (rng() % 4 == 0)
            checkpoint = ledger;
          continue;
        }
        // A failure inside the step: some ranks die (before or after they
        // report), the collective completed or not, a state may be corrupt.
        const bool collective_done = rng() % 2 == 0;
        const size_t dying = 1 + rng() % static_cast<size_t>(world);
        std::set<int32_t> dead(order.begin(), order.begin() + static_cast<long>(dying));
        bool resolve_due = false;
        for (size_t i = 0; i < order.size(); ++i) {
          const auto d = order[i];
          auto st = collective_done ? ledger + 1 : ledger;
          if (rng() % 10 == 0)
            st = ledger + 2 + static_cast<int64_t>(rng() % 3);  // unknown
          state[static_cast<size_t>(d)] = st;
          const bool dies = dead.count(d) > 0;
          // order[0] always dies, so the step is failing before the last
          // rank: a dying last rank dies before its report.
          const bool reports_first = !dies || (i + 1 < order.size() && rng() % 2 == 0);
          if (reports_first)
            resolve_due |= g.report(at(d, st)) == kind::resolve;
          if (dies)
            resolve_due |= g.rank_failed(d, "drafter " + std::to_string(d));
          ASSERT_EQ(g.current(), phase::failing) << "seed " << seed;
          ASSERT_EQ(resolve_due, i + 1 == order.size());
        }
        ASSERT_TRUE(resolve_due) << "seed " << seed << ": every rank reported or failed";
        ASSERT_EQ(g.reports_due(), 0);
        const auto r = g.resolve(ledger);
        ASSERT_EQ(r.failed.size(), dead.size());
        ASSERT_EQ(r.reports.size(), order.size() - dead.size()) << "only survivors' reports count";
        bool truly_known = !r.reports.empty(), any_after = false;
        for (const auto& x : r.reports) {
          ASSERT_EQ(dead.count(x.drafter), 0u);
          ASSERT_EQ(x.step, state[static_cast<size_t>(x.drafter)]);
          truly_known &= x.step == ledger || x.step == ledger + 1;
          any_after |= x.step == ledger + 1;
        }
        ASSERT_EQ(r.known, truly_known) << "seed " << seed;
        ASSERT_EQ(r.step_trained, truly_known && any_after);
        if (r.known) {
          bool someone_holds = false;
          for (const auto& x : r.reports)
            someone_holds |= r.holds_state(x);
          ASSERT_TRUE(someone_holds) << "seed " << seed << ": training continues from a state nobody holds";
          for (auto d : r.completed)
            ASSERT_EQ(state[static_cast<size_t>(d)], r.step);
          if (r.step_trained) {
            ASSERT_EQ(g.take_batches(), batches);
            ++counted;
          }
          ledger = r.step;
        } else {
          ledger = checkpoint;
          counted = checkpoint;
        }
        g.dissolve();
        broken = true;
      }
      ASSERT_EQ(counted, ledger) << "seed " << seed << ": every step counted once";
    }
  }
}
