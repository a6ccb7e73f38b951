#pragma once
/// The coordinator's sample ledger: exactly-once accounting of training
/// samples across drafter failures (DESIGN.md §3).
///
/// A sample moves   pending → issued (in a batch) → trained (by step k)
///                  → committed (weights through step k are safe)
/// and back to pending when a failure rolls training back past it.  "Safe"
/// means a durable snapshot holds those weights, or a live replica does; the
/// coordinator says so with `durable(step)`.  Within an epoch every sample is
/// committed exactly once, however many rollbacks happen.
///
/// Plain C++ (no CAF, no LibTorch): the coordinator actor owns one and is the
/// only thread that touches it.

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace tandem {

class sample_ledger {
public:
  using batch_id = int64_t;

  /// Counts of samples in each state, for metrics and the shell.
  struct counts {
    int64_t pending = 0, issued = 0, trained = 0, committed = 0;
  };

  /// A ledger over samples 0 .. num_samples−1, at epoch 0.
  explicit sample_ledger(int64_t num_samples);

  /// Records that `samples` leave in a new batch; they must be pending.
  /// Throws std::logic_error naming the first sample that is not.
  batch_id issue(const std::vector<int64_t>& samples);

  /// The batch was trained into the weights by optimizer step `step`
  /// (steps are non-decreasing).  Throws for an unknown batch.
  void trained(batch_id batch, int64_t step);

  /// Weights through `step` are safe: commits every sample trained at or
  /// before it.  Returns how many samples were committed now.
  int64_t durable(int64_t step);

  /// A failure: the weights are restored to those of `restore_step` (the
  /// newest safe state).  Every sample trained after it, and every sample
  /// still in flight, goes back to pending, first in line to be issued
  /// again.  Returns the samples that went back, in re-issue order.
  std::vector<int64_t> rollback(int64_t restore_step);

  /// The next up to `max` samples that must be re-issued before new ones
  /// (their order is the order they were first issued).
  std::vector<int64_t> take_reissue(size_t max);

  /// True when every sample of the epoch is committed.
  bool epoch_complete() const { return counts_.committed == num_samples_; }

  /// Starts the next epoch: every sample pending again.  Throws if the
  /// current epoch is not complete.
  void next_epoch();

  int64_t epoch() const { return epoch_; }
  int64_t num_samples() const { return num_samples_; }
  const counts& state_counts() const { return counts_; }
  bool is_committed(int64_t sample) const;

  /// The samples of this epoch that are not pending (issued, trained or
  /// committed), ascending: after a rollback, those the restore point holds.
  std::vector<int64_t> consumed() const;

  /// The durable part of the ledger (epoch and committed samples), for a
  /// checkpoint's JSON state; `restore` takes it back.  In-flight and
  /// trained-but-uncommitted samples are deliberately not saved: after a
  /// restart they are pending again.
  std::string save() const;

  /// As save(), as if `durable(step)` had been called first: the image a
  /// checkpoint of the weights after `step` must carry.
  std::string save(int64_t durable_through) const;
  static sample_ledger restore(const std::string& text);

private:
  enum class state : uint8_t { pending, issued, trained, committed };

  struct batch {
    std::vector<int64_t> samples;
    int64_t step = -1;  ///< -1 while in flight
  };

  void set(int64_t sample, state s);
  void check_sample(int64_t sample) const;

  int64_t num_samples_;
  int64_t epoch_ = 0;
  std::vector<state> state_;
  std::map<batch_id, batch> batches_;  ///< issued or trained, not yet committed
  std::deque<int64_t> reissue_;
  batch_id next_batch_ = 0;
  int64_t last_trained_step_ = -1;
  counts counts_;
};

} // namespace tandem
